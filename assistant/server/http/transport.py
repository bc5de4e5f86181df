"""The daemon's HTTP connections: uvicorn's h11 protocol with a deadline for each whole request, and a
bounded number of connection slots (``security.ConnectionSlots``)."""

from __future__ import annotations

import asyncio
import logging
from typing import cast

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from assistant.server.security import ConnectionSlots

log = logging.getLogger("diffu.serve")


def guarded_protocol(seconds: float, max_connections: int, api_key: str | None) -> type:
    """uvicorn's h11 protocol with a deadline for receiving each whole request, and connection slots.

    uvicorn closes idle keep-alive connections, but a connection that sends half a request head or
    body and then nothing stays open forever; enough of them exhaust the open-file limit and lock every
    client out. Here each request (from the connection's start, or from the previous response's end)
    must arrive whole within ``seconds``; the deadline is lifted once it has, so long streamed answers
    are not cut. At most ``max_connections`` are open (``security.ConnectionSlots``): past it, a new
    connection closes the one that has waited longest without serving a request with the token.
    """
    slots = ConnectionSlots(max_connections, api_key)

    class GuardedH11Protocol(H11Protocol):
        _deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            admitted, victim = slots.admit(self)
            if victim is not None:
                log.info("%d connections open: closed the longest idle one", max_connections)
                cast(H11Protocol, victim).transport.close()  # the slots hold these connections
            if not admitted:
                # Every open connection serves a request with the token: this one's requests get 503.
                self.limit_concurrency = 0
            self._arm()

        def data_received(self, data: bytes) -> None:
            scope = self.scope
            super().data_received(data)
            self._note_request(scope)
            if self.conn.their_state in (h11.DONE, h11.MUST_CLOSE, h11.CLOSED, h11.ERROR):
                self._disarm()

        def on_response_complete(self) -> None:
            scope = self.scope
            slots.idle(self)
            super().on_response_complete()
            self._note_request(scope)  # a pipelined request waiting in the buffer starts here
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            slots.closed(self)
            self._disarm()
            super().connection_lost(exc)

        def _note_request(self, previous: object) -> None:
            if self.scope is not None and self.scope is not previous:
                slots.request(self, dict(self.scope["headers"]))

        def _arm(self) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(seconds, self._expire)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expire(self) -> None:
            self._deadline = None
            if not self.transport.is_closing():
                log.info("closed a connection that did not send a whole request in %.0fs", seconds)
                self.transport.close()

    return GuardedH11Protocol
