"""Does context beyond the file help? Line infilling on this repository's own git history.

    python scripts/repo_infill.py [--rev main] [--model DIR] [--per-commit 4] [--seed 0] [--json out.json]
        [--budgets 1024,512] [--limit N]

Each commit (no merges) that added Python lines in two or more files gives up to ``--per-commit`` target
lines: in the file as the commit left it, the target line is emptied to its indentation with the cursor
after it, as when a user opens a line to write it. The model suggests the line through the language
server's own path (``lsp.suggest.plan``: canvas and steps of an automatic request; ``context.build_prompt``:
windows, header, snippets; the post-processing), in three conditions:

- ``file``: the file alone (``currentFileOnly``);
- ``recent``: plus the chunks the server's ring of recent edits holds after the commit's edits in its other
  files (``lsp.recent``: 32 lines around each hunk, newest last);
- ``recent+open``: plus those files whole, as open documents.

With ``--budgets 1024,768,512`` the conditions are instead the file alone at each of those context budgets
(the server's ``contextTokens``; the first is the one the others are compared with): what a smaller budget,
a faster first forward on CPU, costs in quality.

Scored per target: exact line (the suggestion's first line equals the target, spaces stripped) and edit
similarity (difflib ratio of the two lines). Prints each condition's rates and the paired differences
with a bootstrap 95% interval. Starts a daemon for ``--model`` (the bundled demo model by default).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from assistant.client import APIError, Client, SamplingOptions  # noqa: E402
from assistant.infill import context as ctx  # noqa: E402
from assistant.wire import prompt_budget  # noqa: E402
from lsp.daemon_link import is_overflow, overflow_facts  # noqa: E402
from lsp.recent import RecentChunks  # noqa: E402
from lsp.settings import Settings, context_budget, row_limit  # noqa: E402
from lsp.suggest import Cursor, clean, plan  # noqa: E402
from tests.assistant.helpers import REPO, isolated_env, start_daemon  # noqa: E402

CONDITIONS = ("file", "recent", "recent+open")
_HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,(\d+))? @@")


@dataclass(frozen=True)
class Target:
    commit: str
    path: str
    line: int  # 0-based, in the file as the commit left it
    text: str  # the file as the commit left it
    others: tuple[tuple[str, str, tuple[int, ...]], ...]  # other files: (path, text, hunk start lines)


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout


def added_lines(commit: str) -> dict[str, list[int]]:
    """0-based line numbers of added lines, per Python file, in the commit's version of the file."""
    out: dict[str, list[int]] = {}
    path = None
    line = 0
    for row in git("show", "--format=", "--unified=0", commit, "--", "*.py").splitlines():
        if row.startswith("+++ "):
            path = row[6:] if row.startswith("+++ b/") else None
        elif (m := _HUNK.match(row)) is not None:
            line = int(m.group(1)) - 1
        elif path and row.startswith("+") and not row.startswith("+++"):
            out.setdefault(path, []).append(line)
            line += 1
    return out


def worth_predicting(line: str) -> bool:
    s = line.strip()
    return 10 <= len(s) <= 100 and not s.startswith(("#", '"', "'", "@")) and not s.endswith(('"""', "'''"))


def targets(rev: str, per_commit: int, seed: int) -> list[Target]:
    rng = random.Random(seed)
    found = []
    for commit in git("log", "--no-merges", "--format=%H", rev).split():
        added = added_lines(commit)
        if len(added) < 2:
            continue
        texts = {p: git("show", f"{commit}:{p}") for p in added}
        candidates = [
            (p, i) for p, lines in added.items() for i in lines if worth_predicting(texts[p].splitlines()[i])
        ]
        for path, i in rng.sample(candidates, min(per_commit, len(candidates))):
            others = tuple(
                (p, texts[p], tuple(sorted(set(lines)))) for p, lines in sorted(added.items()) if p != path
            )
            found.append(Target(commit[:10], path, i, texts[path], others))
    return found


def budget_of(condition: str) -> int | None:
    """The context budget a ``file@N`` condition names (None: the server's setting)."""
    return int(condition.split("@", 1)[1]) if "@" in condition else None


