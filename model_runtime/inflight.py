"""Build each program once, whichever thread asks: a second caller waits for the first one's build.

The daemon compiles on two threads: the device thread compiles what a waiting request needs, the warm-up
thread compiles ahead (``assistant.server.scheduler``). When both want the same program, compiling it
twice would cost a whole compile of CPU for nothing, so the later caller waits for the earlier one and
takes its result. No JAX here: the fake runtime shares it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")


class InFlight(Generic[T]):
    """Builds keyed values at most once at a time per key (``get``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._building: dict[Hashable, threading.Event] = {}

    def get(
        self, key: Hashable, lookup: Callable[[], T | None], build: Callable[[], T]
    ) -> tuple[T, float | None]:
        """``lookup()``'s value when there is one, else ``build()``'s; while another thread builds ``key``,
        wait for it and look again. Returns the value and the seconds spent waiting for another thread's
        build (None when nobody else was building it).

        ``lookup`` runs under this object's lock, so it must not wait for anything ``build`` holds.
        """
        waited: float | None = None
        while True:
            with self._lock:
                found = lookup()
                if found is not None:
                    return found, waited
                event = self._building.get(key)
                if event is None:
                    event = self._building[key] = threading.Event()
                    break
            t0 = time.perf_counter()
            event.wait()  # the other build ended (or failed: then this thread tries itself)
            waited = (waited or 0.0) + time.perf_counter() - t0
        try:
            return build(), waited
        finally:
            with self._lock:
                del self._building[key]
            event.set()
