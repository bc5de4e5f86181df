"""What crosses the process boundary between the daemon and its clients, free of JAX and of HTTP code:
the request's sampling options, and the rule a prompt must fit the model's context by.

Clients build requests from these (``assistant.client``), the editors and the chat keep them in their
settings (imported when an editor starts the server, before ``httpx`` is), and the daemon reads the same
declaration (``SamplingParams``, ``model_runtime.options``) when it parses a request.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from model_runtime.options import like, mirror
from model_runtime.params import SamplingParams


@dataclass(frozen=True, kw_only=True)
class SamplingOptions:
    """The sampling knobs of one request: ``SamplingParams``' options (their bounds, choices and help)
    but ``max_new_tokens``, which each call names its own way. None leaves a knob to the daemon, which
    applies its model's defaults; the daemon validates every value and answers a bad one with a 400.

    The fields are written out so that mypy checks a caller's names and types; ``mirror`` below checks
    them against the declaration when this module is imported.
    """

    steps: int | None = like(SamplingParams, "steps", default=None)
    alg: str | None = like(SamplingParams, "alg", default=None)
    alg_temp: float | None = like(SamplingParams, "alg_temp", default=None)
    temperature: float | None = like(SamplingParams, "temperature", default=None)
    top_p: float | None = like(SamplingParams, "top_p", default=None)
    top_k: int | None = like(SamplingParams, "top_k", default=None)
    eps: float | None = like(SamplingParams, "eps", default=None)
    seed: int | None = like(SamplingParams, "seed", default=None)
    decoder: str | None = like(SamplingParams, "decoder", default=None)
    block_length: int | None = like(SamplingParams, "block_length", default=None)
    threshold: float | None = like(SamplingParams, "threshold", default=None)
    factor: float | None = like(SamplingParams, "factor", default=None)

    def body(self) -> dict[str, Any]:
        """The knobs that are set, as request fields."""
        return {f.name: v for f in fields(self) if (v := getattr(self, f.name)) is not None}


mirror(SamplingOptions, SamplingParams, omit=("max_new_tokens",))


def prompt_budget(budget_tokens: int, canvas_tokens: int, max_context: int | None) -> int:
    """The prompt's token budget: ``budget_tokens``, but no more than the model's context (when known)
    leaves beside a canvas of ``canvas_tokens``, less 2 tokens of slack. The daemon refuses a prompt that
    does not fit its context together with the canvas. May be <= 0: the canvas alone fills the context."""
    if not max_context:
        return budget_tokens
    return min(budget_tokens, int(max_context) - canvas_tokens - 2)