def prompt_for(
    target: Target,
    condition: str,
    settings: Settings,
    chars_per_token: float,
    max_context: int,
    recommended: int | None = None,
):
    lines = target.text.splitlines(keepends=True)
    line = lines[target.line]
    indent = line[: len(line) - len(line.lstrip(" \t"))]
    before = "".join(lines[: target.line]) + indent
    after = "\n" + "".join(lines[target.line + 1 :])
    cursor = Cursor(target.path, "python", before, after, invoked=False)
    p = plan(cursor, settings)
    others: list[tuple[str, str]] = []
    if (budget := budget_of(condition)) is not None:
        settings = dataclasses.replace(settings, context_tokens=budget)
    elif condition != "file":
        ring = RecentChunks()
        for path, text, hunks in target.others:
            for start in hunks:
                ring.note(path, path, text, start)
        others = [(c.name, c.text) for c in ring.chunks()]
        if condition == "recent+open":
            others += [(path, text) for path, text, _ in target.others]
    prompt = ctx.build_prompt(
        before=p.prompt_before,
        after=after,
        path=target.path,
        language="python",
        budget_tokens=prompt_budget(
            context_budget(settings), p.canvas, row_limit(settings, max_context, recommended)
        ),
        prefix_fraction=settings.prefix_fraction,
        chars_per_token=chars_per_token,
        snippet_tokens=settings.snippet_tokens,
        other_documents=others,
    )
    return p, prompt


def score(suggestion: str, target_line: str) -> tuple[bool, float]:
    first = suggestion.split("\n", 1)[0].strip()
    want = target_line.strip()
    return first == want, difflib.SequenceMatcher(None, first, want).ratio()


def bootstrap(diffs: list[float], seed: int = 0, n: int = 2000) -> tuple[float, float]:
    rng = random.Random(seed)
    means = sorted(statistics.fmean(rng.choices(diffs, k=len(diffs))) for _ in range(n))
    return means[int(0.025 * n)], means[int(0.975 * n)]


class Suggester:
    """Each target's suggestion in one condition, asked as the language server asks: a prompt fitted to
    the context by characters per token, learnt again from a refusal (as ``DaemonLink.fitting``)."""

    def __init__(
        self,
        client: Client,
        settings: Settings,
        max_context: int,
        chars_per_token: float,
        recommended: int | None = None,
    ) -> None:
        self.client, self.settings = client, settings
        self.max_context, self.chars_per_token = max_context, chars_per_token
        self.recommended = recommended  # the model's editor_context, as the server takes it

    def __call__(self, job: tuple[Target, str]) -> dict[str, Any]:
        target, condition = job
        ratio = self.chars_per_token
        for attempt in range(3):
            p, prompt = prompt_for(
                target, condition, self.settings, ratio, self.max_context, self.recommended
            )
            try:
                done = self.client.infill(
                    prompt.prefix,
                    prompt.suffix,
                    canvas_tokens=p.canvas,
                    sampling=SamplingOptions(steps=p.steps),
                )
                break
            except APIError as exc:
                tokens, _ = overflow_facts(exc)
                if attempt == 2 or not is_overflow(exc) or not tokens:
                    raise
                ratio = 0.9 * (len(prompt.prefix) + len(prompt.suffix)) / tokens
        suggestion = clean(done.text, p, prompt.suffix, min_chars=1) or ""
        exact, similarity = score(suggestion, target.text.splitlines()[target.line])
        return {
            "commit": target.commit,
            "path": target.path,
            "line": target.line + 1,
            "condition": condition,
            "suggestion": suggestion,
            "exact": exact,
            "similarity": similarity,
            "context": [s.name for s in prompt.snippets],
            "prompt_tokens": done.usage.get("prompt_tokens", 0),
        }


