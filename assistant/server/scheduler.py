"""The daemon's scheduler: one thread owns the device, fed by a bounded queue, answering through events.

The scheduler thread (logged and reported as "the engine") loads the model and from then on serves: it
waits on a condition for queued jobs or programs to warm up. Jobs come first: it takes the oldest job
and every other queued job with the same sampling parameters whose rows fit one bucket together,
compiles their programs if they are not compiled yet (that one compile only, telling the jobs so) and
runs them as one canvas batch (``assistant.server.batch_run``), which hands each job its own events.
Between denoising steps the batch drops jobs that were cancelled (client gone, explicit cancel,
superseded by a newer request of the same session) or ran out of their time budget.

The warm-up (planned in ``assistant.server.warmup``, carried out by ``assistant.server.warming``) compiles
whenever no job waits or runs, on threads of its own where the runtime allows it, so a job that arrives
during a warm-up compile starts at once; /health says "compiling" until every client's first programs
are in and have run once, then "warming (k of n)" until the last one, then "ready".

Events reach the asyncio side through ``loop.call_soon_threadsafe`` into each job's queue. Nothing polls:
the threads sleep on one ``threading.Condition`` (every change wakes all of them) and shutdown is a flag
plus ``notify_all``. Loading and XLA compiles cannot be interrupted; ``stop`` does not wait for them (see
``abandoned``).
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
from assistant.server.compile_pool import CompilePool
from assistant.server.job import Job, JobError
from assistant.server.native_work import NativeWork
from assistant.server.status import NotReady, QueueFull, SchedulerStatus, ShuttingDown
from assistant.server.warming import WARM_NICE, WarmUp
from assistant.server.warmup import WarmTask
from assistant.wire import SERVING, DaemonCounters, ErrorType, Stage
from model_runtime.errors import DiffuError
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
    reports loading. ``planner(runtime)`` gives the programs to warm up once it is loaded (None: none);
    ``warm_threads`` of them compile at once where the runtime compiles beside a running batch.
    """

    def __init__(
        self,
        loader: Loader,
        *,
        queue_size: int,
        max_batch: int,
        planner: Planner | None = None,
        warm_threads: int = 1,
    ) -> None:
        self._loader = loader
        self.queue_size = queue_size
        self.max_batch = max_batch
        self._planner = planner
        self._warm_threads = warm_threads
        self._exited = False
        self._runtime: RuntimeProtocol | None = None
        self.status = SchedulerStatus()
        self._listeners: list[Callable[[SchedulerStatus], None]] = []
        self._cond = threading.Condition()
        self._work = NativeWork(self._cond, self._show_compiling, CompilePool(WARM_NICE))
        self._pending: deque[Job] = deque()
        self._running: list[Job] = []
        self.warm_up = WarmUp(
            self._cond,
            self._work,
            idle=lambda: not (self._pending or self._running),
            waiting=lambda: bool(self._pending),
            stopping=lambda: self._stopping,
            publish=self._set_warm_status,
        )
        self._sessions: dict[str, Job] = {}
        self._preparing = 0
        self._stopping = False
        self._thread = threading.Thread(target=self._main, name="diffu-engine", daemon=True)
        self._ids = itertools.count(1)
        self._batch_seconds = 1.0  # running mean of a batch's duration, for Retry-After
        self.started_at = time.time()
        self.counters = DaemonCounters()

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
            self.warm_up.stop()
            for job in self._running:
                job.cancel_reason = job.cancel_reason or "shutdown"
            self._cond.notify_all()
        for job in dropped:
            job.emit(JobError(503, "the daemon is shutting down", ShuttingDown.kind))
        if self._thread.is_alive():
            with self._cond:
                self._cond.wait_for(lambda: self._exited or self._work.inside(self._thread), timeout)
        if self.abandoned:
            log.info("the engine is inside a load or compile that cannot be interrupted; not waiting for it")
        if self.status.stage != Stage.FAILED:
            self._set_status(Stage.STOPPING, 1.0, "stopped")

    @property
    def abandoned(self) -> bool:
        """Whether the device thread or the warm-up thread is still inside native work after ``stop``: then
        the process must exit without finalizing the interpreter, which would kill that thread inside XLA
        and abort."""
        threads = [self._thread, *self.warm_up.threads]
        with self._cond:
            return self._stopping and any(t.is_alive() and self._work.inside(t) for t in threads)

    @property
    def ready(self) -> bool:
        """Whether requests are served (the warm-up may still be compiling beside them)."""
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
        self, stage: Stage, progress: float, detail: str = "", error: str | None = None, **warm: Any
    ) -> None:
        self.status = SchedulerStatus(stage, min(max(progress, 0.0), 1.0), detail, error, **warm)
        self._listen()

    def _set_warm_status(self, stage: Stage, progress: float, detail: str, **counts: Any) -> None:
        """The warm-up's stage (lock held); "ready" is said once, until more is queued."""
        if stage == Stage.READY and self.status.stage == Stage.READY:
            return
        self._set_status(stage, progress, detail, **counts)
        if stage == Stage.READY:
            log.info("engine ready: %d shapes warmed up", counts.get("shapes", 0))

    def _show_compiling(self, what: str | None) -> None:
        """Publish what is being compiled, and for whom (lock held)."""
        self.status = dataclasses.replace(self.status, compiling=what)
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
            note = self.warm_up.note_for()
            if len(self._pending) >= self.queue_size:
                self.counters.rejected += 1
                waits = math.ceil(len(self._pending) / self.max_batch)
                raise QueueFull(
                    f"the queue is full ({self.queue_size} requests waiting); retry later",
                    retry_after=max(1, math.ceil(waits * self._batch_seconds)),
                )
            job.id = job.id or f"gen-{next(self._ids)}"
            self.counters.requests += 1
            if job.session:
                older = self._sessions.get(job.session)
                if older is not None and not older.finished:
                    self._cancel_locked(older, "superseded")
                self._sessions[job.session] = job
            self._pending.append(job)
            self._cond.notify_all()
        if note is not None:  # the device thread is compiling a warm-up program; the job runs right after it
            job.emit(note)
        return job

    def warm(self, tasks: Sequence[WarmTask]) -> int:
        """Queue ``tasks`` ahead of the generic warm-up (in their order); returns how many were queued.

        Raises QueueFull when the warm-up queue holds its limit already.
        """
        with self._cond:
            queued = self.warm_up.add(tasks)
            self._cond.notify_all()
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
            self._set_status(Stage.LOADING, 0.0, "loading the model")
            with self._work.working():
                runtime = self._loader(lambda detail, frac: self._set_status(Stage.LOADING, frac, detail))
            self._runtime = runtime
            # The runtime cannot run a batch larger than its largest batch bucket.
            self.max_batch = max(1, min(self.max_batch, runtime.info.largest_batch))
            plan = self._planner(runtime) if self._planner is not None else []
        except Exception as exc:
            if isinstance(exc, DiffuError):  # a bad checkpoint: the message says it all
                log.error("model load failed: %s", exc)
            else:
                log.exception("model load failed")
            self._set_status(Stage.FAILED, 0.0, "model load failed", error=str(exc) or type(exc).__name__)
            return
        with self._cond:
            if self._stopping:
                return
            self.warm_up.start(runtime, plan, self._warm_threads)
        log.info(
            "engine serving: model %s on %s (%s), buckets %s; %d shapes to warm up (%d before ready)%s",
            runtime.info.model_name,
            runtime.info.device,
            runtime.info.dtype,
            list(runtime.info.buckets),
            len(plan),
            sum(t.ready for t in plan),
            f", on {len(self.warm_up.threads)} thread(s) of their own" if self.warm_up.threads else "",
        )
        while True:
            warm_work: tuple[WarmTask, CompileReport | None] | None = None
            with self._cond:
                while not (self._pending or self.warm_up.device_work() or self._stopping):
                    self._cond.wait()
                if self._stopping:
                    return
                if not self._pending:
                    warm_work = self.warm_up.take_device_work()
                else:
                    deadline = time.monotonic() + COALESCE_SECONDS
                    while self._preparing and len(self._pending) < self.max_batch and not self._stopping:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            break
                        self._cond.wait(left)  # woken by each submit and each finished preparation
                    if not self._pending:  # everything queued was cancelled meanwhile
                        continue
                    batch = take_batch(self._pending, self.max_batch, self.runtime.info.buckets)
                    self._running = batch
            if warm_work is not None:
                self.warm_up.do(warm_work)
                continue
            try:
                self._run_batch(batch)
            except Exception:  # never let one batch take the device thread down
                log.exception("engine batch failed")
                for job in batch:
                    if not job.finished:
                        self.counters.failed += 1
                        job.emit(
                            JobError(
                                500, "internal error in the engine (see the daemon log)", ErrorType.SERVER
                            )
                        )
            finally:
                with self._cond:
                    self._running = []
                    for job in batch:
                        self._forget(job)
                    self._cond.notify_all()  # the warm-up thread waits for an idle device

    def _listen(self) -> None:
        for listener in self._listeners:
            try:
                listener(self.status)
            except Exception:  # a broken listener must not take the scheduler down
                log.exception("engine status listener failed")

    def _run_batch(self, jobs: list[Job]) -> None:
        run_batch(self.runtime, jobs, self.counters, self._compile_batch, self.warm_up.queue.one, self._ran)

    def _ran(self, seconds: float) -> None:
        self._batch_seconds = 0.7 * self._batch_seconds + 0.3 * seconds

    def _compile_batch(self, rows: Sequence[CanvasRow], params: SamplingParams, what: str) -> CompileReport:
        with self._cond:
            self.warm_up.give_priority(rows, params)
        with self._work.working(what):
            report = self.runtime.compile(rows, params)
        with self._cond:
            self.warm_up.queue.seconds.append(report.seconds)  # for the next estimates
        return report
