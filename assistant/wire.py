"""What crosses the process boundary between the daemon and its clients, declared once for both sides,
free of JAX and of HTTP code: the daemon's start-up stages, the request's sampling options and the rule a
prompt must fit the model's context by, the error shape with its types and codes, the stats of a finished
request, and the daemon's counters.

The daemon writes these values and the clients (``assistant.client``, and through it ``diffu chat``,
``diffu lsp`` and the CLI) read them back, so each is one type here rather than a string or a dict key
spelled on both sides. The editors and the chat keep the sampling options in their settings (imported when
an editor starts the server, before ``httpx`` is), and the daemon reads the same declaration
(``SamplingParams``, ``model_runtime.options``) when it parses a request.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from enum import StrEnum
from typing import Any

from model_runtime.options import like, mirror
from model_runtime.params import SamplingParams


# -- start-up -------------------------------------------------------------------------------------------
class Stage(StrEnum):
    """The daemon's stage, in order: ``stage`` in ``/health`` and ``engine.stage`` in ``/v1/diffu/status``.

    ``loading`` the weights; from ``compiling`` on it serves requests, but a chat's first prompt would
    wait for a compile until its programs are in; from ``warming`` on ``/health`` says ok, while the rest
    of the warm-up compiles in the background, until ``ready``; ``failed`` when the model could not be
    loaded; ``stopping`` at the end. A client that starts a daemon reports ``starting`` before the daemon
    reports anything.
    """

    STARTING = "starting"
    LOADING = "loading"
    COMPILING = "compiling"
    WARMING = "warming"
    READY = "ready"
    FAILED = "failed"
    STOPPING = "stopping"


SERVING = frozenset({Stage.COMPILING, Stage.WARMING, Stage.READY})  # requests are answered
HEALTHY = frozenset({Stage.WARMING, Stage.READY})  # a chat's first prompt waits for no compile: /health ok
ENDED = frozenset({Stage.FAILED, Stage.STOPPING})  # it will not serve (any more): stop waiting
HEALTH_OK = "ok"  # ``status`` in ``/health`` once HEALTHY (200); before that, and after, the stage (503)


# -- a request -----------------------------------------------------------------------------------------------
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
    window: int | None = like(SamplingParams, "window", default=None)
    threshold: float | None = like(SamplingParams, "threshold", default=None)
    factor: float | None = like(SamplingParams, "factor", default=None)
    commit_rule: str | None = like(SamplingParams, "commit_rule", default=None)
    refresh_every: int | None = like(SamplingParams, "refresh_every", default=None)
    max_lines: int | None = like(SamplingParams, "max_lines", default=None)
    block_scope: int | None = like(SamplingParams, "block_scope", default=None)

    def body(self) -> dict[str, Any]:
        """The knobs that are set, as request fields."""
        return {f.name: v for f in fields(self) if (v := getattr(self, f.name)) is not None}


mirror(SamplingOptions, SamplingParams, omit=("max_new_tokens",))


# A first chat question with its template (DiffuCoder's system prompt and turn markers take 27 tokens of
# the bundled model's vocabulary). "Write a function that returns the sum of a list." is 39 tokens, a
# two-sentence request 55 to 60.
FIRST_PROMPT_TOKENS = 192
# A second turn: the first question, the chat's answer (192 tokens at most with the bundled model) and
# the second question.
TALK_PROMPT_TOKENS = 320


def chat_prompts(lengths: Iterable[int], canvas_tokens: int) -> tuple[list[int], list[int]]:
    """The prompt lengths a chat's first questions and second turns fill the daemon's length buckets
    with, beside a canvas of ``canvas_tokens`` (each bucket's whole room): (first questions, second
    turns). The daemon warms them up before it says ready, and the chat asks for its own settings'."""
    rooms = [n - canvas_tokens for n in sorted(set(lengths)) if n > canvas_tokens]
    first = [p for p in rooms if p <= FIRST_PROMPT_TOKENS] or rooms[:1]
    talk = [p for p in rooms if p not in first and p <= TALK_PROMPT_TOKENS]
    return first, talk


def prompt_budget(budget_tokens: int, canvas_tokens: int, max_context: int | None) -> int:
    """The prompt's token budget: ``budget_tokens``, but no more than the model's context (when known)
    leaves beside a canvas of ``canvas_tokens``, less 2 tokens of slack. The daemon refuses a prompt that
    does not fit its context together with the canvas. May be <= 0: the canvas alone fills the context."""
    if not max_context:
        return budget_tokens
    return min(budget_tokens, int(max_context) - canvas_tokens - 2)


