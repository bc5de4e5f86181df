"""Client library for the diffu daemon: sync and async, SSE parsing, discovery, auto-start, reconnect.

Finding the daemon: ``DIFFU_URL``/``DIFFU_API_KEY`` (or ``url``/``api_key`` in config.toml) first, then the
discovery file a running daemon publishes, otherwise (``autostart``) a background daemon is started for the
configured model and its load and warm-up progress is reported through ``progress(stage, fraction,
detail)``. If the daemon goes away between calls, the next call finds or starts a new one.

Importing this module must stay cheap (editors start ``diffu lsp`` on every file open): no JAX, no
model_runtime beyond its plain-Python parts, no server code.

Example::

    from assistant.client import Client
    with Client() as c:
        for event in c.stream_generate(messages=[{"role": "user", "content": "Write quicksort"}]):
            print(event)
"""

from __future__ import annotations

import json
import os
import socket
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from assistant import daemon, sse
from assistant.config import Config, load_config
from assistant.security import read_token

Progress = Callable[[str, float, str], None]
RETRIES = 2  # fresh attempts after a connection failure (the daemon may have died and been restarted)


class DaemonUnavailable(Exception):
    """No daemon could be reached or started; the message says what to do."""


class APIError(Exception):
    """The daemon answered with an error (``status`` and the OpenAI-style ``error`` fields)."""

    def __init__(self, status: int, message: str, kind: str = "", param: str | None = None,
                 retry_after: float | None = None) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message
        self.kind = kind
        self.param = param
        self.retry_after = retry_after


# -- events -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Step:
    """A denoising step: the canvas text (masked tokens shown as ``░``) and the spans unmasked in it."""

    id: str
    step: int
    steps: int
    canvas: str
    masks: int
    unmasked: list[list[int]] = field(default_factory=list)
    masked: list[list[int]] = field(default_factory=list)
    seconds: float = 0.0


@dataclass(frozen=True)
class Done:
    """The final answer. ``finish_reason``: stop, length, time (budget spent) or cancelled."""

    id: str
    text: str
    finish_reason: str
    stats: dict[str, Any] = field(default_factory=dict)
    usage: dict[str, int] = field(default_factory=dict)


def _step(data: dict[str, Any]) -> Step:
    return Step(id=data.get("id", ""), step=data["step"], steps=data["steps"], canvas=data["canvas"],
                masks=data["masks"], unmasked=data.get("unmasked", []), masked=data.get("masked", []),
                seconds=data.get("seconds", 0.0))


def _done(data: dict[str, Any]) -> Done:
    return Done(id=data.get("id", ""), text=data["text"], finish_reason=data["finish_reason"],
                stats=data.get("stats", {}), usage=data.get("usage", {}))


def _native_event(event: sse.ServerSentEvent) -> Step | Done | None:
    if event.event == "step":
        return _step(event.json())
    if event.event == "done":
        return _done(event.json())
    if event.event == "error":
        err = event.json().get("error", {})
        raise APIError(int(err.get("code") or 500), err.get("message", "error"), err.get("type", ""))
    return None


def _raise_for(response: httpx.Response, body: bytes | None = None) -> None:
    if response.status_code < 400:
        return
    raw = response.content if body is None else body
    try:
        err = json.loads(raw).get("error", {})
        message, kind, param = err.get("message", raw.decode()), err.get("type", ""), err.get("param")
    except (ValueError, AttributeError):
        message, kind, param = raw.decode("utf-8", "replace") or response.reason_phrase, "", None
    retry = response.headers.get("retry-after")
    raise APIError(response.status_code, message, kind, param, float(retry) if retry else None)


# -- finding and starting the daemon ------------------------------------------------------------------
@dataclass(frozen=True)
class Endpoint:
    url: str
    api_key: str | None
    info: daemon.DaemonInfo | None = None  # None when the URL came from DIFFU_URL / config

    @property
    def headers(self) -> dict[str, str]:
        # With auth off the daemon accepts any key; clients (and proxies) often insist on sending one.
        return {"authorization": f"Bearer {self.api_key or 'none'}"}


def client_api_key(config: Config) -> str | None:
    return config.api_key or read_token()


