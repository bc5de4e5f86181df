"""The scheduler's warm-up at work: its thread, what it compiles and the first run of each program.

The plan and its queue are ``assistant.server.warmup``'s; this is how the scheduler carries it out. Where
the runtime can compile beside a running batch (``RuntimeInfo.concurrent_compile``: CPU), a thread of its
own (``diffu-warmup``) compiles the queued tasks one by one while no job waits or runs, so a job that
comes during a compile starts at once instead of waiting for it; once the chat's first programs are in,
that thread runs at a lower CPU priority (:data:`WARM_NICE`). Otherwise the device thread compiles them
between jobs. Each compiled task then runs once on made-up rows on the device thread, between jobs
(``_prime``). The stage the scheduler reports follows (``_publish_warming``): "compiling" until the chat's
first programs are in, "warming (k of n)" while others wait, then "ready".

:class:`WarmUp` is a part of :class:`assistant.server.scheduler.Scheduler` (a mixin): it works on the
scheduler's lock, queues and status, declared below.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from assistant.server.job import Job
from assistant.server.status import SchedulerStatus
from assistant.server.warmup import WarmQueue, WarmTask
from assistant.wire import Stage
from model_runtime.errors import InputError
from model_runtime.interface import CanvasRow, CompileReport, RuntimeProtocol
from model_runtime.params import SamplingParams

log = logging.getLogger("diffu.engine")

# The warm-up thread's niceness once the chat's first programs are compiled (Linux: per thread). Measured
# on 2 loaded cores: a request's own 14.7 s compile took 28.5 s beside a warm-up compile at the same
# priority, 18.5 s beside one at niceness 15.
WARM_NICE = 15


class WarmUp:
    """The warm-up part of the scheduler (see the module's docstring)."""

    # The scheduler's state this part works on (Scheduler.__init__ sets it).
    _cond: threading.Condition
    _warm: WarmQueue
    _busy: WarmTask | None  # the warm-up task being compiled
    _priming: deque[tuple[WarmTask, CompileReport]]  # compiled, waiting for their first run
    _warmer: threading.Thread | None  # the warm-up thread, where the runtime allows one
    _native: set[int]  # threads inside a load or compile (native work, cannot stop)
    _compiling: dict[int, str]  # what each thread compiles now, for the status
    _pending: deque[Job]
    _running: list[Job]
    _stopping: bool
    status: SchedulerStatus

    if TYPE_CHECKING:  # the scheduler's own

        @property
        def runtime(self) -> RuntimeProtocol: ...

        def _set_status(
            self, stage: Stage, progress: float, detail: str = "", error: str | None = None, **warm: Any
        ) -> None: ...

        def _listen(self) -> None: ...

    def _start_warm_up(self, runtime: RuntimeProtocol, plan: list[WarmTask]) -> None:
        """Queue the plan and, where the runtime allows it, start the warm-up thread (lock held)."""
        if runtime.info.concurrent_compile:
            self._warmer = threading.Thread(target=self._warm_main, name="diffu-warmup", daemon=True)
            self._warmer.start()
        self._warm.add(plan)
        self._publish_warming()

    def _in_native(self, thread: threading.Thread) -> bool:
        return thread.ident in self._native

    def _warm_here(self) -> bool:
        """Whether the device thread itself has warm-up work (no warm-up thread; lock held)."""
        return self._warmer is None and bool(self._warm.tasks)

    # -- the warm-up thread ----------------------------------------------------------------------------
    def _warm_main(self) -> None:
        """Compile the warm-up's programs one by one while no job waits or runs; a job that comes during
        a compile runs beside it on the device thread."""
        niced = False
        while True:
            with self._cond:
                while not self._stopping and (self._pending or self._running or not self._warm.tasks):
                    self._cond.wait()
                if self._stopping:
                    return
                task = self._busy = self._warm.pop()
            if task is None:
                continue
            if not task.ready and not niced:
                niced = True
                _lower_priority()
            self._warm_up(task)

    @contextlib.contextmanager
    def _native_work(self, what: str | None = None) -> Iterator[None]:
        """Mark native work that cannot be interrupted (loading, compiling ``what``) on this thread, for
        ``stop`` and the status."""
        me = threading.get_ident()
        with self._cond:
            self._native.add(me)
            if what is not None:
                self._compiling[me] = what
                self._show_compiling()
            self._cond.notify_all()
        try:
            yield
        finally:
            with self._cond:
                self._native.discard(me)
                if self._compiling.pop(me, None) is not None:
                    self._show_compiling()

    def _compile(self, rows: Sequence[CanvasRow], params: SamplingParams, what: str) -> CompileReport:
        """Compile what ``runtime.run(rows, params)`` needs, showing ``what`` in the status."""
        with self._native_work(what):
            return self.runtime.compile(rows, params)

    def _show_compiling(self) -> None:
        """Publish what is being compiled (lock held)."""
        what = "; ".join(self._compiling.values()) or None
        self.status = dataclasses.replace(self.status, compiling=what)
        self._listen()

    def _warm_up(self, task: WarmTask) -> None:
        """Compile one warm-up task (nothing when its programs are compiled already), then have its
        programs run once (``_prime``): here on the device thread, else handed to it."""
        report = None
        try:
            if not self.runtime.compiled(task.rows, task.params):
                report = self._compile(task.rows, task.params, f"warm-up: {task.label}")
        except InputError as exc:  # a shape this runtime cannot run: nothing to warm
            log.warning("warm-up skipped %s: %s", task.label, exc)
        except Exception:
            log.exception("warm-up of %s failed", task.label)
        with self._cond:
            self._busy = None  # compiled: what is left (its first run) is the device thread's
            if report is not None and self._warmer is not None:
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
        the first request of that shape does not pay it. Two forwards at most (the fast decoder's refresh
        and one step of its block loop; a reference step), one when a request is waiting by then."""
        t0 = time.perf_counter()
        try:
            events = self.runtime.run(task.rows, task.params)
            try:
                for i, _ in enumerate(events):
                    if i == 1 or self._pending:  # a request came: it goes first, after this forward
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
            self._warm.finished(task, seconds)
            self._publish_warming()
            self._cond.notify_all()

    def _publish_warming(self) -> None:
        """The stage after loading (lock held): "compiling" while the chat's first programs are not all in,
        "warming (k of n)" while other programs wait, else "ready"."""
        if self._stopping:
            return  # a compile that outlived stop() must not turn "stopping" back into "ready"
        warm = self._warm
        busy = self._busy is not None or bool(self._priming)
        counts = warm.counts(busy=busy)
        if warm.ready_left:
            done = warm.ready_total - warm.ready_left
            detail = f"compiling the chat's programs ({done} of {warm.ready_total})"
            progress = done / max(warm.ready_total, 1)
            self._set_status(Stage.COMPILING, progress, detail, compiling=self.status.compiling, **counts)
        elif warm.tasks or busy:
            detail = f"warming ({warm.done} of {warm.total})"
            progress = warm.done / max(warm.total, 1)
            self._set_status(Stage.WARMING, progress, detail, compiling=self.status.compiling, **counts)
        elif self.status.stage != Stage.READY:
            self._set_status(Stage.READY, 1.0, "ready", warmed=warm.done, shapes=warm.total)
            log.info("engine ready: %d shapes warmed up", warm.total)


def _lower_priority() -> None:
    """Lower the calling thread's CPU priority to ``WARM_NICE`` (Linux: niceness is per thread; threads
    XLA starts from it inherit it). Elsewhere, or where it is refused, nothing changes."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WARM_NICE)
    except (AttributeError, OSError) as exc:
        log.debug("warm-up thread priority unchanged: %s", exc)
