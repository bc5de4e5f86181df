"""What the scheduler reports (its stage, for /health and status) and the errors it refuses a request with.

The stages are the wire's (``assistant.wire.Stage``), since the clients read them back: ``starting``,
``loading`` (the weights), then serving: ``compiling`` while the clients' first programs compile (requests
are taken, but /health still answers 503: a chat's prompt sent now would wait for a compile), ``warming``
once they are in while the rest of the warm-up compiles in the background, ``ready`` when nothing is left
to compile; ``failed`` if the model could not be loaded, ``stopping`` at the end.
"""

from __future__ import annotations

from assistant.daemon_status import EngineStatus
from assistant.wire import ErrorType


class SchedulerError(Exception):
    """A request the scheduler cannot take now; ``status`` is the HTTP status to answer with."""

    status = 503
    kind: str = ErrorType.SERVER

    def __init__(self, message: str, *, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class QueueFull(SchedulerError):
    kind = ErrorType.OVERLOADED


class NotReady(SchedulerError):
    kind = ErrorType.MODEL_LOADING


class ShuttingDown(SchedulerError):
    kind = ErrorType.SHUTTING_DOWN


# The scheduler's status is what ``/v1/diffu/status`` sends as ``engine`` and ``/health`` inlines: a wire
# record, declared once for the daemon and the clients that read it back.
SchedulerStatus = EngineStatus
