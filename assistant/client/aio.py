"""The asynchronous client of the diffu daemon (for the TUI and the language server).

The twin of :class:`assistant.client.Client`: the same methods, made from the same call table
(``assistant.client.calls``); requests, parsing and errors live in ``assistant.client.core`` and finding
or starting the daemon in ``locate``, shared by both. Import it from ``assistant.client``. Importing it
must stay cheap: no JAX, no server code.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Concatenate, ParamSpec, TypeVar

import httpx

from assistant import sse
from assistant.client import calls
from assistant.client.calls import Call, Event, Stream
from assistant.client.core import (
    LOST_CONNECTION,
    RETRIES,
    APIError,
    DaemonUnavailable,
    Endpoint,
    Progress,
    client_settings,
    give_up,
    health_refused,
    health_update,
    is_health_stream,
    lost_daemon,
    no_daemon,
    parse_event,
    raise_for_status,
)
from assistant.client.locate import resolve_endpoint, start_daemon
from assistant.config import Config

P = ParamSpec("P")
T = TypeVar("T")


def _call(entry: Callable[P, Call[T]]) -> Callable[Concatenate[AsyncClient, P], Awaitable[T]]:
    """A method of :class:`AsyncClient` from an entry of the call table: build the call, await its answer."""

    async def run(self: AsyncClient, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await self.call(entry(*args, **kwargs))

    calls.named_like(entry, run, "AsyncClient")
    return run


def _stream(entry: Callable[P, Stream]) -> Callable[Concatenate[AsyncClient, P], AsyncIterator[Event]]:
    """A streaming method of :class:`AsyncClient` from an entry of the call table: its events."""

    def run(self: AsyncClient, /, *args: P.args, **kwargs: P.kwargs) -> AsyncIterator[Event]:
        return self.events(entry(*args, **kwargs))

    calls.named_like(entry, run, "AsyncClient", returns=AsyncIterator[Event])
    return run


class AsyncClient:
    """Asynchronous twin of :class:`Client` (for the TUI and the language server)."""

    def __init__(
        self,
        url: str | None = None,
        api_key: str | None = None,
        *,
        config: Config | None = None,
        autostart: bool | None = None,
        progress: Progress | None = None,
        timeout: float | None = None,
        wait_compiled: bool = True,
    ) -> None:
        self.config, self.autostart, limits = client_settings(config, url, api_key, autostart, timeout)
        self.progress = progress
        self._http = httpx.AsyncClient(timeout=limits)
        self._endpoint: Endpoint | None = None
        self.started_daemon: Endpoint | None = None  # the daemon this client started itself, if it did
        # Connecting waits until a chat's first prompt is answered without a compile (/health ok); off,
        # only until the daemon takes requests: a request of another shape compiles its own program at
        # once instead of waiting for the chat's.
        self.wait_compiled = wait_compiled

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def endpoint(self) -> Endpoint:
        if self._endpoint is None:
            self._endpoint = await self.connect()
        return self._endpoint

    async def connect(self) -> Endpoint:
        """Find or start a daemon (discovery and spawning run in a thread), then wait until it is ready."""
        endpoint = await asyncio.to_thread(resolve_endpoint, self.config)
        if endpoint is None:
            if not self.autostart:
                raise no_daemon()
            endpoint = self.started_daemon = await asyncio.to_thread(start_daemon, self.config)
        await self.wait_ready(endpoint)
        self._endpoint = endpoint
        return endpoint

    async def wait_ready(self, endpoint: Endpoint) -> None:
        try:
            async with self._http.stream(
                "GET", endpoint.url + "/health", params={"stream": "1"}, headers=endpoint.headers
            ) as response:
                if not is_health_stream(response):
                    raise health_refused(endpoint, response, await response.aread())
                async for event in sse.aiter_events(response.aiter_lines()):
                    if event.event == "status" and health_update(
                        event, self.progress, wait_compiled=self.wait_compiled
                    ):
                        return
        except httpx.TransportError as exc:
            raise DaemonUnavailable(f"cannot reach the diffu daemon at {endpoint.url}: {exc}") from None
        raise DaemonUnavailable(f"the diffu daemon at {endpoint.url} closed its health stream before ready")

    async def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """One JSON request; returns the decoded body or raises APIError. Reconnects if the daemon left."""
        for tries in range(RETRIES + 1):
            endpoint = await self.endpoint()
            try:
                response = await self._http.request(
                    method, endpoint.url + path, json=body, headers=endpoint.headers
                )
            except LOST_CONNECTION as exc:
                self._endpoint = None
                if give_up(tries, endpoint, self.config):
                    raise lost_daemon(endpoint, exc) from None
                continue
            raise_for_status(response)
            return response.json()
        raise AssertionError("unreachable")

    async def stream(self, path: str, body: dict[str, Any]) -> AsyncIterator[sse.ServerSentEvent]:
        """Raw SSE events of a POST. Reconnects only before the first event: a generation cannot resume."""
        for tries in range(RETRIES + 1):
            endpoint = await self.endpoint()
            started = False
            try:
                async with self._http.stream(
                    "POST", endpoint.url + path, json=body, headers=endpoint.headers
                ) as resp:
                    if resp.status_code >= 400:
                        raise_for_status(resp, await resp.aread())
                    async for event in sse.aiter_events(resp.aiter_lines()):
                        started = True
                        yield event
                return
            except LOST_CONNECTION as exc:
                self._endpoint = None
                if give_up(tries, endpoint, self.config, started=started):
                    raise lost_daemon(endpoint, exc) from None

    async def call(self, call: Call[T]) -> T:
        """Make one call of the table (``assistant.client.calls``) and read its answer."""
        try:
            return call.read(await self.request(call.method, call.path, call.body))
        except APIError as exc:
            return calls.answer(call, exc)

    async def events(self, stream: Stream) -> AsyncIterator[Event]:
        """The parsed events of one streaming call of the table."""
        async for event in self.stream(stream.path, stream.body):
            parsed = parse_event(event)
            if parsed is not None:
                yield parsed

    # -- API: the call table's entries -----------------------------------------------------------------
    status = _call(calls.status)
    models = _call(calls.models)
    warm = _call(calls.warm)
    cancel = _call(calls.cancel)
    tokenize = _call(calls.tokenize)
    generate = _call(calls.generate)
    stream_generate = _stream(calls.stream_generate)
    infill = _call(calls.infill)
    stream_infill = _stream(calls.stream_infill)
    chat_completions = _call(calls.chat_completions)
    completions = _call(calls.completions)
