"""What the scheduler reports (its stage, for /health and status) and the errors it refuses a request with.

Stages, in order: ``starting``, ``loading`` (the weights), then serving: ``compiling`` while the chat's
first programs compile (requests are taken, but /health still answers 503: a prompt sent now would wait
for a compile), ``warming`` once they are in while the rest of the warm-up compiles in the background,
``ready`` when nothing is left to compile; ``failed`` if the model could not be loaded, ``stopping`` at
the end.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Scheduler stages as /health reports them. From COMPILING on, requests are served; from WARMING on,
# /health says ok.
STARTING, LOADING, COMPILING, WARMING, READY, FAILED, STOPPING = (
    "starting",
    "loading",
    "compiling",
    "warming",
    "ready",
    "failed",
    "stopping",
)
SERVING = (COMPILING, WARMING, READY)
HEALTHY = (WARMING, READY)


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
    """Where the scheduler is. While compiling or warming: ``warmed`` of ``shapes`` done (each the
    programs of one request shape), ``eta_seconds`` once one compile was timed. ``compiling``: what is
    being compiled right now, the warm-up's and a request's joined by "; " (None: nothing)."""

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
