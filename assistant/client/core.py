"""What the sync and async clients share: the events and errors they return, response and event
parsing, and the retry decisions. No I/O here; the two clients in ``assistant.client`` only differ in how
they wait, and their methods come from one call table (``calls``: each call's signature, request body and
how its answer is read).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from assistant import discovery, sse
from assistant.config import Config, load_config
from assistant.wire import ENDED, HEALTH_OK, DoneStats, SamplingOptions

Progress = Callable[[str, float, str], None]
RETRIES = 2  # fresh attempts after a connection failure (the daemon may have died and been restarted)


class DaemonUnavailable(Exception):
    """No daemon could be reached or started; the message says what to do."""


class APIError(Exception):
    """The daemon answered with an error: ``status`` and the fields of its ``error`` object.

    ``kind`` is the error's ``type``, ``code`` its stable code (``context_length_exceeded``, ...) and
    ``details`` the facts as fields, e.g. ``prompt_tokens`` and ``context_length`` for a prompt that
    does not fit; read them instead of the message, which is for people.
    """

    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "",
        param: str | None = None,
        retry_after: float | None = None,
        *,
        code: str | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message
        self.kind = kind
        self.param = param
        self.retry_after = retry_after
        self.code = code
        self.details: dict[str, Any] = dict(details or {})


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
    block: int = 0  # the fast decoder's block (of ``blocks``; 0: the reference decoder, no blocks)
    blocks: int = 0


@dataclass(frozen=True)
class Waiting:
    """The request waits for its programs to compile (``reason`` "compiling"), or for the warm-up's
    compile in progress to end ("warm-up"); ``eta_seconds`` is the daemon's estimate, when it has one."""

    id: str
    reason: str
    detail: str
    eta_seconds: float | None = None


@dataclass(frozen=True, kw_only=True)
class WarmShape:
    """A request shape for ``warm``: ``prompt_tokens`` of context, ``max_new_tokens`` to generate,
    ``infill`` (context on both sides), ``batch`` rows, and the sampling knobs the requests will send."""

    prompt_tokens: int
    max_new_tokens: int
    infill: bool = False
    batch: int = 1
    sampling: SamplingOptions | None = None

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = self.sampling.body() if self.sampling is not None else {}
        body.update(prompt_tokens=self.prompt_tokens, max_new_tokens=self.max_new_tokens, infill=self.infill)
        if self.batch != 1:
            body["batch"] = self.batch
        return body


@dataclass(frozen=True)
class Done:
    """The final answer. ``finish_reason``: stop, length, time (budget spent) or cancelled.

    ``stats``: what it cost (tokens, steps, seconds queued, compiling and generating).
    ``holes``: for a prompt whose ``<|mask|>`` holes were filled (``max_new_tokens=0``), each hole's text.
    """

    id: str
    text: str
    finish_reason: str
    stats: DoneStats = field(default_factory=DoneStats)
    usage: dict[str, int] = field(default_factory=dict)
    holes: list[str] | None = None
    ids: dict[str, Any] | None = None
    """With ``return_ids``: ``prompt`` (the ids before the generated region), ``sequence`` (the whole
    canvas: prompt, region, an infill's suffix) and ``pad_id``."""


def _step(data: dict[str, Any]) -> Step:
    return Step(
        id=data.get("id", ""),
        step=data["step"],
        steps=data["steps"],
        canvas=data["canvas"],
        masks=data["masks"],
        unmasked=data.get("unmasked", []),
        masked=data.get("masked", []),
        seconds=data.get("seconds", 0.0),
        block=data.get("block", 0),
        blocks=data.get("blocks", 0),
    )


def parse_done(data: dict[str, Any]) -> Done:
    return Done(
        id=data.get("id", ""),
        text=data["text"],
        finish_reason=data["finish_reason"],
        stats=DoneStats.from_dict(data.get("stats") or {}),
        usage=data.get("usage", {}),
        holes=data.get("holes"),
        ids=data.get("ids"),
    )


def parse_event(event: sse.ServerSentEvent) -> Step | Waiting | Done | None:
    if event.event == "step":
        return _step(event.json())
    if event.event == "waiting":
        data = event.json()
        eta = data.get("eta_seconds")
        return Waiting(data.get("id", ""), data.get("reason", ""), data.get("detail", ""), eta)
    if event.event == "done":
        return parse_done(event.json())
    if event.event == "error":
        err = event.json().get("error", {})
        # In an SSE error event ``code`` is the HTTP status the request would have had.
        raise APIError(
            int(err.get("code") or 500),
            err.get("message", "error"),
            err.get("type", ""),
            err.get("param"),
            details=err.get("details"),
        )
    return None


