"""The statistics behind the published figures: pass@k, a pass rate's 95% interval, the paired difference
of two settings on the same tasks, a speed-up's interval from interleaved chunks, and the soft scores of
a multi-line suggestion against the hidden lines (edit similarity, first line right).

``diffu eval`` (``assistant/evals/runner.py``) and the decoder table (``scripts/decoder_table.py``,
whose figures are docs/performance.md's and the README's) compute them here, one implementation each,
so a figure in the docs and one a user reproduces come from the same code. Plain Python, no numpy: each
is a handful of sums over at most a few thousand values.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping, Sequence

Z95 = 1.96  # the normal quantile of a two-sided 95% interval


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimator of Chen et al. (2021): 1 - C(n-c, k) / C(n, k), as a stable product."""
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def confidence_interval(rates: Sequence[float], z: float = Z95) -> tuple[float, float]:
    """The 95% interval of the mean of per-task pass rates: Wilson's score interval when every rate is 0
    or 1 (one sample per task: a binomial share, for which the normal interval is poor near 0 and 1),
    else the normal interval of the mean over tasks."""
    n = len(rates)
    if n == 0:
        return 0.0, 0.0
    mean = sum(rates) / n
    if all(r in (0.0, 1.0) for r in rates):
        centre = (mean + z * z / (2 * n)) / (1 + z * z / n)
        half = z * math.sqrt(mean * (1 - mean) / n + z * z / (4 * n * n)) / (1 + z * z / n)
        return max(0.0, centre - half), min(1.0, centre + half)
    var = sum((r - mean) ** 2 for r in rates) / max(n - 1, 1)
    half = z * math.sqrt(var / n)
    return max(0.0, mean - half), min(1.0, mean + half)


def paired(a: Sequence[float], b: Sequence[float], z: float = Z95) -> tuple[float, float, float]:
    """Mean of ``a - b`` over the same tasks and its normal 95% interval, within [-1, 1]."""
    d = [float(x) - float(y) for x, y in zip(a, b, strict=True)]
    n = len(d)
    mean = sum(d) / n
    var = sum((v - mean) ** 2 for v in d) / max(n - 1, 1)
    half = z * math.sqrt(var / n)
    return mean, max(-1.0, mean - half), min(1.0, mean + half)


def time_ratio(chunks: Sequence[tuple[float, float]], z: float = Z95) -> tuple[float, float, float] | None:
    """The reference's generation time over a setting's, from per-chunk pairs (reference seconds, the
    setting's seconds): the ratio of the totals and its normal 95% interval by the ratio estimator's
    variance over the chunks (each chunk ran every setting back to back, so it is one paired sample).
    None with fewer than two chunks."""
    n = len(chunks)
    total = sum(t for _, t in chunks)
    if n < 2 or total <= 0:
        return None
    ratio = sum(r for r, _ in chunks) / total
    spread = sum((r - ratio * t) ** 2 for r, t in chunks) / (n - 1)
    half = z * math.sqrt(spread / n) / (total / n)
    return ratio, ratio - half, ratio + half


def chunk_seconds(
    tasks: Sequence[str],
    chunk_of: Mapping[str, int],
    ref: Mapping[str, Mapping[str, float]],
    this: Mapping[str, Mapping[str, float]],
) -> list[tuple[float, float]]:
    """Per chunk, the reference's and this setting's generation seconds over ``tasks`` (by task id):
    the pairs :func:`time_ratio` takes. ``ref`` and ``this`` hold each task's record (its ``seconds``)."""
    sums: dict[int, tuple[float, float]] = {}
    for t in tasks:
        r, x = sums.get(chunk_of[t], (0.0, 0.0))
        sums[chunk_of[t]] = (r + ref[t]["seconds"], x + this[t]["seconds"])
    return list(sums.values())


def edit_similarity(fill: str, expected: str) -> float:
    """How much of a multi-line suggestion is the hidden code, in [0, 1]: difflib's ratio of matching
    characters (2M / total) between the two, each without its blank lines and its lines' trailing
    blanks. A suggestion that is right but for one name scores near 1 where pass/fail scores 0, so two
    decoders whose answers are all wrong can still be told apart."""

    def norm(text: str) -> str:
        return "\n".join(line.rstrip() for line in text.splitlines() if line.strip())

    a, b = norm(fill), norm(expected)
    if not a and not b:
        return 1.0
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()


def first_line_right(fill: str, expected: str) -> bool:
    """Whether the suggestion's first line that holds code is the hidden code's (what a user who accepts
    a suggestion line by line takes first), whitespace around each ignored."""

    def first(text: str) -> str:
        return next((line.strip() for line in text.splitlines() if line.strip()), "")

    return first(fill) == first(expected) != ""


def soft_scores(
    fills: Sequence[str], expected: Sequence[str], baseline: Sequence[str] | None = None
) -> dict[str, list[float] | float]:
    """A setting's multi-line suggestions (``fills``, each cleaned as the editor shows it) against the
    hidden lines: the mean edit similarity and the share whose first line is right, each with its 95%
    interval, and (given the ``baseline`` setting's fills of the same tasks) the paired difference from
    it with its interval."""

    def per_task(texts: Sequence[str]) -> tuple[list[float], list[float]]:
        pairs = list(zip(texts, expected, strict=True))
        return [edit_similarity(f, e) for f, e in pairs], [float(first_line_right(f, e)) for f, e in pairs]

    sim, first = per_task(fills)
    n = max(len(sim), 1)
    out: dict[str, list[float] | float] = {
        "similarity": sum(sim) / n,
        "similarity_ci95": list(confidence_interval(sim)),
        "first_line": sum(first) / n,
        "first_line_ci95": list(confidence_interval(first)),
    }
    if baseline is not None:
        base_sim, base_first = per_task(baseline)
        out["similarity_minus_baseline"] = list(paired(sim, base_sim))
        out["first_line_minus_baseline"] = list(paired(first, base_first))
    return out
