"""The warm-up at work: its threads, what they compile and the first run of each program.

The plan and its queue are ``assistant.server.warmup``'s; :class:`WarmUp` carries them out for the
scheduler, which owns it and talks to it through a few methods (``start``, ``add``, ``device_work`` /
``take_device_work`` / ``do``, ``stop``), sharing only its condition and its record of native work.

Where the runtime can compile beside a running batch (``RuntimeInfo.concurrent_compile``: CPU), threads
of its own (``diffu-warmup-N``, one per core up to ``threads``) compile the queued tasks while no job
waits or runs, so a job that comes during a compile starts at once instead of waiting for it; once the
clients' first programs are in, those threads run at a lower CPU priority (:data:`WARM_NICE`).
Otherwise the device thread compiles them between jobs. Each compiled task then runs once on made-up
rows on the device thread, between jobs (``_prime``). The stage follows (``_publish``): "compiling"
until the clients' first programs are in, "warming (k of n)" while others wait, then "ready".
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from assistant.server.compile_pool import renice
from assistant.server.job import JobWaiting
from assistant.server.native_work import NativeWork
from assistant.server.status import QueueFull, ShuttingDown
from assistant.server.warmup import WarmQueue, WarmTask
from assistant.wire import Stage
from model_runtime.errors import InputError
from model_runtime.interface import CanvasRow, CompileReport, RuntimeProtocol
from model_runtime.params import SamplingParams

log = logging.getLogger("diffu.engine")

# The warm-up threads' niceness once the clients' first programs are compiled (Linux: per thread).
# Measured on 2 loaded cores: a request's own 14.7 s compile took 28.5 s beside a warm-up compile at the
# same priority, 18.5 s beside one at niceness 15.
WARM_NICE = 15

Publish = Callable[..., None]
"""``publish(stage, progress, detail, **counts)``: the scheduler's status after loading."""