def api_error(response: httpx.Response, body: bytes | None = None) -> APIError:
    """The error of a response with status >= 400: the daemon's ``error`` object when the body is one."""
    raw = response.content if body is None else body
    try:
        err = json.loads(raw).get("error", {})
        message, kind, param = err.get("message", raw.decode()), err.get("type", ""), err.get("param")
        code, details = err.get("code"), err.get("details")
    except (ValueError, AttributeError):
        message, kind, param = raw.decode("utf-8", "replace") or response.reason_phrase, "", None
        code, details = None, None
    retry = response.headers.get("retry-after")
    return APIError(
        response.status_code,
        message,
        kind,
        param,
        float(retry) if retry else None,
        code=code if isinstance(code, str) else None,
        details=details if isinstance(details, dict) else None,
    )


def raise_for_status(response: httpx.Response, body: bytes | None = None) -> None:
    if response.status_code >= 400:
        raise api_error(response, body)


def is_health_stream(response: httpx.Response) -> bool:
    """Whether an answer to ``GET /health?stream=1`` is the daemon's: a 2xx event stream."""
    kind = response.headers.get("content-type", "")
    return response.status_code < 300 and kind.split(";")[0].strip() == "text/event-stream"


def health_refused(endpoint: Endpoint, response: httpx.Response, body: bytes) -> Exception:
    """The error for an answer to ``GET /health?stream=1`` that is not an event stream: the daemon's own
    error when the body is one (``{"error": {...}}``), else one line naming the URL. Whatever answers at
    a ``DIFFU_URL`` that is not a diffu daemon (a file server's 404 page, a proxy's login form) is not
    shown: its HTML would fill the terminal and say nothing about the mistake."""
    status = response.status_code
    try:
        ours = status >= 400 and isinstance(json.loads(body).get("error"), dict)
    except (ValueError, AttributeError):
        ours = False
    if ours:
        return api_error(response, body)
    kind = response.headers.get("content-type", "").split(";")[0].strip() or "no content type"
    what = f"{status} on /health" if status >= 300 else f"/health answered {kind}, not an event stream"
    return DaemonUnavailable(f"{endpoint.url} is not a diffu daemon ({what})")


LOST_CONNECTION = (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError)  # the daemon went away


def give_up(tries: int, endpoint: Endpoint, config: Config, *, started: bool | None = None) -> bool:
    """After a lost connection: whether to stop instead of finding (or starting) the daemon again.

    A JSON request (``started`` None) to a URL the user configured is not retried; a stream (``started``
    says whether it delivered events) is retried only before its first event: it cannot resume.
    """
    if started is None:
        return tries == RETRIES or (endpoint.info is None and bool(config.url))
    return started or tries == RETRIES


def lost_daemon(endpoint: Endpoint, exc: Exception) -> DaemonUnavailable:
    return DaemonUnavailable(f"lost the diffu daemon at {endpoint.url}: {exc}")


def no_daemon() -> DaemonUnavailable:
    return DaemonUnavailable(
        "no diffu daemon is running; start one with 'diffu daemon start' or 'diffu serve', or set DIFFU_URL"
    )


@dataclass(frozen=True)
class Endpoint:
    url: str
    api_key: str | None
    info: discovery.DaemonInfo | None = None  # None when the URL came from DIFFU_URL / config

    @property
    def headers(self) -> dict[str, str]:
        # With auth off the daemon accepts any key; clients (and proxies) often insist on sending one.
        return {"authorization": f"Bearer {self.api_key or 'none'}"}


def health_update(
    event: sse.ServerSentEvent, progress: Progress | None, *, wait_compiled: bool = True
) -> bool:
    """Handle one /health?stream=1 event; True once ready (``wait_compiled`` off: once it takes requests,
    which it does while the clients' first programs still compile). Raises if the daemon failed to load."""
    data = event.json()
    status = data.get("status")
    if progress:
        progress(status, float(data.get("progress", 0.0)), data.get("detail", ""))
    if status == HEALTH_OK or (not wait_compiled and data.get("serving")):
        return True
    if status in ENDED:
        message = (data.get("error") or {}).get("message") or status
        raise DaemonUnavailable(f"the diffu daemon could not load its model: {message}")
    return False


def _config(config: Config | None) -> Config:
    return config if config is not None else load_config()[0]


def client_settings(
    config: Config | None, url: str | None, api_key: str | None, autostart: bool | None, timeout: float | None
) -> tuple[Config, bool, httpx.Timeout]:
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
