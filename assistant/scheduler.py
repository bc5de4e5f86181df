"""The daemon's scheduler: one thread owns the device, fed by a bounded queue, answering through events.

The scheduler thread (logged and reported as "the engine") loads the model, compiles the shape buckets,
then loops: wait on a condition for queued jobs, take the oldest job and every other queued job with the
same sampling parameters whose rows fit one bucket together, run them as one canvas batch, and hand each
job its own step and done events. Between denoising steps it drops jobs that were cancelled (client
gone, explicit cancel, superseded by a newer request of the same session) or ran out of their time
budget; when no job of the batch is left it closes the runtime's generator, which stops the device work
before the next step.

Events reach the asyncio side through ``loop.call_soon_threadsafe`` into each job's queue. Nothing polls:
the thread sleeps on a ``threading.Condition`` and shutdown is a flag plus ``notify``.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from assistant.job import Job, JobDone, JobError, JobStep
from model_runtime.errors import DiffuError, InputError
from model_runtime.interface import BatchDone, BatchStep, RuntimeProtocol
from model_runtime.params import SamplingParams

log = logging.getLogger("diffu.engine")

Loader = Callable[[Callable[[str, float], None]], RuntimeProtocol]
"""``loader(progress)`` builds the runtime inside the scheduler thread; ``progress(detail, fraction)``."""

# How long a batch may wait for requests the HTTP layer is still preparing (parsing, tokenizing): a
# burst of clients then shares one canvas batch instead of the first one running alone. A lone request
# never waits, because nothing is in preparation when it is taken.
COALESCE_SECONDS = 0.02

# Scheduler stages as /health reports them.
STARTING, LOADING, COMPILING, READY, FAILED, STOPPING = (
    "starting", "loading", "compiling", "ready", "failed", "stopping")


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


def params_key(params: SamplingParams) -> tuple[Any, ...]:
    """Jobs batch together only if everything the runtime shares across rows is equal.

    ``max_new_tokens`` is per row (it sized the row's canvas when the row was made); the rest (steps,
    alg, temperature, seed, ...) is one value per ``run`` call.
    """
    d = params.to_dict()
    d.pop("max_new_tokens")
    return tuple(sorted(d.items()))


@dataclass
class SchedulerStatus:
    stage: str = STARTING
    progress: float = 0.0
    detail: str = ""
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "progress": round(self.progress, 4), "detail": self.detail,
                "error": self.error}


class Scheduler:
    """Owns the runtime and the device thread. Create on the event loop's thread; ``start()`` then submit.

    ``loader(progress)`` builds the runtime inside the scheduler thread; ``progress(detail, fraction)``
    reports loading. ``warmup_params`` are the parameters buckets are compiled with (None: no warm-up).
    """

    def __init__(self, loader: Loader, *, queue_size: int, max_batch: int,
                 warmup_params: SamplingParams | None) -> None:
        self._loader = loader
        self.queue_size = queue_size
        self.max_batch = max_batch
        self._warmup_params = warmup_params
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
        self.counters = {"requests": 0, "completed": 0, "cancelled": 0, "timed_out": 0, "failed": 0,
                         "rejected": 0, "batches": 0, "rows": 0, "batched_rows": 0, "largest_batch": 0,
                         "generated_tokens": 0}

    # -- lifecycle -------------------------------------------------------------------------------------
    def add_listener(self, listener: Callable[[SchedulerStatus], None]) -> None:
        """Call ``listener(status)`` (from the scheduler thread) whenever the stage or progress changes."""
        self._listeners.append(listener)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Cancel queued and running jobs, end the thread, wait for it (up to ``timeout`` seconds)."""
        with self._cond:
            self._stopping = True
            dropped = list(self._pending)
            self._pending.clear()
            for job in self._running:
                job.cancel_reason = job.cancel_reason or "shutdown"
            self._cond.notify_all()
        for job in dropped:
            job.emit(JobError(503, "the daemon is shutting down", ShuttingDown.kind))
        if self._thread.is_alive():
            self._thread.join(timeout)
        if self.status.stage != FAILED:
            self._set_status(STOPPING, 1.0, "stopped")

    @property
    def ready(self) -> bool:
        return self.status.stage == READY

    @property
    def loaded(self) -> bool:
        """Whether the runtime exists (it may still be compiling: see ``ready``)."""
        return self._runtime is not None

    @property
    def runtime(self) -> RuntimeProtocol:
        """The loaded runtime (its loader runs in the scheduler thread); serve with it once ``ready``."""
        if self._runtime is None:
            raise NotReady(f"the model is not ready ({self.status.stage} {self.status.progress:.0%})",
                           retry_after=2)
        return self._runtime

    def _set_status(self, stage: str, progress: float, detail: str = "", error: str | None = None) -> None:
        self.status = SchedulerStatus(stage, min(max(progress, 0.0), 1.0), detail, error)
        for listener in self._listeners:
            try:
                listener(self.status)
            except Exception:  # a broken listener must not take the scheduler down
                log.exception("engine status listener failed")

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
                raise NotReady(f"the model is not ready ({self.status.stage} "
                               f"{self.status.progress:.0%})", retry_after=2)
            if len(self._pending) >= self.queue_size:
                self.counters["rejected"] += 1
                waits = math.ceil(len(self._pending) / self.max_batch)
                raise QueueFull(f"the queue is full ({self.queue_size} requests waiting); retry later",
                                retry_after=max(1, math.ceil(waits * self._batch_seconds)))
            job.id = job.id or f"gen-{next(self._ids)}"
            self.counters["requests"] += 1
            if job.session:
                older = self._sessions.get(job.session)
                if older is not None and not older.finished:
                    self._cancel_locked(older, "superseded")
                self._sessions[job.session] = job
            self._pending.append(job)
            self._cond.notify()
        return job

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
            self._finish_cancelled(job, [], 0)
            self._forget(job)

    def _forget(self, job: Job) -> None:
        if job.session and self._sessions.get(job.session) is job:
            del self._sessions[job.session]
        # A running job is dropped by the scheduler thread at the next step boundary.

    def queue_info(self) -> dict[str, int]:
        with self._cond:
            return {"pending": len(self._pending), "running": len(self._running), "capacity": self.queue_size,
                    "max_batch": self.max_batch}

    # -- the scheduler thread --------------------------------------------------------------------------
    def _main(self) -> None:
        try:
            self._set_status(LOADING, 0.0, "loading the model")
            runtime = self._loader(lambda detail, frac: self._set_status(LOADING, frac, detail))
            self._runtime = runtime
            # The runtime cannot run a batch larger than its largest batch bucket.
            largest = max((b for b, _ in runtime.buckets), default=1)
            self.max_batch = max(1, min(self.max_batch, largest))
            if self._warmup_params is not None:
                # Serving while compiling (issues #16/#17) changes this: today nothing is served until every
                # bucket is compiled.
                self._set_status(COMPILING, 0.0, "compiling shape buckets")
                runtime.warmup(self._warmup_params, self._on_warmup)
        except Exception as exc:
            if isinstance(exc, DiffuError):  # a bad checkpoint: the message says it all
                log.error("model load failed: %s", exc)
            else:
                log.exception("model load failed")
            self._set_status(FAILED, 0.0, "model load failed", error=str(exc) or type(exc).__name__)
            return
        if self._stopping:
            return
        self._set_status(READY, 1.0, "ready")
        log.info("engine ready: model %s on %s (%s), buckets %s", runtime.model_name,
                 runtime.device, runtime.dtype, runtime.buckets)
        while True:
            with self._cond:
                while not self._pending and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    return
                deadline = time.monotonic() + COALESCE_SECONDS
                while self._preparing and len(self._pending) < self.max_batch and not self._stopping:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)  # woken by each submit and each finished preparation
                if not self._pending:  # everything queued was cancelled meanwhile
                    continue
                batch = self._take_batch()
                self._running = batch
            try:
                self._run_batch(batch)
            except Exception:  # never let one batch take the device thread down
                log.exception("engine batch failed")
                for job in batch:
                    if not job.finished:
                        self.counters["failed"] += 1
                        job.emit(JobError(500, "internal error in the engine (see the daemon log)",
                                          "server_error"))
            finally:
                with self._cond:
                    self._running = []
                    for job in batch:
                        self._forget(job)

    def _on_warmup(self, done: int, total: int, detail: str) -> None:
        self._set_status(COMPILING, done / total if total else 1.0, detail)

    def _fits(self, lengths: Sequence[int]) -> bool:
        """Whether rows of these lengths fit one (batch, length) bucket of the runtime."""
        if len(lengths) > self.max_batch:
            return False
        if len(lengths) == 1:
            return True
        longest = max(lengths)
        return any(b >= len(lengths) and n >= longest for b, n in self.runtime.buckets)

    def _take_batch(self) -> list[Job]:
        """The oldest job plus later ones that share its parameters and fit a bucket with it (FIFO order)."""
        first = self._pending.popleft()
        batch, key = [first], params_key(first.params)
        for job in list(self._pending):
            if params_key(job.params) == key and self._fits([j.row_length for j in batch] + [job.row_length]):
                batch.append(job)
                self._pending.remove(job)
        return batch

    def _run_batch(self, jobs: list[Job]) -> None:
        t0 = time.monotonic()
        for job in jobs:
            job.started = t0
        self.counters["batches"] += 1
        self.counters["rows"] += len(jobs)
        if len(jobs) > 1:
            self.counters["batched_rows"] += len(jobs)
        self.counters["largest_batch"] = max(self.counters["largest_batch"], len(jobs))
        try:
            gen = self.runtime.run([j.row for j in jobs], jobs[0].params)
        except InputError as exc:
            if len(jobs) > 1:
                # One bad row must not fail its neighbours: run each alone so only it gets the error.
                for job in jobs:
                    self._run_batch([job])
                return
            self.counters["failed"] += 1
            jobs[0].emit(JobError(400, str(exc), "invalid_request_error", param=exc.field,
                                  details=exc.details))
            return
        mask_id = self.runtime.tokenizer.mask_id
        active = dict(enumerate(jobs))
        last: dict[int, JobStep] = {}
        try:
            for event in gen:
                if isinstance(event, BatchStep):
                    now = time.monotonic()
                    for i, job in list(active.items()):
                        step = JobStep(event.step, event.steps, list(event.canvas[i]),
                                       list(event.unmasked[i]),
                                       _masks_left(event, i, mask_id), event.seconds)
                        last[i] = step
                        if job.cancelled:
                            self._finish_cancelled(job, step.ids, event.step + 1)
                            del active[i]
                        elif now - t0 > job.max_seconds and event.step + 1 < event.steps:
                            self._finish_partial(job, step, batch_size=len(jobs))
                            del active[i]
                        else:
                            if job.want_steps:
                                job.emit(step)
                    if not active:
                        break  # everyone left: closing the generator stops the device work
                elif isinstance(event, BatchDone):
                    for i, job in active.items():
                        self._finish_done(job, event, i, len(jobs))
                    active.clear()
        finally:
            gen.close()
            elapsed = time.monotonic() - t0
            self._batch_seconds = 0.7 * self._batch_seconds + 0.3 * elapsed
        for job in active.values():
            # The runtime ended without a BatchDone: report it rather than leave the client waiting.
            self.counters["failed"] += 1
            job.emit(JobError(500, f"the runtime stopped after {len(last)} steps without a result",
                              "server_error"))

    # -- endings ---------------------------------------------------------------------------------------
    def _stop_ids(self, chat: bool) -> set[int]:
        return set(self.runtime.tokenizer.stop_ids(chat=chat))

    def _stats(self, job: Job, *, steps: int, new_tokens: int, batch_size: int, bucket: Any = None,
               compile_seconds: float = 0.0) -> dict[str, Any]:
        end = time.monotonic()
        gen_s = end - (job.started or end)
        return {
            "steps": steps, "new_tokens": new_tokens, "prompt_tokens": job.prompt_tokens,
            "canvas_tokens": job.canvas_tokens, "batch_size": batch_size, "decoder": job.params.decoder,
            "bucket": list(bucket) if bucket else None,
            "queue_seconds": round((job.started or end) - job.created, 4),
            "generate_seconds": round(gen_s, 4), "compile_seconds": round(compile_seconds, 4),
            "tokens_per_second": round(new_tokens / gen_s, 2) if gen_s > 0 else 0.0,
        }

    def _finish_done(self, job: Job, event: BatchDone, i: int, batch_size: int) -> None:
        ids = list(event.generated[i])
        stops = self._stop_ids(job.chat)
        cut = next((k for k, t in enumerate(ids) if t in stops), None)
        new_tokens = len(ids) if cut is None else cut
        self.counters["completed"] += 1
        self.counters["generated_tokens"] += new_tokens
        stats = self._stats(job, steps=event.stats.steps, new_tokens=new_tokens, batch_size=batch_size,
                            bucket=event.stats.bucket, compile_seconds=event.stats.compile_seconds)
        job.emit(JobDone(event.texts[i], ids, "length" if cut is None else "stop", new_tokens,
                         event.stats.steps, stats))

    def _finish_partial(self, job: Job, step: JobStep, *, batch_size: int) -> None:
        """Out of time: answer with the text committed so far, left to right up to the first mask."""
        tok = self.runtime.tokenizer
        stops = self._stop_ids(job.chat) | {tok.mask_id}
        cut = next((k for k, t in enumerate(step.ids) if t in stops), len(step.ids))
        self.counters["timed_out"] += 1
        self.counters["generated_tokens"] += cut
        stats = self._stats(job, steps=step.step + 1, new_tokens=cut, batch_size=batch_size)
        log.info("job %s hit its time budget (%.1fs) after %d/%d steps", job.id, job.max_seconds,
                 step.step + 1, step.steps)
        job.emit(JobDone(tok.decode(step.ids[:cut]), step.ids, "time", cut, step.step + 1, stats))

    def _finish_cancelled(self, job: Job, ids: list[int], steps_run: int) -> None:
        self.counters["cancelled"] += 1
        log.info("job %s cancelled (%s) after %d steps", job.id, job.cancel_reason, steps_run)
        stats = self._stats(job, steps=steps_run, new_tokens=0, batch_size=0)
        stats["cancel_reason"] = job.cancel_reason
        job.emit(JobDone("", ids, "cancelled", 0, steps_run, stats))


def _masks_left(event: BatchStep, i: int, mask_id: int) -> int:
    if event.masks_left:
        return int(event.masks_left[i])
    return sum(1 for t in event.canvas[i] if t == mask_id)