class WarmUp:
    """The warm-up of one scheduler (see the module's docstring). ``idle()`` says whether no job waits or
    runs; ``waiting()`` whether a job waits (a first run gives way to it); ``stopping()`` whether the
    scheduler stops. Every method but ``do`` and the threads' own runs with the condition held."""

    def __init__(
        self,
        cond: threading.Condition,
        work: NativeWork,
        *,
        idle: Callable[[], bool],
        waiting: Callable[[], bool],
        stopping: Callable[[], bool],
        publish: Publish,
    ) -> None:
        self._cond, self._work = cond, work
        self._idle, self._waiting, self._stopping, self._publish_status = idle, waiting, stopping, publish
        self.queue = WarmQueue()
        self._busy: dict[int, WarmTask] = {}  # what each thread compiles now
        self._native: dict[int, int] = {}  # each warm-up thread's native id (its ident's)
        self._niced: dict[int, int] = {}  # native id -> the niceness the thread had before it was lowered
        # Compiled on a warm-up thread, waiting for their first run on the device thread (``_prime``).
        self._priming: deque[tuple[WarmTask, CompileReport]] = deque()
        self.threads: list[threading.Thread] = []
        self._runtime: RuntimeProtocol | None = None

    # -- the scheduler's side --------------------------------------------------------------------------
    def start(self, runtime: RuntimeProtocol, plan: list[WarmTask], threads: int) -> None:
        """Queue the plan and, where the runtime allows it, start ``threads`` warm-up threads."""
        self._runtime = runtime
        if self._work.pool is not None:
            self._work.pool.backend = runtime.info.backend_threads
        if runtime.info.concurrent_compile:
            for i in range(max(1, threads)):
                thread = threading.Thread(target=self._main, name=f"diffu-warmup-{i}", daemon=True)
                self.threads.append(thread)
                thread.start()
        self.queue.add(plan)
        self._publish()

    def add(self, tasks: Sequence[WarmTask]) -> int:
        """Queue ``tasks`` ahead of the generic warm-up (in their order, behind the clients' first
        programs); how many were queued. QueueFull when the queue holds its limit already."""
        if self._stopping():
            raise ShuttingDown("the daemon is shutting down")
        queue = self.queue
        if tasks and len(queue.tasks) >= queue.limit:
            raise QueueFull(
                f"{queue.limit} shapes are waiting to be warmed up; retry later",
                retry_after=max(1, math.ceil(queue.estimate() or 1)),
            )
        queued = queue.add(tasks, first=True)
        if queued:
            self._publish()
        return queued

    def device_work(self) -> bool:
        """Whether the device thread has warm-up work: a first run, or (no warm-up thread) a compile."""
        return bool(self._priming) or (not self.threads and bool(self.queue.tasks))

    def take_device_work(self) -> tuple[WarmTask, CompileReport | None]:
        """The device thread's next warm-up work (``device_work`` said there is): a compiled task to run
        once (with what compiling it cost), else a task to compile (None)."""
        if self._priming:
            return self._priming.popleft()
        task = self.queue.pop()
        assert task is not None
        self._busy[threading.get_ident()] = task
        return task, None

    def do(self, work: tuple[WarmTask, CompileReport | None]) -> None:
        """Carry out ``take_device_work``'s work on the device thread (condition not held)."""
        task, report = work
        if report is None:
            self._warm_up(task)
        else:
            self._prime(task, report)

    def note_for(self) -> JobWaiting | None:
        """What a job queued now is told when the device thread compiles a warm-up program (it runs right
        after it); None when the device thread does not."""
        if self.threads or not self._busy:
            return None
        busy = next(iter(self._busy.values()))
        return JobWaiting("warm-up", f"the warm-up is compiling a program ({busy.label})", self.queue.one())

    def stop(self) -> None:
        """Forget what is queued (the daemon stops)."""
        self.queue.drop()
        self._priming.clear()

    # -- the warm-up threads ---------------------------------------------------------------------------
    def _main(self) -> None:
        """Compile the warm-up's programs while no job waits or runs; a job that comes during a compile
        runs beside it on the device thread."""
        native = threading.get_native_id()
        while True:
            with self._cond:
                while not self._stopping() and not (self._idle() and self.queue.tasks):
                    self._cond.wait()
                if self._stopping():
                    return
                task = self.queue.pop()
                if task is None:
                    continue
                self._busy[threading.get_ident()] = task
                self._native[threading.get_ident()] = native
                if not task.ready and native not in self._niced:
                    before = renice(native, WARM_NICE)
                    if before is not None:
                        self._niced[native] = before
            self._warm_up(task)

    def give_priority(self, rows: Sequence[CanvasRow], params: SamplingParams) -> None:
        """A request is about to compile the programs of ``rows`` and ``params``: a warm-up thread at its
        lower priority that compiles the same shape gets its priority back (the request would wait for
        that compile: at a load of 8 a compile at niceness 15 took minutes). It is lowered again with its
        next task. Where raising a priority is refused (not root, RLIMIT_NICE), nothing changes."""
        runtime = self._runtime
        if runtime is None:
            return
        wanted = runtime.program_keys(rows, params)
        for ident, task in self._busy.items():
            native = self._native.get(ident)
            if native not in self._niced:
                continue
            if runtime.program_keys(task.rows, task.params) & wanted:
                if renice(native, self._niced[native]) is not None:
                    del self._niced[native]
                    self._work.normal(ident)
                    log.info("a request waits for the warm-up compile of %s: priority back", task.label)

    def _warm_up(self, task: WarmTask) -> None:
        """Compile one warm-up task (nothing when its programs are compiled already), then have its
        programs run once (``_prime``): here on the device thread, else handed to it."""
        assert self._runtime is not None
        report = None
        try:
            if not self._runtime.compiled(task.rows, task.params):
                low = self._native.get(threading.get_ident()) in self._niced
                with self._work.working(f"warm-up: {task.label}", low=low):
                    report = self._runtime.compile(task.rows, task.params)
        except InputError as exc:  # a shape this runtime cannot run: nothing to warm
            log.warning("warm-up skipped %s: %s", task.label, exc)
        except Exception:
            log.exception("warm-up of %s failed", task.label)
        with self._cond:
            self._busy.pop(threading.get_ident(), None)  # compiled: its first run is the device thread's
            if report is not None and self.threads:
                self._priming.append((task, report))
                self._cond.notify_all()
                return
        if report is None:
            self._warmed(task, None)
        else:
            self._prime(task, report)

    def _prime(self, task: WarmTask, report: CompileReport) -> None:
        """Run a freshly compiled task's programs once, on made-up rows, on the device thread. A program's
        first run costs more than its later ones (measured on 2 loaded cores for the bundled model's chat
        programs: the first step 0.68 s instead of 0.11 s, the answer 2.15 s instead of 1.4 s); paid here,
        the first request of that shape does not pay it. Two forwards at most, one when a request is
        waiting by then."""
        assert self._runtime is not None
        t0 = time.perf_counter()
        try:
            events = self._runtime.run(task.rows, task.params)
            try:
                for i, _ in enumerate(events):
                    if i == 1 or self._waiting():  # a request came: it goes first, after this forward
                        break
            finally:
                close = getattr(events, "close", None)
                if close is not None:
                    close()
        except Exception:  # a made-up row the runtime refuses: its programs are compiled all the same
            log.exception("first run of %s failed", task.label)
        log.info(
            "warmed up %s in %.1fs (%d compiled, %d from the cache), first run %.2fs",
            task.label,
            report.seconds,
            report.compiled,
            report.cache_hits,
            time.perf_counter() - t0,
        )
        self._warmed(task, report.seconds)

    def _warmed(self, task: WarmTask, seconds: float | None) -> None:
        with self._cond:
            self.queue.finished(task, seconds)
            self._publish()
            self._cond.notify_all()

    def _publish(self) -> None:
        """The stage after loading (lock held): "compiling" while the clients' first programs are not all
        in, "warming (k of n)" while other programs wait, else "ready"."""
        if self._stopping():
            return  # a compile that outlived stop() must not turn "stopping" back into "ready"
        queue = self.queue
        counts: dict[str, Any] = {**queue.counts(busy=bool(queue.running)), "compiling": self._work.compiling}
        if queue.ready_left:
            done = queue.ready_total - queue.ready_left
            detail = f"compiling the clients' first programs ({done} of {queue.ready_total})"
            self._publish_status(Stage.COMPILING, done / max(queue.ready_total, 1), detail, **counts)
        elif not queue.over:  # queued, compiling, or a first run to come (on the device thread or under way)
            detail = f"warming ({queue.done} of {queue.total})"
            self._publish_status(Stage.WARMING, queue.done / max(queue.total, 1), detail, **counts)
        else:
            self._publish_status(Stage.READY, 1.0, "ready", warmed=queue.done, shapes=queue.total)
