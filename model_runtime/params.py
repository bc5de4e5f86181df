"""Sampling parameters: plain Python, no JAX (the events are in ``interface.py``).

Clients (daemon request parsing, the CLI, a fake engine in tests) import this module without paying for
a JAX import, so it must stay free of ``jax`` and ``numpy``-on-device code.

The names follow the reference's ``DreamGenerationConfig`` (``generation_utils.py``): ``steps``,
``max_new_tokens``, ``alg``, ``alg_temp``, ``temperature``, ``top_p``, ``top_k``, ``eps``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

ALGS = ("origin", "maskgit_plus", "topk_margin", "entropy")
DECODERS = ("reference", "fast", "sliding")
# How the fast decoders pick the positions a forward commits (model_runtime/sliding.py): the threshold rule
# (the factor rule when ``factor`` is set), or dInfer's credit rule (the sliding decoder only).
COMMIT_RULES = ("threshold", "credit")

# The published sampler inherits transformers' PretrainedConfig generation default top_k=50 when the
# caller leaves top_k unset (its ``from_model_config`` copies the config's generation defaults). We
# reproduce it; 0 disables it.
DEFAULT_TOP_K = 50

# Values that would otherwise compile a program each (issue #17): top_k is a traced value up to this bound
# (a program ranks one of TOP_K_WIDTHS + 1 candidates whatever k is, sampling.top_k_width: two widths, so
# the default k = 50 does not pay for ranking 129), and the fast decoder's block length is one of these.
# Anything else is refused with a message naming the allowed values (a top_k above MAX_TOP_K by the daemon,
# which knows the vocabulary: job_builder; a local run compiles it a program of its own).
TOP_K_WIDTHS = (64, 128)
MAX_TOP_K = TOP_K_WIDTHS[-1]
BLOCK_LENGTHS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
SEED_LIMIT = 2**32  # PRNG seeds are 32-bit

# Compiled programs a runtime keeps at once (programs.py). A daemon uses one per bucket it serves (12 by
# default) for each set of sampler switches its clients send (greedy or sampled, top-p on or off, ...);
# each holds its executable in host memory (docs/daemon.md has measured sizes), so this bounds the cache
# to a known ceiling.
DEFAULT_MAX_PROGRAMS = 64


def fast_block_size(block_length: int, region: int, limit: int) -> int:
    """The block the fast decoder decodes at a time: ``block_length``, or for a region shorter than that
    the smallest of BLOCK_LENGTHS that holds it; at most ``limit`` (the canvas bucket's length - 1). A
    bounded set either way, so the block length never compiles a program per request."""
    size = block_length if region >= block_length else next(b for b in BLOCK_LENGTHS if b >= region)
    return max(1, min(size, limit))


class ParamError(ValueError):
    """A sampling parameter is out of range; ``field`` names it."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name


@dataclass(frozen=True, kw_only=True)
class SamplingParams:
    """One generation's knobs, validated on construction.

    ``top_k=None`` means "as the reference", i.e. 50; ``top_k=0`` switches top-k filtering off.
    ``top_p=None`` or ``1.0`` switches nucleus filtering off. ``alg_temp`` of ``None``/0 picks the
    most confident positions; > 0 samples positions from ``softmax(confidence / alg_temp)``.
    """

    max_new_tokens: int = 128
    steps: int = 128
    alg: str = "entropy"
    alg_temp: float | None = None
    temperature: float = 0.0
    top_p: float | None = None
    top_k: int | None = None
    eps: float = 1e-3
    seed: int = 0
    # The fast decoders (DualCache blocks, or the sliding window: model_runtime/fast.py, sliding.py); the
    # reference decoder ignores these. block_length is the sliding decoder's window.
    decoder: str = "reference"
    block_length: int = 32
    threshold: float = 0.9
    factor: float | None = None  # the factor rule instead of the threshold rule
    commit_rule: str = "threshold"
    refresh_every: int = 0  # sliding: a full refresh forward every N forwards (0: only the first)
    # The answer is one line: its text ends at the first newline, and the fast decoders stop once that
    # line is decoded (as they stop at end of text).
    single_line: bool = False

    def __post_init__(self) -> None:
        def check(cond: bool, name: str, msg: str) -> None:
            if not cond:
                raise ParamError(name, msg)

        for name in ("max_new_tokens", "steps", "seed", "block_length", "refresh_every"):
            value = getattr(self, name)
            check(
                isinstance(value, int) and not isinstance(value, bool),
                name,
                f"must be an integer, got {value!r}",
            )
        check(self.max_new_tokens >= 1, "max_new_tokens", f"must be >= 1, got {self.max_new_tokens}")
        check(self.steps >= 1, "steps", f"must be >= 1, got {self.steps}")
        check(self.alg in ALGS, "alg", f"must be one of {', '.join(ALGS)}; got {self.alg!r}")
        check(
            self.decoder in DECODERS, "decoder", f"must be one of {', '.join(DECODERS)}; got {self.decoder!r}"
        )
        check(
            self.commit_rule in COMMIT_RULES,
            "commit_rule",
            f"must be one of {', '.join(COMMIT_RULES)}; got {self.commit_rule!r}",
        )
        check(self.refresh_every >= 0, "refresh_every", f"must be >= 0, got {self.refresh_every}")
        check(
            isinstance(self.single_line, bool),
            "single_line",
            f"must be true or false, got {self.single_line!r}",
        )
        check(self.block_length >= 1, "block_length", f"must be >= 1, got {self.block_length}")
        check(
            self.block_length in BLOCK_LENGTHS,
            "block_length",
            f"must be one of {', '.join(map(str, BLOCK_LENGTHS))}; got {self.block_length}",
        )
        check(
            0 <= self.seed < SEED_LIMIT,
            "seed",
            f"must be in 0..{SEED_LIMIT - 1} (a 32-bit PRNG seed), got {self.seed}",
        )
        check(
            _is_number(self.threshold) and 0 < self.threshold <= 1,
            "threshold",
            f"must be in (0, 1], got {self.threshold!r}",
        )
        if self.factor is not None:
            check(
                _is_number(self.factor) and self.factor > 0,
                "factor",
                f"must be a number > 0, got {self.factor!r}",
            )
        for name in ("temperature", "eps"):
            value = getattr(self, name)
            check(_is_number(value), name, f"must be a number, got {value!r}")
        check(
            self.temperature >= 0 and math.isfinite(self.temperature),
            "temperature",
            f"must be >= 0, got {self.temperature}",
        )
        check(0 < self.eps < 1, "eps", f"must be in (0, 1), got {self.eps}")
        if self.alg_temp is not None:
            check(
                _is_number(self.alg_temp) and self.alg_temp >= 0 and math.isfinite(self.alg_temp),
                "alg_temp",
                f"must be a number >= 0, got {self.alg_temp!r}",
            )
        if self.top_p is not None:
            check(
                _is_number(self.top_p) and 0 < self.top_p <= 1,
                "top_p",
                f"must be in (0, 1], got {self.top_p!r}",
            )
        if self.top_k is not None:
            check(
                isinstance(self.top_k, int) and not isinstance(self.top_k, bool) and self.top_k >= 0,
                "top_k",
                f"must be an integer >= 0, got {self.top_k!r}",
            )

    @property
    def effective_top_k(self) -> int:
        """The top-k the sampler applies: 50 when unset (reference quirk), 0 = off."""
        return DEFAULT_TOP_K if self.top_k is None else self.top_k

    @property
    def effective_top_p(self) -> float:
        return 1.0 if self.top_p is None else float(self.top_p)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SamplingParams:
        """Build from a JSON-like mapping; unknown keys are an error naming them."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ParamError(unknown[0], f"unknown sampling parameter (known: {', '.join(sorted(names))})")
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
