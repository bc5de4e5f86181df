"""The static switches of the compiled programs, one frozen dataclass per program family: what makes a
different XLA program, as opposed to the traced values a program reads at run time.

No JAX here: a program's cache key is (kind, bucket, spec), and the decoders (``model_runtime/decoders/``)
make keys for clients that never import JAX (the fake runtime, the daemon's warm-up planning).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from model_runtime.params import TOP_K_WIDTHS, SamplingParams
from model_runtime.strategies import EARLY_STOPS, CommitRule, EarlyStop, Threshold, commit_rule


def top_k_width(k: int) -> int:
    """The static width a program is compiled for, top-k ``k`` being a traced value: the smallest of
    ``TOP_K_WIDTHS`` that holds k, so every k up to ``MAX_TOP_K`` runs on one of two programs and a
    request's top_k never compiles one of its own (the daemon refuses more). 0: filtering off; a larger k
    (a local run) is its own width."""
    if k == 0:
        return 0
    return next((w for w in TOP_K_WIDTHS if w >= k), k)


@dataclass(frozen=True)
class SamplerSpec:
    """The static part of a sampling configuration: what changes the compiled program.

    Values that can vary without recompiling (temperature, top_p, top_k, alg_temp, the step's ratio) are
    traced arguments; the switches that pick code paths live here. ``top_k`` is the filter's k when
    ``sample_tokens`` gets no traced k, else the width (an upper bound on k) the program is compiled for.
    """

    alg: str = "entropy"
    do_sample: bool = False  # temperature > 0
    use_top_p: bool = False  # top_p is set and < 1
    top_k: int = 50  # 0 = off
    use_alg_temp: bool = False  # alg_temp is set and > 0

    @classmethod
    def from_params(cls, params: SamplingParams) -> SamplerSpec:
        """The spec a runtime compiles for ``params``: ``top_k`` is the width holding the request's k,
        which the program then reads as a traced value (``kernels.Knobs.top_k``)."""
        return cls(
            alg=params.alg,
            do_sample=params.temperature > 0,
            use_top_p=params.effective_top_p < 1.0,
            top_k=top_k_width(params.effective_top_k),
            use_alg_temp=bool(params.alg_temp),
        )

    @classmethod
    def proposals(cls, params: SamplingParams) -> SamplerSpec:
        """The fast decoders' sampler: a proposal and its max-probability confidence per position (their
        commit rules read that confidence, whatever ``alg`` the request names)."""
        return cls(
            alg="maskgit_plus",
            do_sample=params.temperature > 0,
            use_top_p=params.effective_top_p < 1.0,
            top_k=top_k_width(params.effective_top_k),
        )


@dataclass(frozen=True)
class FastSpec:
    """Static switches of the fast decoder's programs."""

    sampler: SamplerSpec  # how a proposal and its confidence are drawn (max-probability confidence)
    block_length: int = 32
    rule: CommitRule = field(default_factory=Threshold)  # the threshold or the factor rule


@dataclass(frozen=True)
class SlidingSpec:
    """Static switches of the sliding decoder's programs."""

    sampler: SamplerSpec  # how a proposal and its confidence are drawn (max-probability confidence)
    window: int = 8  # query positions per forward
    rule: CommitRule = field(default_factory=Threshold)  # threshold, factor or credit
    stops: tuple[EarlyStop, ...] = EARLY_STOPS  # when a row's text has ended
    # Whether its loop runs full forwards too (``refresh_every`` > 0): without, the loop's program holds
    # the window forward alone, a third less to compile.
    refresh: bool = False

    @classmethod
    def of(cls, params: SamplingParams) -> SlidingSpec:
        return cls(
            sampler=SamplerSpec.proposals(params),
            window=params.window,
            rule=commit_rule(params.commit_rule, params.factor),
            refresh=params.refresh_every > 0,
        )
