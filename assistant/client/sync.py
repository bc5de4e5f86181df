"""The sync client (``Client``); the package ``assistant.client`` is the public import for both clients."""

from __future__ import annotations

from collections.abc import Callable, Iterator
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


def _call(entry: Callable[P, Call[T]]) -> Callable[Concatenate[Client, P], T]:
    """A method of :class:`Client` from an entry of the call table: build the call, wait for its answer."""

    def run(self: Client, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self.call(entry(*args, **kwargs))

    calls.named_like(entry, run, "Client")
    return run


def _stream(entry: Callable[P, Stream]) -> Callable[Concatenate[Client, P], Iterator[Event]]:
    """A streaming method of :class:`Client` from an entry of the call table: its events, as they come."""

    def run(self: Client, /, *args: P.args, **kwargs: P.kwargs) -> Iterator[Event]:
        return self.events(entry(*args, **kwargs))

    calls.named_like(entry, run, "Client", returns=Iterator[Event])
    return run


# -- the sync client ----------------------------------------------------------------------------------
class Client:
    """Synchronous client. The daemon is located (or started) on the first request, not at construction.

    Requests, parsing, errors and retry decisions are shared with :class:`AsyncClient`; only the I/O
    differs.
    """

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
        self._http = httpx.Client(timeout=limits)
        self._endpoint: Endpoint | None = None
        self.started_daemon: Endpoint | None = None  # the daemon this client started itself, if it did
        # Connecting waits until a chat's first prompt is answered without a compile (/health ok); off,
        # only until the daemon takes requests: a request of another shape compiles its own program at
        # once instead of waiting for the chat's.
        self.wait_compiled = wait_compiled

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # -- connection ------------------------------------------------------------------------------------
    @property
    def endpoint(self) -> Endpoint:
        if self._endpoint is None:
            self._endpoint = self.connect()
        return self._endpoint

    def connect(self) -> Endpoint:
        """Find a running daemon or start one, then wait until it is ready (reporting progress)."""
        endpoint = resolve_endpoint(self.config)
        if endpoint is None:
            if not self.autostart:
                raise no_daemon()
            endpoint = self.started_daemon = start_daemon(self.config)
        self.wait_ready(endpoint)
        self._endpoint = endpoint
        return endpoint

    def wait_ready(self, endpoint: Endpoint) -> None:
        try:
            with self._http.stream(
                "GET", endpoint.url + "/health", params={"stream": "1"}, headers=endpoint.headers
            ) as response:
                if not is_health_stream(response):
                    raise health_refused(endpoint, response, response.read())
                for event in sse.iter_events(response.iter_lines()):
                    if event.event == "status" and health_update(
                        event, self.progress, wait_compiled=self.wait_compiled
                    ):
                        return
        except httpx.TransportError as exc:
            raise DaemonUnavailable(f"cannot reach the diffu daemon at {endpoint.url}: {exc}") from None
        raise DaemonUnavailable(f"the diffu daemon at {endpoint.url} closed its health stream before ready")

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """One JSON request; returns the decoded body or raises APIError. Reconnects if the daemon left."""
        for tries in range(RETRIES + 1):
            endpoint = self.endpoint
            try:
                response = self._http.request(
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

    def stream(self, path: str, body: dict[str, Any]) -> Iterator[sse.ServerSentEvent]:
        """Raw SSE events of a POST. Reconnects only before the first event: a generation cannot resume."""
        for tries in range(RETRIES + 1):
            endpoint = self.endpoint
            started = False
            try:
                with self._http.stream(
                    "POST", endpoint.url + path, json=body, headers=endpoint.headers
                ) as resp:
                    raise_for_status(resp, resp.read() if resp.status_code >= 400 else None)
                    for event in sse.iter_events(resp.iter_lines()):
                        started = True
                        yield event
                return
            except LOST_CONNECTION as exc:
                self._endpoint = None
                if give_up(tries, endpoint, self.config, started=started):
                    raise lost_daemon(endpoint, exc) from None

    def call(self, call: Call[T]) -> T:
        """Make one call of the table (``assistant.client.calls``) and read its answer."""
        try:
            return call.read(self.request(call.method, call.path, call.body))
        except APIError as exc:
            return calls.answer(call, exc)

    def events(self, stream: Stream) -> Iterator[Event]:
        """The parsed events of one streaming call of the table."""
        for event in self.stream(stream.path, stream.body):
            parsed = parse_event(event)
            if parsed is not None:
                yield parsed

    # -- API: the call table's entries, and the health check -------------------------------------------
    def health(self) -> dict[str, Any]:
        """``/health`` as it answers (200 serving, 503 loading or failed), without raising."""
        response = self._http.get(self.endpoint.url + "/health")
        return response.json()

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
