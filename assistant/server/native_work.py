"""The daemon's native work: which threads are inside a load or an XLA compile (which cannot be
interrupted: ``Scheduler.stop`` does not wait for them), and what each compiles, for the status.

Shared by the scheduler's device thread and the warm-up's threads, under the scheduler's condition.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

from assistant.server.compile_pool import CompilePool


class NativeWork:
    """Threads inside native work, and what each compiles. ``changed(what)`` is called (lock held) with
    the compiles going on, joined ("; "), or None, whenever that changes.

    With a ``pool``, XLA's compile threads run at the warm-up's lower priority exactly while every
    compile under way is a ``low`` one (a warm-up thread's at its lowered priority; ``compile_pool``)."""

    def __init__(
        self,
        cond: threading.Condition,
        changed: Callable[[str | None], None],
        pool: CompilePool | None = None,
    ) -> None:
        self._cond = cond
        self._changed = changed
        self._threads: set[int] = set()
        self._compiling: dict[int, str] = {}
        self._low: set[int] = set()  # threads whose compile runs at the warm-up's lower priority
        self.pool = pool

    @contextlib.contextmanager
    def working(self, what: str | None = None, *, low: bool = False) -> Iterator[None]:
        """Mark this thread inside native work (loading; compiling ``what``, at a lowered priority when
        ``low``)."""
        me = threading.get_ident()
        with self._cond:
            self._threads.add(me)
            if what is not None:
                self._compiling[me] = what
                if low:
                    self._low.add(me)
                self._prioritize()
                self._changed(self.compiling)
            self._cond.notify_all()
        try:
            yield
        finally:
            with self._cond:
                self._threads.discard(me)
                self._low.discard(me)
                if self._compiling.pop(me, None) is not None:
                    self._prioritize()
                    self._changed(self.compiling)
                self._cond.notify_all()

    def normal(self, ident: int) -> None:
        """The thread ``ident`` compiles at a normal priority again (a request waits for its compile;
        lock held): so do XLA's compile threads."""
        if ident in self._low:
            self._low.discard(ident)
            self._prioritize()

    def _prioritize(self) -> None:
        """XLA's compile threads low while only low compiles are under way, else at their priority."""
        if self.pool is None:
            return
        if self._compiling and set(self._compiling) <= self._low:
            self.pool.lower()
        elif self.pool.lowered:
            self.pool.restore()

    def inside(self, thread: threading.Thread) -> bool:
        """Whether ``thread`` is inside native work now (lock held)."""
        return thread.ident in self._threads

    @property
    def compiling(self) -> str | None:
        """What is being compiled now, for whom (lock held); None: nothing."""
        return "; ".join(self._compiling.values()) or None
