"""The daemon's front door: API token, Host allowlist (DNS rebinding), CORS, request body limit, and
the connection slots that idle sockets cannot exhaust for clients with the token.

One pure-ASGI middleware applies, in order: the Host check on loopback binds (403), the Origin check and
CORS preflight (403 for foreign browser origins), the Bearer token on every route but ``/health`` (401),
and the body size limit (413). It reads the whole body up front (bounded by the limit) and replays it to
the app, so the app never sees an oversized body and can still wait for the client's disconnect. The token
file itself (created by the daemon, read by clients) is ``assistant.api_token``.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import re
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from assistant import paths
from assistant.wire import ErrorType, error_body

log = logging.getLogger("diffu.security")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

PUBLIC_PATHS = ("/health",)
_LOCAL_ORIGIN = re.compile(r"^https?://(localhost|127\.0\.0\.1|\[::1\])(:\d{1,5})?$")
# Editor webviews and desktop shells that talk to local servers (as Ollama allows them).
_LOCAL_SCHEMES = ("vscode-webview://", "vscode-file://", "app://", "tauri://", "file://")


# -- host and origin rules ----------------------------------------------------------------------------
def is_loopback(host: str) -> bool:
    """Whether a bind address or Host name stays on this machine."""
    host = host.strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_allowed(host_header: str | None, extra: tuple[str, ...] = ()) -> bool:
    """The DNS-rebinding allowlist: ``localhost``, ``127.0.0.1``, ``[::1]`` and the configured extras.

    A page on ``evil.example`` whose DNS later points at 127.0.0.1 still sends ``Host: evil.example``,
    so refusing unknown names keeps browsers from reaching the daemon through a rebound name. Other
    loopback names (``*.localhost``, ``127.0.0.2``) are refused too: no client of ours sends them, and
    each is one more name a rebinding page could use.
    """
    if not host_header:
        return False
    host = host_header.strip().lower()
    if host.startswith("["):
        host = host[1:].split("]", 1)[0]
    elif host.count(":") == 1:
        host = host.split(":", 1)[0]
    return host in ("localhost", "127.0.0.1", "::1") or host in (h.lower() for h in extra)


def origin_allowed(origin: str, extra: tuple[str, ...] = ()) -> bool:
    """CORS: localhost origins on any port, editor webview schemes, and configured extras. Never ``*``."""
    origin = origin.strip()
    return bool(_LOCAL_ORIGIN.match(origin)) or origin.startswith(_LOCAL_SCHEMES) or origin in extra


def bearer_token(headers: dict[bytes, bytes]) -> str | None:
    value = headers.get(b"authorization", b"").decode("latin-1").strip()
    scheme, _, token = value.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def token_valid(headers: dict[bytes, bytes], api_key: str | None) -> bool:
    """Whether a request's headers carry the API token (any request does, with authentication off)."""
    if api_key is None:
        return True
    token = bearer_token(headers)
    return token is not None and hmac.compare_digest(token.encode(), api_key.encode())


# -- connection slots ---------------------------------------------------------------------------------
class ConnectionSlots:
    """At most ``limit`` open connections, which idle or unauthenticated sockets cannot take from clients.

    A plain cap (uvicorn's ``limit_concurrency``) answers 503 to everyone once ``limit`` sockets are open,
    so a local process holding that many idle or half-sent ones locks every client out, token or not.
    Here a connection past the limit closes the one that has waited longest without serving a request
    that carries the token (an idle socket, a half-sent head, a keep-alive connection between requests,
    an unauthenticated health stream); only when every open connection is serving an authenticated
    request is the new one refused (503). Connections are kept in order of their last activity.
    """

    def __init__(self, limit: int, api_key: str | None) -> None:
        self.limit = limit
        self.api_key = api_key
        self._open: dict[object, bool] = {}  # connection -> serving an authenticated request

    def __len__(self) -> int:
        return len(self._open)

    def admit(self, conn: object) -> tuple[bool, object | None]:
        """Register a new connection: (admitted, the connection to close to make room, if any)."""
        self._open[conn] = False
        if len(self._open) <= self.limit:
            return True, None
        victim = next((c for c, busy in self._open.items() if not busy and c is not conn), None)
        if victim is None:
            return False, None
        del self._open[victim]
        return True, victim

    def request(self, conn: object, headers: dict[bytes, bytes]) -> None:
        """A request head arrived on ``conn``: it is protected while it serves it, if it carries the token."""
        if conn in self._open:
            del self._open[conn]
            self._open[conn] = token_valid(headers, self.api_key)

    def idle(self, conn: object) -> None:
        """``conn`` finished a response and waits for the next request."""
        if conn in self._open:
            del self._open[conn]
            self._open[conn] = False

    def closed(self, conn: object) -> None:
        self._open.pop(conn, None)


