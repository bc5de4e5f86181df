"""Server-sent events: encoding on the daemon side, incremental parsing on the client side.

Follows the WHATWG event-stream format: ``event:``/``data:``/``id:``/``retry:`` fields, a blank line
ends an event, lines starting with ``:`` are comments (the daemon sends them as keep-alives), multi-line
data joins with ``\\n``. Standard library only, so clients import it without cost.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ServerSentEvent:
    event: str = "message"
    data: str = ""
    id: str | None = None
    retry: int | None = None

    def json(self) -> Any:
        return json.loads(self.data)


def encode(data: Any, *, event: str | None = None, id: str | None = None) -> bytes:
    """One event; ``data`` that is not a string is JSON-encoded on a single line."""
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    out = []
    if event:
        out.append(f"event: {event}")
    if id is not None:
        out.append(f"id: {id}")
    out.extend(f"data: {line}" for line in text.split("\n"))
    return ("\n".join(out) + "\n\n").encode("utf-8")


def comment(text: str = "") -> bytes:
    """A comment line: ignored by parsers, keeps proxies and clients from timing the stream out."""
    return f": {text}\n\n".encode()


class SSEDecoder:
    """Turns lines (without their line ending) into events."""

    def __init__(self) -> None:
        self._event = ""
        self._data: list[str] = []
        self._id: str | None = None
        self._retry: int | None = None

    def feed(self, line: str) -> ServerSentEvent | None:
        """Feed one line; returns an event when ``line`` is the blank line that ends one."""
        if not line:
            if not self._data and not self._event:
                return None
            event = ServerSentEvent(self._event or "message", "\n".join(self._data), self._id, self._retry)
            self._event, self._data, self._retry = "", [], None
            return event
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        elif name == "id" and "\0" not in value:
            self._id = value
        elif name == "retry" and value.isdigit():
            self._retry = int(value)
        return None  # unknown fields are ignored, as the spec says

    def flush(self) -> ServerSentEvent | None:
        """At end of stream: an event whose closing blank line never came is dropped (per the spec)."""
        self._event, self._data = "", []
        return None


def iter_events(lines: Iterable[str]) -> Iterator[ServerSentEvent]:
    decoder = SSEDecoder()
    for line in lines:
        event = decoder.feed(line.rstrip("\r\n"))
        if event is not None:
            yield event


async def aiter_events(lines: AsyncIterable[str]) -> AsyncIterator[ServerSentEvent]:
    decoder = SSEDecoder()
    async for line in lines:
        event = decoder.feed(line.rstrip("\r\n"))
        if event is not None:
            yield event
