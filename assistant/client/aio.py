"""The asynchronous client of the diffu daemon (for the TUI and the language server).

The twin of :class:`assistant.client.Client`, method for method; requests, parsing and errors live in
``assistant.client.core`` and finding or starting the daemon in ``locate``, shared by both. Import it from
``assistant.client``. Importing it must stay cheap: no JAX, no server code.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx

from assistant import sse
from assistant.client.core import (
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
from assistant.client.locate import resolve_endpoint, start_daemon
from assistant.config import Config


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
    ) -> None:
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
            async with self._http.stream(
                "GET", endpoint.url + "/health", params={"stream": "1"}, headers=endpoint.headers
            ) as response:
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

    def stream_generate(
        self,
        *,
        messages: list[dict[str, str]] | None = None,
        prompt: str | None = None,
        max_new_tokens: int | None = None,
        sampling: SamplingOptions | None = None,
        session: str | None = None,
        max_seconds: float | None = None,
        return_ids: bool = False,
    ) -> AsyncIterator[Step | Waiting | Done]:
        """Step events (a Waiting first while its programs compile) then one Done (with ``return_ids``,
        carrying the token ids). Leaving the loop early closes the stream, which cancels the job."""
        body = generate_body(
            messages,
            prompt,
            max_new_tokens,
            sampling,
            session,
            max_seconds,
            stream=True,
            return_ids=return_ids,
        )
        return self._events("/v1/diffu/generate", body)

    async def generate(
        self,
        *,
        messages: list[dict[str, str]] | None = None,
        prompt: str | None = None,
        max_new_tokens: int | None = None,
        sampling: SamplingOptions | None = None,
        session: str | None = None,
        max_seconds: float | None = None,
    ) -> Done:
        body = generate_body(messages, prompt, max_new_tokens, sampling, session, max_seconds, stream=False)
        return parse_done(await self.request("POST", "/v1/diffu/generate", body))

    def stream_infill(
        self,
        prefix: str,
        suffix: str = "",
        *,
        canvas_tokens: int | None = None,
        sampling: SamplingOptions | None = None,
        session: str | None = None,
        max_seconds: float | None = None,
        return_ids: bool = False,
    ) -> AsyncIterator[Step | Waiting | Done]:
        body = infill_body(
            prefix, suffix, canvas_tokens, sampling, session, max_seconds, stream=True, return_ids=return_ids
        )
        return self._events("/v1/diffu/infill", body)

    async def infill(
        self,
        prefix: str,
        suffix: str = "",
        *,
        canvas_tokens: int | None = None,
        sampling: SamplingOptions | None = None,
        session: str | None = None,
        max_seconds: float | None = None,
    ) -> Done:
        body = infill_body(prefix, suffix, canvas_tokens, sampling, session, max_seconds, stream=False)
        return parse_done(await self.request("POST", "/v1/diffu/infill", body))

    async def chat_completions(
        self,
        messages: list[dict[str, Any]],
        *,
        max_tokens: int | None = None,
        sampling: SamplingOptions | None = None,
        stop: list[str] | None = None,
    ) -> dict[str, Any]:
        body = openai_body(("messages", messages), max_tokens, sampling, stop)
        return await self.request("POST", "/v1/chat/completions", body)

    async def completions(
        self,
        prompt: str,
        *,
        max_tokens: int | None = None,
        suffix: str | None = None,
        sampling: SamplingOptions | None = None,
        stop: list[str] | None = None,
    ) -> dict[str, Any]:
        body = openai_body(("prompt", prompt), max_tokens, sampling, stop, suffix=suffix)
        return await self.request("POST", "/v1/completions", body)