def resolve_endpoint(config: Config) -> Endpoint | None:
    """The configured URL, else a running daemon for the configured model (or any, if none is set)."""
    if config.url:
        return Endpoint(config.url.rstrip("/"), client_api_key(config))
    info = daemon.find_daemon(config.model)
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
        info = daemon.start_background(config.model, host=config.host, port=port, extra_args=args, env=env)
    except daemon.DaemonError as exc:
        raise DaemonUnavailable(f"could not start the diffu daemon: {exc}") from None
    return Endpoint(info.url, client_api_key(config), info)


def stderr_progress(prefix: str = "diffu") -> Progress:
    """A progress callback that draws one updating line on a terminal, or prints stage changes otherwise."""
    last = {"stage": ""}

    def report(stage: str, fraction: float, detail: str) -> None:
        if stage == "ok" and not last["stage"]:
            return  # the daemon was ready at once: nothing was waited for, so nothing to say
        if sys.stderr.isatty():
            end = "\n" if stage == "ok" else ""
            sys.stderr.write(f"\r\033[K{prefix}: {stage} {fraction:4.0%} {detail}{end}")
            sys.stderr.flush()
        elif stage != last["stage"]:
            print(f"{prefix}: {stage} {detail}", file=sys.stderr, flush=True)
        last["stage"] = stage

    return report


def _health_update(event: sse.ServerSentEvent, progress: Progress | None) -> bool:
    """Handle one /health?stream=1 event; True once ready. Raises if the daemon failed to load."""
    data = event.json()
    status = data.get("status")
    if progress:
        progress(status, float(data.get("progress", 0.0)), data.get("detail", ""))
    if status == "ok":
        return True
    if status in ("failed", "stopping"):
        message = (data.get("error") or {}).get("message") or status
        raise DaemonUnavailable(f"the diffu daemon could not load its model: {message}")
    return False


def _config(config: Config | None) -> Config:
    return config if config is not None else load_config()[0]


def _settings(config: Config | None, url: str | None, api_key: str | None, autostart: bool | None,
              timeout: float | None) -> tuple[Config, bool, httpx.Timeout]:
    """What both clients take from their arguments: the effective config, auto-start, HTTP timeouts.

    Reads may wait for a whole generation (the daemon's time budget plus a margin); connects should not.
    """
    config = _config(config)
    if url:
        config = config.replace(url=url)
    if api_key:
        config = config.replace(api_key=api_key)
    read = timeout if timeout is not None else config.max_seconds + 60
    return config, config.autostart if autostart is None else autostart, httpx.Timeout(10.0, read=read)


