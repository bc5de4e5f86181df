"""Server-sent event responses that notice a client leaving, and the feed behind ``/health?stream=1``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.responses import StreamingResponse

from assistant.server.status import SchedulerStatus


class HealthFeed:
    """Pushes scheduler status changes to /health?stream=1 listeners without polling."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._changed = asyncio.Event()

    def notify(self, status: SchedulerStatus) -> None:  # scheduler thread
        del status
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._fire)

    def _fire(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait(self) -> None:
        await self._changed.wait()


class EventStream(StreamingResponse):
    """An SSE response that also listens for the client going away and then calls ``on_disconnect``.

    Starlette's StreamingResponse only notices a disconnect on its next write under ASGI 2.4; a
    generation waiting for its next denoising step would not write for a while, so we watch ``receive``.
    """

    def __init__(
        self,
        events: AsyncIterator[bytes],
        *,
        on_disconnect: Callable[[], None] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(
            events,
            media_type="text/event-stream",
            headers={"cache-control": "no-cache", "x-accel-buffering": "no", **(headers or {})},
        )
        self.events = events
        self.on_disconnect = on_disconnect

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        async def pump() -> None:
            await send(
                {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
            )
            async for chunk in self.events:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})

        pump_task = asyncio.ensure_future(pump())
        watch_task = asyncio.ensure_future(wait_disconnect(receive))
        try:
            await asyncio.wait({pump_task, watch_task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone = not pump_task.done() or pump_task.cancelled() or pump_task.exception() is not None
            if gone and self.on_disconnect:
                # The client left (or the write failed): stop its generation. A no-op once it finished.
                self.on_disconnect()
            pump_task.cancel()
            watch_task.cancel()
            await asyncio.gather(pump_task, watch_task, return_exceptions=True)
            await self.events.aclose()  # type: ignore[attr-defined]  # an async generator
        exc = pump_task.exception() if not pump_task.cancelled() else None
        if exc is not None and not isinstance(exc, OSError):
            raise exc


async def wait_disconnect(receive: Any) -> None:
    """Return once the ASGI ``receive`` channel says the client disconnected."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
