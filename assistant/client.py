"""Client library for the diffu daemon: sync and async, SSE parsing, discovery, auto-start, reconnect.

Finding the daemon: ``DIFFU_URL``/``DIFFU_API_KEY`` (or ``url``/``api_key`` in config.toml) first, then the
discovery file a running daemon publishes, otherwise (``autostart``) a background daemon is started for the
configured model and its load and warm-up progress is reported through ``progress(stage, fraction,
detail)``. If the daemon goes away between calls, the next call finds or starts a new one.

Requests, parsing and errors live in ``client_core``, shared by both clients. Importing this module
must stay cheap (editors start ``diffu lsp`` on every file open): no JAX, no model_runtime beyond its
plain-Python parts, no server code.

Example::

    from assistant.client import Client
    with Client() as c:
        for event in c.stream_generate(messages=[{"role": "user", "content": "Write quicksort"}]):
            print(event)
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx

from assistant import discovery, sse
from assistant.client_core import (
    LOST_CONNECTION,
    RETRIES,
    APIError,
    DaemonUnavailable,
    Done,
    Endpoint,
    Progress,
    SamplingOptions,
    Step,
    Waiting,
    WarmShape,
    client_settings,
    generate_body,
    give_up,
    health_update,
    infill_body,
    lost_daemon,
    no_daemon,
    openai_body,
    parse_done,
    parse_event,
    raise_for_status,
    warm_body,
)
from assistant.config import Config
from assistant.security import read_token

__all__ = [
    "APIError",
    "AsyncClient",
    "Client",
    "DaemonUnavailable",
    "Done",
    "Endpoint",
    "Progress",
    "SamplingOptions",
    "Step",
    "Waiting",
    "WarmShape",
    "client_api_key",
    "resolve_endpoint",
    "start_daemon",
    "stderr_progress",
]


# -- finding and starting the daemon ------------------------------------------------------------------
def client_api_key(config: Config) -> str | None:
    return config.api_key or read_token()


def resolve_endpoint(config: Config) -> Endpoint | None:
    """The configured URL, else a running daemon for the configured model (or any, if none is set)."""
    if config.url:
        return Endpoint(config.url.rstrip("/"), client_api_key(config))
    info = discovery.find_daemon(config.model)
    if info is None:
        return None
    return Endpoint(info.url, client_api_key(config), info)


def _port_free(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        # As the server binds (uvicorn sets SO_REUSEADDR): a port whose last connections linger in
        # TIME_WAIT after a restart is free for it, and must not send the daemon to a random port.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def start_daemon(config: Config, *, exact_port: bool = False) -> Endpoint:
    """Start a background daemon for ``config.model``; returns once it listens (it may still be loading).

    It gets the configured port (llama.cpp's 8012 by default, which editor plugins assume) when that is
    free, otherwise any free port (clients find it through the discovery file); with ``exact_port`` a
    busy port is an error instead.
    """
    if not config.model:
        raise DaemonUnavailable("no diffu daemon is running and no model is configured: pass --model, set "
                                "DIFFU_MODEL, or put model = \"...\" in config.toml")
    port = config.port if exact_port or (config.port and _port_free(config.host, config.port)) else 0
    args: list[str] = []
    if not config.auth:
        args.append("--no-auth")
    if config.dtype:
        args += ["--dtype", config.dtype]
    if config.quantize:
        args += ["--quantize", config.quantize]
    env = dict(os.environ)
    if config.api_key:
        env["DIFFU_API_KEY"] = config.api_key
    try:
        info = discovery.start_background(config.model, host=config.host, port=port, extra_args=args, env=env)
    except discovery.DaemonError as exc:
        raise DaemonUnavailable(f"could not start the diffu daemon: {exc}") from None
    return Endpoint(info.url, client_api_key(config), info)


def stderr_progress(prefix: str = "diffu") -> Progress:
    """A progress callback that draws one updating line on a terminal, or prints stage changes otherwise."""
    last = {"stage": ""}

    def report(stage: str, fraction: float, detail: str) -> None:
        if stage == "ok" and not last["stage"]:
            return  # the daemon was ready at once: nothing was waited for, so nothing to say
        if stage == "ok":  # it serves; its warm-up may go on between requests
            text = "ready" if detail in ("", "ready") else f"ready to serve ({detail})"
        else:
            text = detail if detail.startswith(stage) else f"{stage} {detail}".rstrip()
        if sys.stderr.isatty():
            end = "\n" if stage == "ok" else f" {fraction:4.0%}"
            sys.stderr.write(f"\r\033[K{prefix}: {text}{end}")
            sys.stderr.flush()
        elif stage != last["stage"]:
            print(f"{prefix}: {text}", file=sys.stderr, flush=True)
        last["stage"] = stage

    return report



# -- the sync client ----------------------------------------------------------------------------------
class Client:
    """Synchronous client. The daemon is located (or started) on the first request, not at construction.

    Requests, parsing, errors and retry decisions are shared with :class:`AsyncClient`; only the I/O
    differs.
    """

    def __init__(self, url: str | None = None, api_key: str | None = None, *, config: Config | None = None,
                 autostart: bool | None = None, progress: Progress | None = None,
                 timeout: float | None = None) -> None:
        self.config, self.autostart, limits = client_settings(config, url, api_key, autostart, timeout)
        self.progress = progress
        self._http = httpx.Client(timeout=limits)
        self._endpoint: Endpoint | None = None

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
            endpoint = start_daemon(self.config)
        self.wait_ready(endpoint)
        self._endpoint = endpoint
        return endpoint

    def wait_ready(self, endpoint: Endpoint) -> None:
        try:
            with self._http.stream("GET", endpoint.url + "/health", params={"stream": "1"},
                                   headers=endpoint.headers) as response:
                raise_for_status(response, response.read() if response.status_code >= 400 else None)
                for event in sse.iter_events(response.iter_lines()):
                    if event.event == "status" and health_update(event, self.progress):
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
                with self._http.stream("POST", endpoint.url + path, json=body,
                                       headers=endpoint.headers) as resp:
                    raise_for_status(resp, resp.read() if resp.status_code >= 400 else None)
                    for event in sse.iter_events(resp.iter_lines()):
                        started = True
                        yield event
                return
            except LOST_CONNECTION as exc:
                self._endpoint = None
                if give_up(tries, endpoint, self.config, started=started):
                    raise lost_daemon(endpoint, exc) from None

    def _events(self, path: str, body: dict[str, Any]) -> Iterator[Step | Waiting | Done]:
        for event in self.stream(path, body):
            parsed = parse_event(event)
            if parsed is not None:
                yield parsed

    # -- API -------------------------------------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        response = self._http.get(self.endpoint.url + "/health")
        return response.json()

    def status(self) -> dict[str, Any]:
        return self.request("GET", "/v1/diffu/status")

    def models(self) -> dict[str, Any]:
        return self.request("GET", "/v1/models")

    def warm(self, shapes: list[WarmShape]) -> dict[str, Any]:
        """Have the daemon compile the programs of ``shapes`` ahead of its generic warm-up; it answers at
        once (``queued``, the indices of shapes already ``compiled``, ``eta_seconds``) and compiles in
        the background, between requests."""
        return self.request("POST", "/v1/diffu/warm", warm_body(shapes))

    def cancel(self, request_id: str) -> bool:
        try:
            return bool(self.request("POST", "/v1/diffu/cancel", {"id": request_id}).get("cancelled"))
        except APIError as exc:
            if exc.status == 404:
                return False
            raise

    def stream_generate(self, *, messages: list[dict[str, str]] | None = None, prompt: str | None = None,
                        max_new_tokens: int | None = None, sampling: SamplingOptions | None = None,
                        session: str | None = None, max_seconds: float | None = None,
                        return_ids: bool = False) -> Iterator[Step | Waiting | Done]:
        """Step events (a Waiting first while its programs compile) then one Done (with ``return_ids``,
        carrying the token ids). Leaving the loop early closes the stream, which cancels the job."""
        body = generate_body(messages, prompt, max_new_tokens, sampling, session, max_seconds, stream=True,
                             return_ids=return_ids)
        return self._events("/v1/diffu/generate", body)

    def generate(self, *, messages: list[dict[str, str]] | None = None, prompt: str | None = None,
                 max_new_tokens: int | None = None, sampling: SamplingOptions | None = None,
                 session: str | None = None, max_seconds: float | None = None) -> Done:
        body = generate_body(messages, prompt, max_new_tokens, sampling, session, max_seconds, stream=False)
        return parse_done(self.request("POST", "/v1/diffu/generate", body))

    def stream_infill(self, prefix: str, suffix: str = "", *, canvas_tokens: int | None = None,
                      sampling: SamplingOptions | None = None, session: str | None = None,
                      max_seconds: float | None = None,
                      return_ids: bool = False) -> Iterator[Step | Waiting | Done]:
        body = infill_body(prefix, suffix, canvas_tokens, sampling, session, max_seconds, stream=True,
                           return_ids=return_ids)
        return self._events("/v1/diffu/infill", body)

    def infill(self, prefix: str, suffix: str = "", *, canvas_tokens: int | None = None,
               sampling: SamplingOptions | None = None, session: str | None = None,
               max_seconds: float | None = None) -> Done:
        body = infill_body(prefix, suffix, canvas_tokens, sampling, session, max_seconds, stream=False)
        return parse_done(self.request("POST", "/v1/diffu/infill", body))

    def chat_completions(self, messages: list[dict[str, Any]], *, max_tokens: int | None = None,
                         sampling: SamplingOptions | None = None,
                         stop: list[str] | None = None) -> dict[str, Any]:
        body = openai_body(("messages", messages), max_tokens, sampling, stop)
        return self.request("POST", "/v1/chat/completions", body)

    def completions(self, prompt: str, *, max_tokens: int | None = None, suffix: str | None = None,
                    sampling: SamplingOptions | None = None, stop: list[str] | None = None) -> dict[str, Any]:
        body = openai_body(("prompt", prompt), max_tokens, sampling, stop, suffix=suffix)
        return self.request("POST", "/v1/completions", body)


# -- the async client ---------------------------------------------------------------------------------
class AsyncClient:
    """Asynchronous twin of :class:`Client` (for the TUI and the language server)."""

    def __init__(self, url: str | None = None, api_key: str | None = None, *, config: Config | None = None,
                 autostart: bool | None = None, progress: Progress | None = None,
                 timeout: float | None = None) -> None:
        self.config, self.autostart, limits = client_settings(config, url, api_key, autostart, timeout)
        self.progress = progress
        self._http = httpx.AsyncClient(timeout=limits)
        self._endpoint: Endpoint | None = None

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
            endpoint = await asyncio.to_thread(start_daemon, self.config)
        await self.wait_ready(endpoint)
        self._endpoint = endpoint
        return endpoint

    async def wait_ready(self, endpoint: Endpoint) -> None:
        try:
            async with self._http.stream("GET", endpoint.url + "/health", params={"stream": "1"},
                                         headers=endpoint.headers) as response:
                if response.status_code >= 400:
                    raise_for_status(response, await response.aread())
                async for event in sse.aiter_events(response.aiter_lines()):
                    if event.event == "status" and health_update(event, self.progress):
                        return
        except httpx.TransportError as exc:
            raise DaemonUnavailable(f"cannot reach the diffu daemon at {endpoint.url}: {exc}") from None
        raise DaemonUnavailable(f"the diffu daemon at {endpoint.url} closed its health stream before ready")

    async def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """One JSON request; returns the decoded body or raises APIError. Reconnects if the daemon left."""
        for tries in range(RETRIES + 1):
            endpoint = await self.endpoint()
            try:
                response = await self._http.request(method, endpoint.url + path, json=body,
                                                    headers=endpoint.headers)
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
                async with self._http.stream("POST", endpoint.url + path, json=body,
                                             headers=endpoint.headers) as resp:
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

    async def _events(self, path: str, body: dict[str, Any]) -> AsyncIterator[Step | Waiting | Done]:
        async for event in self.stream(path, body):
            parsed = parse_event(event)
            if parsed is not None:
                yield parsed

    # -- API -------------------------------------------------------------------------------------------
    async def status(self) -> dict[str, Any]:
        return await self.request("GET", "/v1/diffu/status")

    async def models(self) -> dict[str, Any]:
        return await self.request("GET", "/v1/models")

    async def warm(self, shapes: list[WarmShape]) -> dict[str, Any]:
        """See :meth:`Client.warm`."""
        return await self.request("POST", "/v1/diffu/warm", warm_body(shapes))

    async def cancel(self, request_id: str) -> bool:
        try:
            return bool((await self.request("POST", "/v1/diffu/cancel", {"id": request_id})).get("cancelled"))
        except APIError as exc:
            if exc.status == 404:
                return False
            raise

    def stream_generate(self, *, messages: list[dict[str, str]] | None = None, prompt: str | None = None,
                        max_new_tokens: int | None = None, sampling: SamplingOptions | None = None,
                        session: str | None = None, max_seconds: float | None = None,
                        return_ids: bool = False) -> AsyncIterator[Step | Waiting | Done]:
        """Step events (a Waiting first while its programs compile) then one Done (with ``return_ids``,
        carrying the token ids). Leaving the loop early closes the stream, which cancels the job."""
        body = generate_body(messages, prompt, max_new_tokens, sampling, session, max_seconds, stream=True,
                             return_ids=return_ids)
        return self._events("/v1/diffu/generate", body)

    async def generate(self, *, messages: list[dict[str, str]] | None = None, prompt: str | None = None,
                       max_new_tokens: int | None = None, sampling: SamplingOptions | None = None,
                       session: str | None = None, max_seconds: float | None = None) -> Done:
        body = generate_body(messages, prompt, max_new_tokens, sampling, session, max_seconds, stream=False)
        return parse_done(await self.request("POST", "/v1/diffu/generate", body))

    def stream_infill(self, prefix: str, suffix: str = "", *, canvas_tokens: int | None = None,
                      sampling: SamplingOptions | None = None, session: str | None = None,
                      max_seconds: float | None = None,
                      return_ids: bool = False) -> AsyncIterator[Step | Waiting | Done]:
        body = infill_body(prefix, suffix, canvas_tokens, sampling, session, max_seconds, stream=True,
                           return_ids=return_ids)
        return self._events("/v1/diffu/infill", body)

    async def infill(self, prefix: str, suffix: str = "", *, canvas_tokens: int | None = None,
                     sampling: SamplingOptions | None = None, session: str | None = None,
                     max_seconds: float | None = None) -> Done:
        body = infill_body(prefix, suffix, canvas_tokens, sampling, session, max_seconds, stream=False)
        return parse_done(await self.request("POST", "/v1/diffu/infill", body))

    async def chat_completions(self, messages: list[dict[str, Any]], *, max_tokens: int | None = None,
                               sampling: SamplingOptions | None = None,
                               stop: list[str] | None = None) -> dict[str, Any]:
        body = openai_body(("messages", messages), max_tokens, sampling, stop)
        return await self.request("POST", "/v1/chat/completions", body)

    async def completions(self, prompt: str, *, max_tokens: int | None = None, suffix: str | None = None,
                          sampling: SamplingOptions | None = None,
                          stop: list[str] | None = None) -> dict[str, Any]:
        body = openai_body(("prompt", prompt), max_tokens, sampling, stop, suffix=suffix)
        return await self.request("POST", "/v1/completions", body)