def suggest_all(
    model: str, items: list[Target], workers: int, conditions: tuple[str, ...] = CONDITIONS
) -> list[dict[str, Any]]:
    """Every target's suggestion in every condition, from a daemon started for ``model``."""
    root = Path(tempfile.mkdtemp(prefix="diffu-repo-infill-"))
    daemon = start_daemon(root, model, env=isolated_env(root))
    rows: list[dict[str, Any]] = []
    try:
        with Client(daemon.url, daemon.token, autostart=False) as client:
            entry = client.models().data[0]
            max_context = entry.context_length
            if max_context is None:
                raise RuntimeError("the daemon's /v1/models does not say its context length")
            # The server learns characters per token from the daemon's answers; measure it once here.
            sample = items[0].text[:2000]
            probe = client.infill(sample, "", canvas_tokens=1, sampling=SamplingOptions(steps=1))
            used = probe.usage["prompt_tokens"]
            run = Suggester(client, Settings(), max_context, len(sample) / max(used, 1), entry.editor_context)
            jobs = [(t, c) for t in items for c in conditions]
            start = time.perf_counter()
            with ThreadPoolExecutor(workers) as pool:
                for i, row in enumerate(pool.map(run, jobs)):
                    rows.append(row)
                    if (i + 1) % 60 == 0:
                        print(f"  {i + 1}/{len(jobs)} in {time.perf_counter() - start:.0f} s", flush=True)
    finally:
        daemon.stop()
    return rows


def summary(rows: list[dict[str, Any]], conditions: tuple[str, ...] = CONDITIONS) -> None:
    """Each condition's rates, and its paired differences from the first."""
    by = {c: [r for r in rows if r["condition"] == c] for c in conditions}
    base = conditions[0]
    head = f"{'condition':<12} {'exact line':>11} {'similarity':>11} {'with context':>13}"
    head += f" {'prompt tokens':>14}"
    print(f"\n{head}")
    for c in conditions:
        exact = statistics.fmean(r["exact"] for r in by[c])
        sim = statistics.fmean(r["similarity"] for r in by[c])
        with_ctx = statistics.fmean(bool(r["context"]) for r in by[c])
        tokens = statistics.median(r["prompt_tokens"] for r in by[c])
        print(f"{c:<12} {exact:>10.1%} {sim:>11.3f} {with_ctx:>12.0%} {tokens:>14.0f}")
    for c in conditions[1:]:
        sim_diff = [b["similarity"] - a["similarity"] for a, b in zip(by[base], by[c], strict=True)]
        wins = sum(b["exact"] and not a["exact"] for a, b in zip(by[base], by[c], strict=True))
        losses = sum(a["exact"] and not b["exact"] for a, b in zip(by[base], by[c], strict=True))
        lo, hi = bootstrap(sim_diff)
        print(
            f"{c} - {base}: similarity {statistics.fmean(sim_diff):+.3f} (95% CI {lo:+.3f}..{hi:+.3f}), "
            f"exact lines gained {wins}, lost {losses}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model", default=None, help="checkpoint directory (default: the bundled demo model)"
    )
    parser.add_argument(
        "--rev", default="HEAD", help="the history to draw from: this commit and its ancestors"
    )
    parser.add_argument("--per-commit", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=4, help="requests in flight (the daemon batches them)")
    parser.add_argument("--json", type=Path, default=None, help="write every target's results here")
    parser.add_argument(
        "--budgets",
        default=None,
        help="compare the file alone at these context budgets (tokens, comma-separated)",
    )
    parser.add_argument("--limit", type=int, default=None, help="at most this many targets, drawn at random")
    args = parser.parse_args()
    from model_runtime.bundled import bundled_model_dir

    model = args.model or str(bundled_model_dir())
    items = targets(args.rev, args.per_commit, args.seed)
    if args.limit is not None and args.limit < len(items):
        items = random.Random(args.seed).sample(items, args.limit)
    conditions: tuple[str, ...] = CONDITIONS
    if args.budgets:
        conditions = tuple(f"file@{int(b)}" for b in args.budgets.split(","))
    rev = git("rev-parse", "--short", args.rev).strip()
    print(f"{len(items)} targets from {len({t.commit for t in items})} commits (the history of {rev})")
    rows = suggest_all(model, items, args.workers, conditions)
    summary(rows, conditions)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
