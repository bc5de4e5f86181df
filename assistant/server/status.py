"""What the scheduler reports (its stage, for /health and status) and the errors it refuses a request with.

The stages are the wire's (``assistant.wire.Stage``), since the clients read them back: ``starting``,
``loading`` (the weights), then serving: ``compiling`` while the chat's first programs compile (requests
are taken, but /health still answers 503: a chat's prompt sent now would wait for a compile), ``warming``
once they are in while the rest of the warm-up compiles in the background, ``ready`` when nothing is left
to compile; ``failed`` if the model could not be loaded, ``stopping`` at the end.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from assistant.wire import ErrorType, Stage


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


@dataclass
class SchedulerStatus:
    """Where the scheduler is. While compiling or warming: ``warmed`` of ``shapes`` done (each the
    programs of one request shape), ``eta_seconds`` once one compile was timed. ``compiling``: what is
    being compiled right now, the warm-up's and a request's joined by "; " (None: nothing)."""

    stage: Stage = Stage.STARTING
    progress: float = 0.0
    detail: str = ""
    error: str | None = None
    warmed: int = 0
    shapes: int = 0
    eta_seconds: float | None = None
    compiling: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "progress": round(self.progress, 4),
            "detail": self.detail,
            "error": self.error,
            "warmed": self.warmed,
            "shapes": self.shapes,
            "eta_seconds": self.eta_seconds,
            "compiling": self.compiling,
        }