# -- errors --------------------------------------------------------------------------------------------------
class ErrorType(StrEnum):
    """An error's ``type`` (OpenAI's field): what kind of failure, for a client deciding what to do."""

    INVALID_REQUEST = "invalid_request_error"  # 4xx: the request is wrong; the message says how
    AUTHENTICATION = "authentication_error"  # 401: no or a wrong bearer token
    PERMISSION = "permission_error"  # 403: a host or origin the daemon does not serve
    NOT_FOUND = "not_found_error"  # 404: no such route, model or request id
    SERVER = "server_error"  # 500: the daemon's own failure (its log says more)
    OVERLOADED = "server_overloaded"  # 503: the queue is full; retry after the Retry-After header
    MODEL_LOADING = "model_loading"  # 503: the weights are still loading
    SHUTTING_DOWN = "shutting_down"  # 503: the daemon is stopping
    UNAVAILABLE = "unavailable_error"  # 503 from /health: not serving yet (or failed)


class ErrorCode(StrEnum):
    """An error's stable ``code``, where a client acts on the failure itself (not only shows it)."""

    # A prompt beyond the model's context; ``details`` holds ``prompt_tokens``, ``max_new_tokens`` and
    # ``context_length``, so a client can shorten the prompt by the right amount (OpenAI's code).
    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
    MODEL_NOT_FOUND = "model_not_found"


def error_body(
    message: str,
    kind: str,
    *,
    param: str | None = None,
    code: str | int | None = None,
    details: Mapping[str, object] | None = None,
) -> dict[str, Any]:
    """The daemon's one error shape: OpenAI's ``{"error": {message, type, param, code}}``, plus
    ``details`` (the facts as fields) when there are any. In SSE ``error`` events ``code`` is the
    HTTP status the request would have had."""
    error: dict[str, Any] = {"message": message, "type": kind, "param": param, "code": code}
    if details:
        error["details"] = dict(details)
    return {"error": error}


# -- a finished request --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DoneStats:
    """What a finished request cost: the ``stats`` of a native ``done`` event or response.

    Times are seconds: ``queue_seconds`` waiting for the device, ``compile_seconds`` compiling its
    programs (or reading them from the persistent cache), ``generate_seconds`` denoising, which
    ``tokens_per_second`` is over (compiling never counts in it). ``bucket`` is the (batch, length)
    shape the batch ran in (None when it did not run to its end); ``steps`` counts forwards of the model.
    """

    steps: int = 0
    new_tokens: int = 0
    prompt_tokens: int = 0
    canvas_tokens: int = 0
    batch_size: int = 0
    decoder: str = "reference"
    bucket: tuple[int, int] | None = None
    queue_seconds: float = 0.0
    generate_seconds: float = 0.0
    compile_seconds: float = 0.0
    compiled_programs: int = 0
    cache_hits: int = 0
    tokens_per_second: float = 0.0
    cancel_reason: str | None = None  # why a cancelled request was (client gone, superseded, ...)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object (``cancel_reason`` only on a cancelled request)."""
        out = dataclasses.asdict(self)
        out["bucket"] = list(self.bucket) if self.bucket is not None else None
        if self.cancel_reason is None:
            del out["cancel_reason"]
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DoneStats:
        """Read back from JSON; a field the daemon left out keeps its default, one it added is ignored."""
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        bucket = values.get("bucket")
        values["bucket"] = (int(bucket[0]), int(bucket[1])) if bucket else None
        return cls(**values)


# -- the daemon's totals -------------------------------------------------------------------------------------
@dataclass
class DaemonCounters:
    """The daemon's totals since it started (``counters`` of ``/v1/diffu/status``): requests taken and
    how each ended, the batches that ran them, and the tokens generated. The scheduler thread adds to
    them; readers copy them with :meth:`to_dict`."""

    requests: int = 0
    completed: int = 0
    cancelled: int = 0
    timed_out: int = 0
    failed: int = 0
    rejected: int = 0  # refused with 503: the queue was full
    batches: int = 0
    rows: int = 0
    batched_rows: int = 0  # rows that ran in a batch of more than one
    largest_batch: int = 0
    generated_tokens: int = 0
    forwards: int = 0  # forwards of the model run for batches (a cancelled job's included)

    def to_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DaemonCounters:
        """Read back from JSON; a counter the daemon left out is 0, one it added is ignored."""
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: int(v) for k, v in data.items() if k in known})