# -- the middleware -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Refusal:
    """A request the front door answers itself, with the daemon's error shape."""

    status: int
    message: str
    kind: str
    headers: tuple[tuple[bytes, bytes], ...] = ()
    code: str | None = None

    async def send(self, send: Send) -> None:
        """The response, sent straight through ASGI."""
        body = json.dumps(error_body(self.message, self.kind, code=self.code)).encode()
        await _respond(send, self.status, body, [(b"content-type", b"application/json"), *self.headers])


async def _respond(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    start = {"type": "http.response.start", "status": status}
    await send({**start, "headers": [*headers, (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


class _TooLarge(Exception):
    """The body went past the limit while it was read."""


class GuardMiddleware:
    """Host allowlist, CORS/origin check, Bearer auth and body limit in front of the app."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        api_key: str | None,
        check_host: bool,
        allowed_hosts: tuple[str, ...],
        cors_origins: tuple[str, ...],
        max_body_bytes: int,
    ) -> None:
        self.app = app
        self.api_key = api_key
        self.check_host = check_host
        self.allowed_hosts = allowed_hosts
        self.cors_origins = cors_origins
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        origin = headers.get(b"origin", b"").decode("latin-1")
        refusal = self._foreign(headers, origin)
        if refusal is not None:
            await refusal.send(send)
            return
        if origin:
            cors = [(b"access-control-allow-origin", origin.encode("latin-1")), (b"vary", b"Origin")]
            if scope["method"] == "OPTIONS" and b"access-control-request-method" in headers:
                await _respond(send, 204, b"", [*cors, *_PREFLIGHT])  # a browser asking before it sends
                return
            send = _with_headers(send, cors)
        refusal = self._unauthorized(scope["path"], headers) or self._declared_too_large(headers)
        if refusal is not None:
            await refusal.send(send)
            return
        if scope["method"] in ("POST", "PUT", "PATCH"):
            try:
                body = await self._read_body(receive)
            except _TooLarge:
                await self._too_large().send(send)
                return
            if body is None:
                return  # the client left before it had sent the whole body
            receive = _replay(body, receive)
        await self.app(scope, receive, send)

    def _foreign(self, headers: dict[bytes, bytes], origin: str) -> Refusal | None:
        """A request not addressed to this machine's daemon (DNS rebinding), or from a foreign origin."""
        host = headers.get(b"host", b"").decode("latin-1")
        if self.check_host and not host_allowed(host, self.allowed_hosts):
            log.warning("refused request with Host %r (not on the loopback allowlist)", host)
            return Refusal(
                403,
                f"Host {host!r} is not allowed: this daemon only answers requests addressed to localhost "
                "(add the name to allowed_hosts to permit it)",
                ErrorType.PERMISSION,
            )
        if origin and not origin_allowed(origin, self.cors_origins):
            return Refusal(
                403,
                f"origin {origin!r} is not allowed (only localhost origins and configured cors_origins)",
                ErrorType.PERMISSION,
            )
        return None

    def _unauthorized(self, path: str, headers: dict[bytes, bytes]) -> Refusal | None:
        """A request without the token, on a route that needs it."""
        if self.api_key is None or path in PUBLIC_PATHS or token_valid(headers, self.api_key):
            return None
        return Refusal(
            401,
            "missing or invalid API key: send 'Authorization: Bearer <token>' (the token is in "
            f"{paths.token_file()}, or set with --api-key / DIFFU_API_KEY)",
            ErrorType.AUTHENTICATION,
            ((b"www-authenticate", b"Bearer"),),
            code="invalid_api_key",
        )

    def _declared_too_large(self, headers: dict[bytes, bytes]) -> Refusal | None:
        """A Content-Length past the limit (or not a number), refused before any of the body is read."""
        length = headers.get(b"content-length")
        if length is None:
            return None
        try:
            declared = int(length)
        except ValueError:
            return Refusal(400, "Content-Length is not a number", ErrorType.INVALID_REQUEST)
        return self._too_large() if declared > self.max_body_bytes else None

    async def _read_body(self, receive: Receive) -> bytes | None:
        """The whole body, read up to the limit (_TooLarge past it); None if the client disconnected."""
        body = bytearray()
        while True:
            chunk = await receive()
            if chunk["type"] == "http.disconnect":
                return None
            body += chunk.get("body", b"")
            if len(body) > self.max_body_bytes:
                raise _TooLarge
            if not chunk.get("more_body", False):
                return bytes(body)

    def _too_large(self) -> Refusal:
        return Refusal(
            413,
            f"request body too large (limit {self.max_body_bytes} bytes, max_body_bytes in the config)",
            ErrorType.INVALID_REQUEST,
        )


# What a CORS preflight from an allowed origin is told the daemon accepts.
_PREFLIGHT = (
    (b"access-control-allow-methods", b"GET, POST, OPTIONS"),
    (b"access-control-allow-headers", b"authorization, content-type"),
    (b"access-control-max-age", b"600"),
)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that yields the buffered body once, then passes through (to see the disconnect)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def _with_headers(send: Send, extra: list[tuple[bytes, bytes]]) -> Send:
    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = dict(message)
            message["headers"] = [*message.get("headers", []), *extra]
        await send(message)

    return wrapped
