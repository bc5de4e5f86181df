"""What the scheduler reports (its stage, for /health and status) and the errors it refuses a request with.

Stages, in order: ``starting``, ``loading`` (the weights), then serving: ``warming`` while programs of the
warm-up wait to be compiled, ``ready`` when none does; ``failed`` if the model could not be loaded,
``stopping`` at the end.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Scheduler stages as /health reports them. From WARMING on, requests are served.
STARTING, LOADING, WARMING, READY, FAILED, STOPPING = (
    "starting",
    "loading",
    "warming",
    "ready",
    "failed",
    "stopping",
)
SERVING = (WARMING, READY)


class SchedulerError(Exception):
    """A request the scheduler cannot take now; ``status`` is the HTTP status to answer with."""

    status = 503
    kind = "server_error"

    def __init__(self, message: str, *, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class QueueFull(SchedulerError):
    kind = "server_overloaded"


class NotReady(SchedulerError):
    kind = "model_loading"


class ShuttingDown(SchedulerError):
    kind = "shutting_down"


@dataclass
class SchedulerStatus:
    """Where the scheduler is. While warming: ``warmed`` of ``shapes`` done (each the programs of one
    request shape), ``eta_seconds`` once one compile was timed. ``compiling``: what the device thread
    compiles right now (None: nothing)."""

    stage: str = STARTING
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
