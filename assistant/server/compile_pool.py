"""The native threads XLA compiles on, and their priority while only the warm-up compiles (Linux).

A warm-up thread at a lower priority (``warming.WARM_NICE``) does little of its compile's work itself:
XLA's CPU client hands the compile to threads of its own, started at a normal priority and shared by
every compile of the process. Measured on 2 cores: of one compile's 1,100 ticks of CPU, the calling
thread used 2, XLA's threads the rest. :class:`CompilePool` lowers those threads with the warm-up thread,
and gives them their priority back whenever a compile at a normal priority (a request's, a client's
first program, a warm-up thread a request waits for) is under way.

They are told by when they started, not by name (XLA names some ``llvm-worker-N``, others not): the
threads outside Python started after JAX's backend (``RuntimeInfo.backend_threads``, noted before the
process first compiled), less its execution pool (``tf_XLAEigen``), which runs every program. Measured on
this CPU client, no thread started after the backend ran any part of a program.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("diffu.engine")

TASKS = Path("/proc/self/task")
EXECUTION_THREAD = "tf_XLAEigen"  # XLA's CPU execution pool


def later_threads(backend: frozenset[int]) -> set[int]:
    """This process's threads outside Python and outside XLA's execution pool that started after the
    ``backend`` threads (empty when those are unknown, or off Linux)."""
    if not backend:
        return set()
    try:
        tids = {int(tid) for tid in os.listdir(TASKS)}
    except OSError:
        return set()
    python = {t.native_id for t in threading.enumerate()}
    found = set()
    for tid in tids - backend - python:
        try:
            name = (TASKS / str(tid) / "comm").read_text().strip()
        except OSError:
            continue  # ended meanwhile
        if not name.startswith(EXECUTION_THREAD):
            found.add(tid)
    return found


def renice(tid: int, niceness: int, *, only_lower: bool = False) -> int | None:
    """Set thread ``tid``'s niceness (Linux: niceness is per thread, and threads started from it inherit
    it); with ``only_lower``, never to a higher priority than it has. Its niceness before, or None where
    that is refused, unknown, or the thread has ended."""
    try:
        before = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, max(before, niceness) if only_lower else niceness)
    except (AttributeError, OSError) as exc:
        log.debug("thread %d priority unchanged: %s", tid, exc)
        return None
    return before


_raise_allowed: bool | None = None


def can_raise_priority() -> bool:
    """Whether this process may give a thread back a priority it lowered (root, CAP_SYS_NICE or a high
    enough RLIMIT_NICE), probed once on a thread of its own."""
    global _raise_allowed
    if _raise_allowed is None:
        result: list[bool] = []

        def probe() -> None:
            try:
                me = threading.get_native_id()
                before = os.getpriority(os.PRIO_PROCESS, me)
                os.setpriority(os.PRIO_PROCESS, me, before + 1)
                os.setpriority(os.PRIO_PROCESS, me, before)
                result.append(True)
            except (AttributeError, OSError):
                result.append(False)

        thread = threading.Thread(target=probe, name="diffu-priority-probe")
        thread.start()
        thread.join()
        _raise_allowed = bool(result and result[0])
    return _raise_allowed


class CompilePool:
    """XLA's compile threads, lowered to ``niceness`` by :meth:`lower` and given their priority back by
    :meth:`restore`. ``backend`` is set once the runtime is loaded; ``find(backend)`` lists the compile
    threads (:func:`later_threads`). Not thread-safe: its owner calls it under its lock."""

    def __init__(self, niceness: int, find: Callable[[frozenset[int]], set[int]] = later_threads) -> None:
        self.niceness = niceness
        self._find = find
        self.backend: frozenset[int] = frozenset()
        self._before: dict[int, int] = {}  # lowered thread -> its niceness before
        self.lowered = False

    def lower(self) -> None:
        """Lower XLA's compile threads (those started since the last call too). Nothing where this
        process could not raise them again: a request's own compile must never run on them low."""
        self.lowered = True
        if not can_raise_priority():
            return
        for tid in self._find(self.backend) - set(self._before):
            before = renice(tid, self.niceness, only_lower=True)
            if before is not None:  # else it ended meanwhile
                self._before[tid] = before

    def restore(self) -> None:
        """Give every lowered thread its priority back."""
        self.lowered = False
        for tid, before in self._before.items():
            renice(tid, before)  # None: it ended meanwhile (raising was probed)
        self._before.clear()
