"""Sampling parameters: plain Python, no JAX (the events are in ``interface.py``).

Clients (daemon request parsing, the CLI, a fake engine in tests) import this module without paying for
a JAX import, so it must stay free of ``jax`` and ``numpy``-on-device code.

The names follow the reference's ``DreamGenerationConfig`` (``generation_utils.py``): ``steps``,
``max_new_tokens``, ``alg``, ``alg_temp``, ``temperature``, ``top_p``, ``top_k``, ``eps``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from model_runtime.options import OptionError, option, options, validate

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
# (a program ranks one of TOP_K_WIDTHS + 1 candidates whatever k is, specs.top_k_width: two widths, so
# the default k = 50 does not pay for ranking 129), and the fast decoder's block length is one of these.
# Anything else is refused with a message naming the allowed values (a top_k above MAX_TOP_K by the daemon,
# which knows the vocabulary: job_builder; a local run compiles it a program of its own).
TOP_K_WIDTHS = (64, 128)
MAX_TOP_K = TOP_K_WIDTHS[-1]
BLOCK_LENGTHS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
# The sliding decoder's windows: its first position only predicts the next one, so at least 2.
WINDOWS = BLOCK_LENGTHS[1:]
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


class ParamError(OptionError):
    """A sampling parameter is out of range; ``field`` names it, ``problem`` says why."""


@dataclass(frozen=True, kw_only=True)
class SamplingParams:
    """One generation's knobs, validated on construction; the declaration every front end derives its
    sampling options from (``model_runtime.options``: the CLI flags, the client's ``SamplingOptions``,
    the daemon's request fields, the chat's and the editors' settings).

    ``top_k=None`` means "as the reference", i.e. 50; ``top_k=0`` switches top-k filtering off.
    ``top_p=None`` or ``1.0`` switches nucleus filtering off. ``alg_temp`` of ``None``/0 picks the
    most confident positions; > 0 samples positions from ``softmax(confidence / alg_temp)``.
    """

    max_new_tokens: int = option(128, ge=1, help="tokens to generate: the length of the canvas")
    steps: int = option(128, ge=1, help="denoising steps")
    alg: str = option("entropy", choices=ALGS, help="which masked positions to commit first")
    alg_temp: float | None = option(
        None, ge=0, help="sample positions by confidence at this temperature; unset: the most confident"
    )
    temperature: float = option(0.0, ge=0, help="sampling temperature; 0 is greedy")
    top_p: float | None = option(None, gt=0, le=1, help="nucleus filtering; unset or 1: off")
    top_k: int | None = option(
        None,
        ge=0,
        help=f"top-k filtering; unset: {DEFAULT_TOP_K}, as the published sampler inherits it from "
        "transformers' generation defaults; 0: off",
    )
    eps: float = option(1e-3, gt=0, lt=1, help="final noise level of the schedule")
    seed: int = option(0, ge=0, le=SEED_LIMIT - 1, help="the sampling's PRNG seed, 32 bits")
    # The fast decoders (DualCache blocks, or the sliding window: model_runtime/fast.py, sliding.py); the
    # reference decoder ignores these.
    decoder: str = option(
        "reference",
        choices=DECODERS,
        help="reference: the exact published sampler; fast: DualCache blocks with confidence-threshold "
        "parallel unmasking; sliding: a window that follows the first mask over the same cache and stops "
        "at the end of the text",
    )
    # >= 1 before the choices, so 0 reads as out of range rather than as an odd block length.
    block_length: int = option(
        32, ge=1, choices=BLOCK_LENGTHS, read_by=("fast",), help="fast decoder: tokens per block"
    )
    window: int = option(
        8,
        ge=2,
        choices=WINDOWS,
        read_by=("sliding",),
        help="sliding decoder: positions a forward asks queries for, from just before the first mask",
    )
    threshold: float = option(
        0.9,
        gt=0,
        le=1,
        read_by=("fast", "sliding"),
        help="fast decoders: commit positions at least this confident",
    )
    factor: float | None = option(
        None,
        gt=0,
        read_by=("fast", "sliding"),
        help="fast decoders: use the factor rule with this factor instead of the threshold",
    )
    commit_rule: str = option(
        "threshold",
        choices=COMMIT_RULES,
        read_by=("sliding",),
        help="sliding decoder: threshold (the factor rule with a factor), or credit: dInfer's credit "
        "decoding, which favours proposals that stay the same over forwards",
    )
    refresh_every: int = option(
        0,
        ge=0,
        read_by=("sliding",),
        help="sliding decoder: re-encode the whole canvas every N forwards; 0: only the first",
    )
    max_lines: int | None = option(
        None,
        ge=1,
        help="the answer's text ends with its Nth line (1: one line), and every decoder stops once those "
        "lines are written; unset: no limit",
    )
    block_scope: int | None = option(
        None,
        ge=0,
        help="the answer ends where its code leaves a block: at a later line indented less than this many "
        "columns, or at a blank line after code, and every decoder stops there; unset: no such end",
    )

    def __post_init__(self) -> None:
        validate(self, ParamError)

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


def decoder_knobs(decoder: str | None = None) -> frozenset[str]:
    """The sampling options only some decoders read (their ``read_by``): those ``decoder`` reads, or with
    none named, every one of them (a request that leaves the decoder to the daemon may get any)."""
    return frozenset(
        o.name
        for o in options(SamplingParams).values()
        if o.read_by is not None and (decoder is None or decoder in o.read_by)
    )
