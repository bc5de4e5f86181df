"""The sync client (``Client``); the package ``assistant.client`` is the public import for both clients."""

from __future__ import annotations

from collections.abc import Iterator
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
    ) -> None:
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
            with self._http.stream(
                "GET", endpoint.url + "/health", params={"stream": "1"}, headers=endpoint.headers
            ) as response:
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
    ) -> Iterator[Step | Waiting | Done]:
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

    def generate(
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
        return parse_done(self.request("POST", "/v1/diffu/generate", body))

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
    ) -> Iterator[Step | Waiting | Done]:
        body = infill_body(
            prefix, suffix, canvas_tokens, sampling, session, max_seconds, stream=True, return_ids=return_ids
        )
        return self._events("/v1/diffu/infill", body)

    def infill(
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
        return parse_done(self.request("POST", "/v1/diffu/infill", body))

    def chat_completions(
        self,
        messages: list[dict[str, Any]],
        *,
        max_tokens: int | None = None,
        sampling: SamplingOptions | None = None,
        stop: list[str] | None = None,
    ) -> dict[str, Any]:
        body = openai_body(("messages", messages), max_tokens, sampling, stop)
        return self.request("POST", "/v1/chat/completions", body)

    def completions(
        self,
        prompt: str,
        *,
        max_tokens: int | None = None,
        suffix: str | None = None,
        sampling: SamplingOptions | None = None,
        stop: list[str] | None = None,
    ) -> dict[str, Any]:
        body = openai_body(("prompt", prompt), max_tokens, sampling, stop, suffix=suffix)
        return self.request("POST", "/v1/completions", body)
