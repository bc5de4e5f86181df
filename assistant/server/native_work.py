"""The daemon's native work: which threads are inside a load or an XLA compile (which cannot be
interrupted: ``Scheduler.stop`` does not wait for them), and what each compiles, for the status.

Shared by the scheduler's device thread and the warm-up's threads, under the scheduler's condition.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator


class NativeWork:
    """Threads inside native work, and what each compiles. ``changed(what)`` is called (lock held) with
    the compiles going on, joined ("; "), or None, whenever that changes."""

    def __init__(self, cond: threading.Condition, changed: Callable[[str | None], None]) -> None:
        self._cond = cond
        self._changed = changed
        self._threads: set[int] = set()
        self._compiling: dict[int, str] = {}

    @contextlib.contextmanager
    def working(self, what: str | None = None) -> Iterator[None]:
        """Mark this thread inside native work (loading; compiling ``what``)."""
        me = threading.get_ident()
        with self._cond:
            self._threads.add(me)
            if what is not None:
                self._compiling[me] = what
                self._changed(self.compiling)
            self._cond.notify_all()
        try:
            yield
        finally:
            with self._cond:
                self._threads.discard(me)
                if self._compiling.pop(me, None) is not None:
                    self._changed(self.compiling)
                self._cond.notify_all()

    def inside(self, thread: threading.Thread) -> bool:
        """Whether ``thread`` is inside native work now (lock held)."""
        return thread.ident in self._threads

    @property
    def compiling(self) -> str | None:
        """What is being compiled now, for whom (lock held); None: nothing."""
        return "; ".join(self._compiling.values()) or None
