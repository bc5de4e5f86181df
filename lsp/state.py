"""What the server keeps between requests, as plain data: counters, latencies, and the status it reports.

The handlers update these; ``diffu.status`` and the ``diffu/status`` notification (the editors' status
item) read them. Nothing here talks to the editor or the daemon.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any

from assistant.wire import HEALTH_OK, Stage

TIMINGS_KEPT = 200


@dataclass(frozen=True)
class Timing:
    """One suggestion the model answered: its mode and where the time went (milliseconds).

    ``wall_ms`` is what the user waits for after the server's debounce: request received to answer sent
    (the editor's own delay before it asks, 200 ms in Neovim, comes on top). ``first`` marks the first
    model request after the server connected to the daemon.
    """

    mode: str
    wall_ms: float
    daemon_ms: float
    engine_ms: float
    queue_ms: float
    first: bool = False
    canvas: int = 0  # tokens
    steps: int = 0
    prompt_chars: int = 0
    context: tuple[str, ...] = ()  # names of the chunks of other files the prompt carried

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "wall_ms": round(self.wall_ms, 1),
            "daemon_ms": round(self.daemon_ms, 1),
            "engine_ms": round(self.engine_ms, 1),
            "queue_ms": round(self.queue_ms, 1),
            "first": self.first,
            "canvas": self.canvas,
            "steps": self.steps,
            "prompt_chars": self.prompt_chars,
            "context": list(self.context),
        }


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) by linear interpolation between closest ranks (numpy's default)."""
    ordered = sorted(values)
    if not ordered:
        return 0.0
    pos = (len(ordered) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


class Timings:
    """The latest answered suggestions' timings, and their summary per mode."""

    def __init__(self) -> None:
        self.recent: deque[Timing] = deque(maxlen=TIMINGS_KEPT)
        self.first_after_connect: Timing | None = None
        self._claimed = -1.0  # the connection whose first request was taken

    def claim_first(self, connected_at: float) -> bool:
        """True for the first model request after the connection made at ``connected_at``."""
        if connected_at == self._claimed:
            return False
        self._claimed = connected_at
        return True

    def add(self, timing: Timing) -> None:
        self.recent.append(timing)
        if timing.first:
            self.first_after_connect = timing

    @property
    def last_ms(self) -> float | None:
        return self.recent[-1].wall_ms if self.recent else None

    def summary(self) -> dict[str, Any]:
        modes: dict[str, list[float]] = {}
        for t in self.recent:
            modes.setdefault(t.mode, []).append(t.wall_ms)
        first = self.first_after_connect
        return {
            "by_mode": {
                mode: {
                    "n": len(walls),
                    "median_ms": round(statistics.median(walls), 1),
                    "p90_ms": round(percentile(walls, 0.9), 1),
                }
                for mode, walls in sorted(modes.items())
            },
            "last_ms": None if self.last_ms is None else round(self.last_ms, 1),
            "first_after_connect_ms": None if first is None else round(first.wall_ms, 1),
        }


COUNTERS = (
    "requests",  # suggestion requests received
    "answered",  # ... answered with at least one suggestion from the model
    "cached",  # ... answered from the cache
    "joined",  # ... answered by an earlier request's model call they waited for, trimmed by what was typed
    "skipped",  # ... not sent to the model (disabled, mid-line while typing)
    "stale",  # ... whose document changed while the model ran (answered empty)
    "superseded",  # ... replaced by a newer request of the same editor (answered empty)
    "cancelled",  # ... cancelled by the editor
    "errors",  # ... that failed (daemon unavailable, refused)
    "accepted",  # suggestions the user accepted
    "holes_filled",  # holes filled by fill-holes
)


def new_counters() -> Counter[str]:
    return Counter(dict.fromkeys(COUNTERS, 0))


@dataclass(frozen=True)
class Pause:
    """Suggestions while typing paused by the user (``diffu.toggle``, ``diffu.snooze``): until the
    monotonic time ``until``, infinite for a toggle; ``wall`` is the same moment on the wall clock (None
    for a toggle), for the status item."""

    until: float
    wall: float | None = None

    def active(self, now: float) -> bool:
        return now < self.until

    def message(self) -> str:
        if self.wall is None:
            return "paused until toggled"
        return f"paused until {time.strftime('%H:%M', time.localtime(self.wall))}"


@dataclass(frozen=True)
class StatusItem:
    """What an editor's status item shows: ``state`` and a one-line ``message``, with the last latency.

    States: ``disabled`` (suggestions off), ``paused`` (toggled off or snoozed: nothing while typing),
    ``connecting`` (finding, starting or loading the daemon), ``ready``, ``busy`` (a suggestion is being
    made), ``unavailable`` (the daemon cannot be reached).
    """

    state: str
    message: str
    latency_ms: float | None
    model: str

    def to_json(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "message": self.message,
            "latencyMs": None if self.latency_ms is None else round(self.latency_ms),
            "model": self.model,
        }


def status_item(
    *,
    enabled: bool,
    paused: Pause | None,
    link_state: str,
    busy: bool,
    error: str,
    detail: str,
    latency_ms: float | None,
    model: str,
) -> StatusItem:
    """The status item for the server's state (pure: the inputs are what the server knows)."""
    if not enabled:
        return StatusItem("disabled", "suggestions are off (diffu.enable)", latency_ms, model)
    if paused is not None:
        return StatusItem("paused", paused.message(), latency_ms, model)
    if link_state == "unavailable":
        return StatusItem("unavailable", error or "the daemon is unavailable", latency_ms, model)
    if link_state == "connecting":
        return StatusItem("connecting", detail or "connecting to the daemon", latency_ms, model)
    if busy:
        return StatusItem("busy", "making a suggestion", latency_ms, model)
    shown = f", last suggestion {latency_ms:.0f} ms" if latency_ms is not None else ""
    return StatusItem("ready", f"{model or 'model'} ready{shown}", latency_ms, model)


# The daemon's start-up stages in words: the ``status`` of its /health stream (``ok`` once it serves), the
# scheduler's own names for the serving stages, and ``failed`` for an attempt that did not connect.
STAGES = {
    Stage.STARTING: "starting the daemon",
    Stage.LOADING: "loading the model",
    Stage.COMPILING: "compiling the model",
    Stage.WARMING: "warming up",
    Stage.READY: "ready",
    HEALTH_OK: "ready",
    Stage.FAILED: "the daemon failed",
    Stage.STOPPING: "the daemon is stopping",
}


def _stems(text: str) -> set[str]:
    """Word stems (the first four letters of each word of four or more) for spotting a repeat."""
    words = "".join(c.lower() if c.isalpha() else " " for c in text).split()
    return {w[:4] for w in words if len(w) >= 4}


# What a stage's own "ready" means when the daemon is not ready yet: the model loader says "ready" once
# the weights are in, while the daemon still has its programs to compile.
STEP_DONE: dict[str, str] = {Stage.LOADING: "model loaded"}
_BEFORE_READY = (Stage.STARTING, Stage.LOADING, Stage.COMPILING, Stage.WARMING)


def stage_message(stage: str, detail: str) -> str:
    """A daemon start-up stage in words, for progress reports, the status item and the log.

    The daemon's detail often names the stage already (``loading`` / "loading the model", ``ok`` /
    "ready", ``failed`` / "model load failed"): then the detail, the more specific, is said alone rather
    than after the stage's words ("loading the model: loading the model"). A detail of "ready" in a stage
    before the daemon's ready says that stage's step is done ("model loaded", never "loading the model:
    ready": the status item said ready while the daemon could not answer yet).
    """
    phrase = STAGES.get(stage, stage)
    if not detail:
        return phrase
    if detail.strip().lower() == STAGES[Stage.READY] and stage in _BEFORE_READY:
        return STEP_DONE.get(stage, f"{phrase}: done")
    if _stems(phrase) & _stems(detail):
        return detail
    return f"{phrase}: {detail}"
