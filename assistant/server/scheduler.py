"""The daemon's scheduler: one thread owns the device, fed by a bounded queue, answering through events.

The scheduler thread (logged and reported as "the engine") loads the model and from then on serves: it
waits on a condition for queued jobs or programs to warm up. Jobs come first: it takes the oldest job
and every other queued job with the same sampling parameters whose rows fit one bucket together,
compiles their programs if they are not compiled yet (that one compile only, telling the jobs so) and
runs them as one canvas batch (``assistant.server.batch_run``), which hands each job its own events. When no
job waits it compiles the next program of the warm-up (``assistant.server.warmup``): /health says "warming (k
of n)" until the last one, then "ready". Between denoising steps the batch drops jobs that were
cancelled (client gone, explicit cancel, superseded by a newer request of the same session) or ran out
of their time budget.

Events reach the asyncio side through ``loop.call_soon_threadsafe`` into each job's queue. Nothing polls:
the thread sleeps on a ``threading.Condition`` and shutdown is a flag plus ``notify``. Loading and XLA
compiles cannot be interrupted; ``stop`` does not wait for them (see ``abandoned``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from assistant.server.batch_run import finish_cancelled, run_batch
from assistant.server.batching import take_batch
from assistant.server.job import Job, JobError, JobWaiting
from assistant.server.status import (
    FAILED,
    LOADING,
    READY,
    SERVING,
    STOPPING,
    WARMING,
    NotReady,
    QueueFull,
    SchedulerStatus,
    ShuttingDown,
)
from assistant.server.warmup import WarmQueue, WarmTask
from model_runtime.errors import DiffuError, InputError
from model_runtime.interface import CanvasRow, CompileReport, RuntimeProtocol
from model_runtime.params import SamplingParams

log = logging.getLogger("diffu.engine")

Loader = Callable[[Callable[[str, float], None]], RuntimeProtocol]
"""``loader(progress)`` builds the runtime inside the scheduler thread; ``progress(detail, fraction)``."""
Planner = Callable[[RuntimeProtocol], list[WarmTask]]
"""``planner(runtime)``: the generic warm-up, most likely programs first (called once it is loaded)."""

# How long a batch may wait for requests the HTTP layer is still preparing (parsing, tokenizing): a
# burst of clients then shares one canvas batch instead of the first one running alone. A lone request
# never waits, because nothing is in preparation when it is taken.
COALESCE_SECONDS = 0.02


class Scheduler:
    """Owns the runtime and the device thread. Create on the event loop's thread; ``start()`` then submit.

    ``loader(progress)`` builds the runtime inside the scheduler thread; ``progress(detail, fraction)``
    reports loading. ``planner(runtime)`` gives the programs to warm up once it is loaded (None: none).
    """

    def __init__(
        self, loader: Loader, *, queue_size: int, max_batch: int, planner: Planner | None = None
    ) -> None:
        self._loader = loader
        self.queue_size = queue_size
        self.max_batch = max_batch
        self._planner = planner
        self._warm = WarmQueue()
        self._busy: WarmTask | None = None  # the warm-up task being compiled
        self._uninterruptible = False  # the thread is loading or compiling (native work, cannot stop)
        self._exited = False
        self._runtime: RuntimeProtocol | None = None
        self.status = SchedulerStatus()
        self._listeners: list[Callable[[SchedulerStatus], None]] = []
        self._cond = threading.Condition()
        self._pending: deque[Job] = deque()
        self._running: list[Job] = []
        self._sessions: dict[str, Job] = {}
        self._preparing = 0
        self._stopping = False
        self._thread = threading.Thread(target=self._main, name="diffu-engine", daemon=True)
        self._ids = itertools.count(1)
        self._batch_seconds = 1.0  # running mean of a batch's duration, for Retry-After
        self.started_at = time.time()
        self.counters = {
            "requests": 0,
            "completed": 0,
            "cancelled": 0,
            "timed_out": 0,
            "failed": 0,
            "rejected": 0,
            "batches": 0,
            "rows": 0,
            "batched_rows": 0,
            "largest_batch": 0,
            "generated_tokens": 0,
        }

    # -- lifecycle -------------------------------------------------------------------------------------
    def add_listener(self, listener: Callable[[SchedulerStatus], None]) -> None:
        """Call ``listener(status)`` (from the scheduler thread) whenever the stage or progress changes."""
        self._listeners.append(listener)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Cancel queued and running jobs and the warm-up, end the thread, wait for it (up to ``timeout``
        seconds). A load or an XLA compile in progress cannot be interrupted and is not waited for: the
        thread then ends after it, or the process exits first (``abandoned``)."""
        with self._cond:
            self._stopping = True
            dropped = list(self._pending)
            self._pending.clear()
            self._warm.tasks.clear()
            for job in self._running:
                job.cancel_reason = job.cancel_reason or "shutdown"
            self._cond.notify_all()
        for job in dropped:
            job.emit(JobError(503, "the daemon is shutting down", ShuttingDown.kind))
        if self._thread.is_alive():
            with self._cond:
                self._cond.wait_for(lambda: self._exited or self._uninterruptible, timeout)
        if self.abandoned:
            log.info("the engine is inside a load or compile that cannot be interrupted; not waiting for it")
        if self.status.stage != FAILED:
            self._set_status(STOPPING, 1.0, "stopped")

    @property
    def abandoned(self) -> bool:
        """Whether the device thread is still inside native work after ``stop``: then the process must
        exit without finalizing the interpreter, which would kill that thread inside XLA and abort."""
        return self._stopping and self._thread.is_alive() and self._uninterruptible

    @property
    def ready(self) -> bool:
        """Whether requests are served (the warm-up may still be compiling in between)."""
        return self.status.stage in SERVING

    @property
    def loaded(self) -> bool:
        """Whether the runtime exists (it may not serve yet: see ``ready``)."""
        return self._runtime is not None

    @property
    def runtime(self) -> RuntimeProtocol:
        """The loaded runtime (its loader runs in the scheduler thread)."""
        if self._runtime is None:
            raise NotReady(
                f"the model is not ready ({self.status.stage} {self.status.progress:.0%})", retry_after=2
            )
        return self._runtime

    def _set_status(
        self, stage: str, progress: float, detail: str = "", error: str | None = None, **warm: Any
    ) -> None:
        self.status = SchedulerStatus(stage, min(max(progress, 0.0), 1.0), detail, error, **warm)
        self._listen()

    # -- submitting and cancelling (event-loop side) ---------------------------------------------------
    @contextlib.contextmanager
    def preparing(self) -> Iterator[None]:
        """Mark a request as on its way to ``submit`` (being parsed/tokenized), for batch coalescing."""
        with self._cond:
            self._preparing += 1
        try:
            yield
        finally:
            with self._cond:
                self._preparing -= 1
                self._cond.notify_all()

    def submit(self, job: Job) -> Job:
        """Queue ``job``; raises NotReady, ShuttingDown or QueueFull (each carries the HTTP answer)."""
        with self._cond:
            if self._stopping:
                raise ShuttingDown("the daemon is shutting down")
            if not self.ready:
                raise NotReady(
                    f"the model is not ready ({self.status.stage} {self.status.progress:.0%})", retry_after=2
                )
            busy = self._busy
            if len(self._pending) >= self.queue_size:
                self.counters["rejected"] += 1
                waits = math.ceil(len(self._pending) / self.max_batch)
                raise QueueFull(
                    f"the queue is full ({self.queue_size} requests waiting); retry later",
                    retry_after=max(1, math.ceil(waits * self._batch_seconds)),
                )
            job.id = job.id or f"gen-{next(self._ids)}"
            self.counters["requests"] += 1
            if job.session:
                older = self._sessions.get(job.session)
                if older is not None and not older.finished:
                    self._cancel_locked(older, "superseded")
                self._sessions[job.session] = job
            self._pending.append(job)
            self._cond.notify()
        if busy is not None:
            # The device thread is compiling a warm-up program; the job runs right after it.
            job.emit(
                JobWaiting("warm-up", f"the warm-up is compiling a program ({busy.label})", self._warm.one())
            )
        return job

    def warm(self, tasks: Sequence[WarmTask]) -> int:
        """Queue ``tasks`` ahead of the generic warm-up (in their order); returns how many were queued.

        Raises QueueFull when the warm-up queue holds its limit already.
        """
        with self._cond:
            if self._stopping:
                raise ShuttingDown("the daemon is shutting down")
            if tasks and len(self._warm.tasks) >= self._warm.limit:
                raise QueueFull(
                    f"{self._warm.limit} shapes are waiting to be warmed up; retry later",
                    retry_after=max(1, math.ceil(self._warm.estimate() or 1)),
                )
            queued = self._warm.add(tasks, first=True)
            if queued:
                self._publish_warming()
            self._cond.notify()
        return queued

    def cancel(self, job_or_id: Job | str, reason: str = "cancelled") -> bool:
        """Cancel a queued or running job; False if no such unfinished job exists."""
        with self._cond:
            if isinstance(job_or_id, str):
                queued = itertools.chain(self._pending, self._running)
                job = next((j for j in queued if j.id == job_or_id), None)
                if job is None:
                    return False
            else:
                job = job_or_id
            if job.finished:
                return False
            self._cancel_locked(job, reason)
            return True

    def _cancel_locked(self, job: Job, reason: str) -> None:
        job.cancel_reason = job.cancel_reason or reason
        if job in self._pending:
            # Never reached the device: answer right away.
            self._pending.remove(job)
            finish_cancelled(self.counters, job, [], 0)
            self._forget(job)

    def _forget(self, job: Job) -> None:
        if job.session and self._sessions.get(job.session) is job:
            del self._sessions[job.session]
        # A running job is dropped by the scheduler thread at the next step boundary.

    def queue_info(self) -> dict[str, int]:
        with self._cond:
            return {
                "pending": len(self._pending),
                "running": len(self._running),
                "capacity": self.queue_size,
                "max_batch": self.max_batch,
            }

    # -- the scheduler thread --------------------------------------------------------------------------
    def _main(self) -> None:
        try:
            self._serve()
        finally:
            with self._cond:
                self._exited = True
                self._cond.notify_all()

    def _serve(self) -> None:
        try:
            self._set_status(LOADING, 0.0, "loading the model")
            with self._native():
                runtime = self._loader(lambda detail, frac: self._set_status(LOADING, frac, detail))
            self._runtime = runtime
            # The runtime cannot run a batch larger than its largest batch bucket.
            largest = max((b for b, _ in runtime.buckets), default=1)
            self.max_batch = max(1, min(self.max_batch, largest))
            plan = self._planner(runtime) if self._planner is not None else []
        except Exception as exc:
            if isinstance(exc, DiffuError):  # a bad checkpoint: the message says it all
                log.error("model load failed: %s", exc)
            else:
                log.exception("model load failed")
            self._set_status(FAILED, 0.0, "model load failed", error=str(exc) or type(exc).__name__)
            return
        with self._cond:
            if self._stopping:
                return
            self._warm.add(plan)
            self._publish_warming()
        log.info(
            "engine serving: model %s on %s (%s), buckets %s; %d shapes to warm up",
            runtime.model_name,
            runtime.device,
            runtime.dtype,
            runtime.buckets,
            len(plan),
        )
        while True:
            task = None
            with self._cond:
                while not self._pending and not self._warm.tasks and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    return
                if not self._pending:
                    task = self._busy = self._warm.pop()
                else:
                    deadline = time.monotonic() + COALESCE_SECONDS
                    while self._preparing and len(self._pending) < self.max_batch and not self._stopping:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            break
                        self._cond.wait(left)  # woken by each submit and each finished preparation
                    if not self._pending:  # everything queued was cancelled meanwhile
                        continue
                    batch = take_batch(self._pending, self.max_batch, self.runtime.buckets)
                    self._running = batch
            if task is not None:
                self._warm_up(task)
                continue
            try:
                self._run_batch(batch)
            except Exception:  # never let one batch take the device thread down
                log.exception("engine batch failed")
                for job in batch:
                    if not job.finished:
                        self.counters["failed"] += 1
                        job.emit(
                            JobError(500, "internal error in the engine (see the daemon log)", "server_error")
                        )
            finally:
                with self._cond:
                    self._running = []
                    for job in batch:
                        self._forget(job)

    @contextlib.contextmanager
    def _native(self) -> Iterator[None]:
        """Mark native work that cannot be interrupted (loading, compiling), for ``stop``."""
        with self._cond:
            self._uninterruptible = True
            self._cond.notify_all()
        try:
            yield
        finally:
            with self._cond:
                self._uninterruptible = False

    def _compile(self, rows: Sequence[CanvasRow], params: SamplingParams, what: str) -> CompileReport:
        """Compile what ``runtime.run(rows, params)`` needs, showing ``what`` in the status."""
        self._show_compiling(what)
        try:
            with self._native():
                return self.runtime.compile(rows, params)
        finally:
            self._show_compiling(None)

    def _show_compiling(self, what: str | None) -> None:
        with self._cond:
            self.status = dataclasses.replace(self.status, compiling=what)
            self._listen()

    def _warm_up(self, task: WarmTask) -> None:
        """Compile one warm-up task (nothing when its programs are compiled already)."""
        seconds = None
        try:
            if not self.runtime.compiled(task.rows, task.params):
                report = self._compile(task.rows, task.params, f"warm-up: {task.label}")
                seconds = report.seconds
                log.info(
                    "warmed up %s in %.1fs (%d compiled, %d from the cache)",
                    task.label,
                    report.seconds,
                    report.compiled,
                    report.cache_hits,
                )
        except InputError as exc:  # a shape this runtime cannot run: nothing to warm
            log.warning("warm-up skipped %s: %s", task.label, exc)
        except Exception:
            log.exception("warm-up of %s failed", task.label)
        with self._cond:
            self._busy = None
            self._warm.finished(seconds)
            self._publish_warming()

    def _publish_warming(self) -> None:
        """The stage after loading: "warming (k of n)" while programs wait, else "ready" (lock held)."""
        if self._stopping:
            return  # a compile that outlived stop() must not turn "stopping" back into "ready"
        warm = self._warm
        if warm.tasks or self._busy is not None:
            detail = f"warming ({warm.done} of {warm.total})"
            self._set_status(
                WARMING,
                warm.done / max(warm.total, 1),
                detail,
                compiling=self.status.compiling,
                **warm.counts(busy=self._busy is not None),
            )
        elif self.status.stage != READY:
            self._set_status(READY, 1.0, "ready", warmed=warm.done, shapes=warm.total)
            log.info("engine ready: %d shapes warmed up", warm.total)

    def _listen(self) -> None:
        for listener in self._listeners:
            try:
                listener(self.status)
            except Exception:  # a broken listener must not take the scheduler down
                log.exception("engine status listener failed")

    def _run_batch(self, jobs: list[Job]) -> None:
        run_batch(self.runtime, jobs, self.counters, self._compile_batch, self._warm.one, self._ran)

    def _ran(self, seconds: float) -> None:
        self._batch_seconds = 0.7 * self._batch_seconds + 0.3 * seconds

    def _compile_batch(self, rows: Sequence[CanvasRow], params: SamplingParams, what: str) -> CompileReport:
        report = self._compile(rows, params, what)
        with self._cond:
            self._warm.seconds.append(report.seconds)  # for the next estimates
        return report
