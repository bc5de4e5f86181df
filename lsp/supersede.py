"""One request at a time per editor and kind of work: a newer request supersedes the one in flight.

An editor is one client of this server, and the user looks at one place at a time, so a suggestion
request supersedes the client's previous one whatever its document (the previous one is answered empty,
and its daemon job is cancelled with its HTTP connection; an automatic one's job runs on when the newer
request only continues its line, see ``lsp.flight``). Neovim 0.12 asks for inline completion in
every buffer that has it enabled, at the same moment and with the current window's cursor; in such a
burst the request for the document edited last is the one kept.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")
BURST_SECONDS = 0.05  # requests this close together come from one editor event, not from the user


class Supersede:
    """Named slots (``"suggest"``, ``"holes"``...), each running at most one request."""

    def __init__(self, touched: Callable[[str], float], counters: Counter[str]) -> None:
        self._touched = touched
        self._slots: dict[str, tuple[asyncio.Task[object], str, float]] = {}
        self.counters = counters  # "superseded" and "cancelled" are counted here

    def cancel(self, uri: str) -> None:
        """Cancel whatever runs for ``uri`` (the document was closed)."""
        for task, slot_uri, _ in list(self._slots.values()):
            if slot_uri == uri:
                task.cancel()

    async def run(self, slot: str, uri: str, work: Callable[[], Awaitable[T]], empty: T) -> T:
        """Run ``work`` as the only request of ``slot``; a superseded one returns ``empty``.

        The request's own cancellation (``$/cancelRequest``) propagates to ``work`` and re-raises, so
        pygls answers RequestCancelled; a supersede is an internal matter, answered normally and empty.
        """
        now = time.monotonic()
        older = self._slots.get(slot)
        if older is not None and not older[0].done():
            task, older_uri, started = older
            if (
                older_uri != uri
                and now - started < BURST_SECONDS
                and self._touched(older_uri) > self._touched(uri)
            ):
                self.counters["superseded"] += 1
                return empty
            task.cancel()
        mine: asyncio.Task[T] = asyncio.ensure_future(work())
        self._slots[slot] = (mine, uri, now)
        try:
            return await mine
        except asyncio.CancelledError:
            me = asyncio.current_task()
            if me is not None and me.cancelling():
                self.counters["cancelled"] += 1
                raise
            self.counters["superseded"] += 1
            return empty
        finally:
            if self._slots.get(slot, (None,))[0] is mine:
                del self._slots[slot]
