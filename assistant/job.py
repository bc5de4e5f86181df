"""A job: one request's work for the scheduler, and the events it answers with.

The HTTP layer builds a job from a request (``job_builder.build_job``), attaches it to its event loop
and submits it; the scheduler thread runs it with others in a batch and emits its events, which the
route turns into its response. Events are the per-request half of the one vocabulary (see
``model_runtime.interface``): :class:`JobStep` per denoising step, then :class:`JobDone` or
:class:`JobError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from model_runtime.interface import CanvasRow
from model_runtime.params import SamplingParams


@dataclass(frozen=True)
class JobStep:
    """One denoising step of one job: its region ids after the step and the positions committed in it."""

    step: int
    steps: int
    ids: list[int]
    unmasked: list[int]
    masks_left: int
    seconds: float


@dataclass(frozen=True)
class JobDone:
    """The end of a job. ``finish_reason``: stop (a stop token), length (canvas full), time, cancelled."""

    text: str
    ids: list[int]
    finish_reason: str
    new_tokens: int
    steps_run: int
    stats: dict[str, Any]


@dataclass(frozen=True)
class JobError:
    """A job that failed after it was queued (the runtime refused its row, or the batch broke)."""

    status: int
    message: str
    kind: str
    param: str | None = None
    code: str | None = None
    details: dict[str, object] = field(default_factory=dict)


JobEvent = JobStep | JobDone | JobError


@dataclass(eq=False)
class Job:
    """One request's work: a canvas row, its parameters and budgets, and the channel its events go to."""

    row: CanvasRow
    params: SamplingParams
    chat: bool
    prompt_tokens: int
    canvas_tokens: int
    row_length: int
    max_seconds: float
    session: str | None = None
    kind: str = "generate"
    want_steps: bool = True  # a non-streaming request only needs its JobDone
    id: str = ""
    loop: asyncio.AbstractEventLoop | None = None
    created: float = field(default_factory=time.monotonic)
    started: float | None = None
    cancel_reason: str | None = None
    finished: bool = False
    _events: asyncio.Queue[JobEvent] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.loop is None:
            # Built on the event loop's thread: answer there. Built elsewhere (a worker thread), the
            # HTTP layer sets ``loop`` before it submits the job.
            with contextlib.suppress(RuntimeError):
                self.loop = asyncio.get_running_loop()
        self._events = asyncio.Queue()

    def emit(self, event: JobEvent) -> None:
        """Hand an event to the job's consumer; safe from any thread."""
        if isinstance(event, JobDone | JobError):
            self.finished = True
        assert self.loop is not None, "a job is attached to its event loop before it is submitted"
        try:
            self.loop.call_soon_threadsafe(self._events.put_nowait, event)
        except RuntimeError:  # the event loop is closed: the server is gone, nobody is listening
            pass

    async def events(self) -> AsyncIterator[JobEvent]:
        """The job's events, ending with its JobDone or JobError."""
        while True:
            event = await self._events.get()
            yield event
            if isinstance(event, JobDone | JobError):
                return

    @property
    def cancelled(self) -> bool:
        return self.cancel_reason is not None
