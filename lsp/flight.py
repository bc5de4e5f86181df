"""The editor's automatic suggestion in the making, shared with the requests typing sends meanwhile.

Every keystroke asks again, and a newer request supersedes the one before it (``lsp.supersede``). When a
suggestion takes longer than the time between two keystrokes, cancelling its model call for the newer
request meant that none ever arrived while the user typed (#44: a request every 300 ms, each taking
longer under load). So a model call is not cancelled by a newer request that only continues the text it
was made for (the same document, the text before the cursor extended on the cursor's line, the text
after it unchanged): the newer request waits for it instead, and its answer is still offered if it
continues what was typed meanwhile (the suggestion cache's forwarding trims it). When it does not, the
newest request makes its own call, which the requests after it wait for in turn. Any other request
(another line, a deletion, an explicit one) cancels the call at once, as before.

A call nobody waits for any more (its request cancelled by the editor: VS Code cancels one on each
keystroke before it sends the next) runs on for :data:`GRACE_SECONDS`, for the request typing sends next,
and is cancelled when none comes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

GRACE_SECONDS = 0.5  # longer than an editor's own wait between cancelling a request and sending the next


@dataclass(eq=False)
class Flight:
    """A model call for the text around a cursor (``before`` and ``after`` it, in document ``path``)."""

    path: str
    before: str
    after: str
    fingerprint: str  # of the settings that shape an answer
    task: asyncio.Task[list[str]]
    waiters: int = 0
    grace: asyncio.TimerHandle | None = None

    def continued_by(self, path: str, before: str, after: str, fingerprint: str) -> bool:
        """Whether a cursor at (``before``, ``after``) is this one's after typing on its line only."""
        return (
            (path, after, fingerprint) == (self.path, self.after, self.fingerprint)
            and before.startswith(self.before)
            and "\n" not in before[len(self.before) :]
        )


class Flights:
    """At most one automatic model call per editor, and the requests that wait for it."""

    def __init__(self) -> None:
        self.current: Flight | None = None

    def joinable(self, path: str, before: str, after: str, fingerprint: str) -> Flight | None:
        """The running call that a request at this cursor continues; a running call it does not continue
        is cancelled (None is returned)."""
        flight = self.current
        if flight is None or flight.task.done():
            return None
        if flight.continued_by(path, before, after, fingerprint):
            return flight
        flight.task.cancel()
        return None

    def cancel(self) -> None:
        """Cancel the running call (an explicit request takes over)."""
        if self.current is not None:
            self.current.task.cancel()

    async def run(
        self, path: str, before: str, after: str, fingerprint: str, call: Callable[[], Awaitable[list[str]]]
    ) -> list[str] | None:
        """Make ``call`` the running call and wait for it like the requests that may join it."""
        self.cancel()
        task = asyncio.ensure_future(call())
        task.add_done_callback(_retrieve)
        flight = self.current = Flight(path, before, after, fingerprint, task)
        return await self.wait(flight)

    async def wait(self, flight: Flight) -> list[str] | None:
        """The call's answer; None when the call was cancelled (by a request it could not serve) while
        this request waited. This request's own cancellation leaves the call running, for a while."""
        flight.waiters += 1
        if flight.grace is not None:
            flight.grace.cancel()
            flight.grace = None
        try:
            return await asyncio.shield(flight.task)
        except asyncio.CancelledError:
            me = asyncio.current_task()
            if flight.task.cancelled() and not (me is not None and me.cancelling()):
                return None
            raise
        finally:
            flight.waiters -= 1
            if not flight.waiters and not flight.task.done():
                flight.grace = asyncio.get_running_loop().call_later(GRACE_SECONDS, flight.task.cancel)


def _retrieve(task: asyncio.Task[list[str]]) -> None:
    """A call's failure is reported by the requests that wait for it; with none left, it is dropped here
    rather than logged by asyncio as never retrieved."""
    if not task.cancelled():
        task.exception()
