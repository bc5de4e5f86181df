"""A job: one request's work for the scheduler, and the events it answers with.

The HTTP layer builds a job from a request (``job_builder.build_job``), attaches it to its event loop
and submits it; the scheduler thread runs it with others in a batch and emits its events, which the
route turns into its response. Events are the per-request half of the one vocabulary (see
``model_runtime.interface``): :class:`JobWaiting` while its programs compile, :class:`JobStep` per
denoising step (one forward of the model), then :class:`JobDone` or :class:`JobError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from assistant.wire import DoneStats
from model_runtime.interface import CanvasRow, CompileReport, GenerationStats
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
    block: int = 0  # the fast decoder's block and number of blocks (0: the reference decoder)
    blocks: int = 0


@dataclass(frozen=True)
class JobWaiting:
    """The job waits for a compile: ``reason`` "compiling" (its own programs) or "warm-up" (the device
    thread is compiling another program, which cannot be interrupted). ``eta_seconds``: an estimate,
    once a compile has been timed."""

    reason: str
    detail: str
    eta_seconds: float | None = None


@dataclass(frozen=True)
class JobDone:
    """The end of a job. ``finish_reason``: stop (a stop token), length (canvas full), time, cancelled."""

    text: str
    ids: list[int]
    finish_reason: str
    new_tokens: int
    steps_run: int
    stats: DoneStats


@dataclass(frozen=True)
class JobError:
    """A job that failed after it was queued (the runtime refused its row, or the batch broke)."""

    status: int
    message: str
    kind: str
    param: str | None = None
    code: str | None = None
    details: dict[str, object] = field(default_factory=dict)


JobEvent = JobStep | JobWaiting | JobDone | JobError


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
    started: float | None = None  # when its batch started generating (after compiling its programs)
    compiled: CompileReport | None = None  # what compiling its programs cost, if they were not ready
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

    def stats(
        self, *, steps: int, new_tokens: int, batch_size: int, done: GenerationStats | None = None
    ) -> DoneStats:
        """The job's stats at its end (``done``: its batch's, when it ran to the end). Generation time
        runs from its batch's start after any compile, so tokens per second never include waiting for
        one (``compile_seconds`` says how long that was; ``queue_seconds``, the wait before it)."""
        end = time.monotonic()
        gen_s = end - (self.started or end)
        built = self.compiled or CompileReport()
        return DoneStats(
            steps=steps,
            new_tokens=new_tokens,
            prompt_tokens=self.prompt_tokens,
            canvas_tokens=self.canvas_tokens,
            batch_size=batch_size,
            decoder=self.params.decoder,
            bucket=done.bucket if done else None,
            queue_seconds=round((self.started or end) - self.created - built.seconds, 4),
            generate_seconds=round(gen_s, 4),
            compile_seconds=round(built.seconds + (done.compile_seconds if done else 0.0), 4),
            compiled_programs=built.compiled + (done.compiled_programs if done else 0),
            cache_hits=built.cache_hits + (done.cache_hits if done else 0),
            tokens_per_second=round(new_tokens / gen_s, 2) if gen_s > 0 else 0.0,
        )