# -- the sync client ----------------------------------------------------------------------------------
class Client:
    """Synchronous client. The daemon is located (or started) on the first request, not at construction."""

    def __init__(self, url: str | None = None, api_key: str | None = None, *, config: Config | None = None,
                 autostart: bool | None = None, progress: Progress | None = None,
                 timeout: float | None = None) -> None:
        self.config, self.autostart, limits = _settings(config, url, api_key, autostart, timeout)
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
                raise DaemonUnavailable("no diffu daemon is running; start one with 'diffu daemon start' or "
                                        "'diffu serve', or set DIFFU_URL")
            endpoint = start_daemon(self.config)
        self.wait_ready(endpoint)
        self._endpoint = endpoint
        return endpoint

    def wait_ready(self, endpoint: Endpoint) -> None:
        try:
            with self._http.stream("GET", endpoint.url + "/health", params={"stream": "1"},
                                   headers=endpoint.headers) as response:
                _raise_for(response, response.read() if response.status_code >= 400 else None)
                for event in sse.iter_events(response.iter_lines()):
                    if event.event == "status" and _health_update(event, self.progress):
                        return
        except httpx.TransportError as exc:
            raise DaemonUnavailable(f"cannot reach the diffu daemon at {endpoint.url}: {exc}") from None
        raise DaemonUnavailable(f"the diffu daemon at {endpoint.url} closed its health stream before ready")

    def _retrying(self, attempt: Callable[[Endpoint], Any]) -> Any:
        """Run ``attempt``; on a connection failure re-discover (or restart) the daemon and try again."""
        for tries in range(RETRIES + 1):
            endpoint = self.endpoint
            try:
                return attempt(endpoint)
            except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError) as exc:
                self._endpoint = None
                if tries == RETRIES or endpoint.info is None and self.config.url:
                    raise DaemonUnavailable(f"lost the diffu daemon at {endpoint.url}: {exc}") from None
        raise AssertionError("unreachable")

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """One JSON request; returns the decoded body or raises APIError."""

        def attempt(endpoint: Endpoint) -> Any:
            response = self._http.request(method, endpoint.url + path, json=body, headers=endpoint.headers)
            _raise_for(response)
            return response.json()

        return self._retrying(attempt)

    def stream(self, path: str, body: dict[str, Any]) -> Iterator[sse.ServerSentEvent]:
        """Raw SSE events of a POST. Reconnects only before the first event: a generation cannot resume."""
        for tries in range(RETRIES + 1):
            endpoint = self.endpoint
            started = False
            try:
                with self._http.stream("POST", endpoint.url + path, json=body,
                                       headers=endpoint.headers) as resp:
                    _raise_for(resp, resp.read() if resp.status_code >= 400 else None)
                    for event in sse.iter_events(resp.iter_lines()):
                        started = True
                        yield event
                return
            except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError) as exc:
                self._endpoint = None
                if started or tries == RETRIES:
                    raise DaemonUnavailable(f"lost the diffu daemon at {endpoint.url}: {exc}") from None

    # -- API -------------------------------------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        response = self._http.get(self.endpoint.url + "/health")
        return response.json()

    def status(self) -> dict[str, Any]:
        return self.request("GET", "/v1/diffu/status")

    def models(self) -> dict[str, Any]:
        return self.request("GET", "/v1/models")

    def cancel(self, request_id: str) -> bool:
        try:
            return bool(self.request("POST", "/v1/diffu/cancel", {"id": request_id}).get("cancelled"))
        except APIError as exc:
            if exc.status == 404:
                return False
            raise

    def stream_generate(self, *, messages: list[dict[str, str]] | None = None, prompt: str | None = None,
                        **params: Any) -> Iterator[Step | Done]:
        """Step events then one Done. Leaving the loop early closes the stream, which cancels the job."""
        body = _generate_body(messages, prompt, params, stream=True)
        for event in self.stream("/v1/diffu/generate", body):
            parsed = _native_event(event)
            if parsed is not None:
                yield parsed

    def generate(self, *, messages: list[dict[str, str]] | None = None, prompt: str | None = None,
                 **params: Any) -> Done:
        return _done(self.request("POST", "/v1/diffu/generate", _generate_body(messages, prompt, params)))

    def stream_infill(self, prefix: str, suffix: str = "", **params: Any) -> Iterator[Step | Done]:
        for event in self.stream("/v1/diffu/infill", {"prefix": prefix, "suffix": suffix, **params,
                                                       "stream": True}):
            parsed = _native_event(event)
            if parsed is not None:
                yield parsed

    def infill(self, prefix: str, suffix: str = "", **params: Any) -> Done:
        return _done(self.request("POST", "/v1/diffu/infill", {"prefix": prefix, "suffix": suffix, **params,
                                                                "stream": False}))

    def chat_completions(self, messages: list[dict[str, Any]], **kwargs: Any) -> dict[str, Any]:
        return self.request("POST", "/v1/chat/completions", {"messages": messages, **kwargs, "stream": False})

    def completions(self, prompt: str, **kwargs: Any) -> dict[str, Any]:
        return self.request("POST", "/v1/completions", {"prompt": prompt, **kwargs, "stream": False})


