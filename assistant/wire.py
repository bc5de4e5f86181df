"""What crosses the process boundary between the daemon and its clients, declared once for both sides.

The daemon writes these values and the clients (``assistant.client``, and through it ``diffu chat``,
``diffu lsp`` and the CLI) read them back, so each is one type here rather than a string or a dict key
spelled on both sides: the error shape with its types and codes, the stats of a finished request, and
the daemon's counters. Standard library only: clients import it without JAX or an HTTP stack.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any


# -- errors ---------------------------------------------------------------------------------------------
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


# -- a finished request ---------------------------------------------------------------------------------
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


# -- the daemon's totals ----------------------------------------------------------------------------------
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

    def to_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DaemonCounters:
        """Read back from JSON; a counter the daemon left out is 0, one it added is ignored."""
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: int(v) for k, v in data.items() if k in known})