def _generate_body(messages: list[dict[str, str]] | None, prompt: str | None, params: dict[str, Any], *,
                   stream: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {**params, "stream": stream}
    if messages is not None:
        body["messages"] = messages
    if prompt is not None:
        body["prompt"] = prompt
    return body


# -- the async client ---------------------------------------------------------------------------------
class AsyncClient:
    """Asynchronous twin of :class:`Client` (for the TUI and the language server)."""

    def __init__(self, url: str | None = None, api_key: str | None = None, *, config: Config | None = None,
                 autostart: bool | None = None, progress: Progress | None = None,
                 timeout: float | None = None) -> None:
        self.config, self.autostart, limits = _settings(config, url, api_key, autostart, timeout)
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
        import asyncio

        endpoint = await asyncio.to_thread(resolve_endpoint, self.config)
        if endpoint is None:
            if not self.autostart:
                raise DaemonUnavailable("no diffu daemon is running; start one with 'diffu daemon start' or "
                                        "'diffu serve', or set DIFFU_URL")
            endpoint = await asyncio.to_thread(start_daemon, self.config)
        await self.wait_ready(endpoint)
        self._endpoint = endpoint
        return endpoint

    async def wait_ready(self, endpoint: Endpoint) -> None:
        try:
            async with self._http.stream("GET", endpoint.url + "/health", params={"stream": "1"},
                                         headers=endpoint.headers) as response:
                if response.status_code >= 400:
                    _raise_for(response, await response.aread())
                async for event in sse.aiter_events(response.aiter_lines()):
                    if event.event == "status" and _health_update(event, self.progress):
                        return
        except httpx.TransportError as exc:
            raise DaemonUnavailable(f"cannot reach the diffu daemon at {endpoint.url}: {exc}") from None
        raise DaemonUnavailable(f"the diffu daemon at {endpoint.url} closed its health stream before ready")

    async def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        for tries in range(RETRIES + 1):
            endpoint = await self.endpoint()
            try:
                response = await self._http.request(method, endpoint.url + path, json=body,
                                                    headers=endpoint.headers)
            except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError) as exc:
                self._endpoint = None
                if tries == RETRIES or endpoint.info is None and self.config.url:
                    raise DaemonUnavailable(f"lost the diffu daemon at {endpoint.url}: {exc}") from None
                continue
            _raise_for(response)
            return response.json()
        raise AssertionError("unreachable")

    async def stream(self, path: str, body: dict[str, Any]) -> AsyncIterator[sse.ServerSentEvent]:
        for tries in range(RETRIES + 1):
            endpoint = await self.endpoint()
            started = False
            try:
                async with self._http.stream("POST", endpoint.url + path, json=body,
                                             headers=endpoint.headers) as resp:
                    if resp.status_code >= 400:
                        _raise_for(resp, await resp.aread())
                    async for event in sse.aiter_events(resp.aiter_lines()):
                        started = True
                        yield event
                return
            except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError) as exc:
                self._endpoint = None
                if started or tries == RETRIES:
                    raise DaemonUnavailable(f"lost the diffu daemon at {endpoint.url}: {exc}") from None

    async def status(self) -> dict[str, Any]:
        return await self.request("GET", "/v1/diffu/status")

    async def cancel(self, request_id: str) -> bool:
        try:
            return bool((await self.request("POST", "/v1/diffu/cancel", {"id": request_id})).get("cancelled"))
        except APIError as exc:
            if exc.status == 404:
                return False
            raise

    async def stream_generate(self, *, messages: list[dict[str, str]] | None = None,
                              prompt: str | None = None, **params: Any) -> AsyncIterator[Step | Done]:
        async for event in self.stream("/v1/diffu/generate", _generate_body(messages, prompt, params,
                                                                             stream=True)):
            parsed = _native_event(event)
            if parsed is not None:
                yield parsed

    async def generate(self, *, messages: list[dict[str, str]] | None = None, prompt: str | None = None,
                       **params: Any) -> Done:
        body = _generate_body(messages, prompt, params)
        return _done(await self.request("POST", "/v1/diffu/generate", body))

    async def stream_infill(self, prefix: str, suffix: str = "", **params: Any) -> AsyncIterator[Step | Done]:
        async for event in self.stream("/v1/diffu/infill", {"prefix": prefix, "suffix": suffix, **params,
                                                             "stream": True}):
            parsed = _native_event(event)
            if parsed is not None:
                yield parsed

    async def infill(self, prefix: str, suffix: str = "", **params: Any) -> Done:
        return _done(await self.request("POST", "/v1/diffu/infill", {"prefix": prefix, "suffix": suffix,
                                                                      **params, "stream": False}))

    async def chat_completions(self, messages: list[dict[str, Any]], **kwargs: Any) -> dict[str, Any]:
        return await self.request("POST", "/v1/chat/completions", {"messages": messages, **kwargs,
                                                                    "stream": False})

    async def completions(self, prompt: str, **kwargs: Any) -> dict[str, Any]:
        return await self.request("POST", "/v1/completions", {"prompt": prompt, **kwargs, "stream": False})
