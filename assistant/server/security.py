"""The daemon's front door: API token, Host allowlist (DNS rebinding), CORS, request body limit, and
the connection slots that idle sockets cannot exhaust for clients with the token.

One pure-ASGI middleware applies, in order: the Host check on loopback binds (403), the Origin check and
CORS preflight (403 for foreign browser origins), the Bearer token on every route but ``/health`` (401),
and the body size limit (413). It reads the whole body up front (bounded by the limit) and replays it to
the app, so the app never sees an oversized body and can still wait for the client's disconnect.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import os
import re
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

from assistant import paths
from assistant.errors import UsageError

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


# -- the token ----------------------------------------------------------------------------------------
def load_or_create_token(path: Path | None = None) -> str:
    """The API token in ``path`` (the config dir's ``token``), created with mode 0600 on first use."""
    path = path or paths.token_file()
    paths.ensure_private_dir(path.parent)
    try:
        # O_EXCL: two daemons starting at once must not overwrite each other's token.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return read_token(path) or _replace_empty_token(path)
    token = secrets.token_urlsafe(32)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    log.info("created API token in %s", path)
    return token


def _replace_empty_token(path: Path) -> str:
    token = secrets.token_urlsafe(32)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    os.replace(tmp, path)
    return token


def read_token(path: Path | None = None) -> str | None:
    """The stored token, or None when there is none yet. Tightens a token file others can read."""
    path = path or paths.token_file()
    try:
        mode = path.stat().st_mode
        text = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:  # a directory there, a file we may not read, binary junk
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise UsageError(
            f"cannot read the API token {path} ({reason}); remove it to have a new one made, or set "
            "--api-key / DIFFU_API_KEY"
        ) from None
    if mode & 0o077:
        log.warning("token file %s was readable by others; setting its mode to 0600", path)
        os.chmod(path, 0o600)
    return text or None


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
async def send_json_error(
    send: Send,
    status: int,
    message: str,
    kind: str,
    headers: list[tuple[bytes, bytes]] | None = None,
    code: str | None = None,
) -> None:
    """An OpenAI-shaped error response, sent straight through ASGI."""
    body = json.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


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
        host = headers.get(b"host", b"").decode("latin-1")
        if self.check_host and not host_allowed(host, self.allowed_hosts):
            log.warning("refused request with Host %r (not on the loopback allowlist)", host)
            await send_json_error(
                send,
                403,
                f"Host {host!r} is not allowed: this daemon only answers "
                "requests addressed to localhost (add the name to allowed_hosts to permit "
                "it)",
                "permission_error",
            )
            return
        origin = headers.get(b"origin", b"").decode("latin-1")
        cors: list[tuple[bytes, bytes]] = []
        if origin:
            if not origin_allowed(origin, self.cors_origins):
                await send_json_error(
                    send,
                    403,
                    f"origin {origin!r} is not allowed (only localhost origins and configured cors_origins)",
                    "permission_error",
                )
                return
            cors = [(b"access-control-allow-origin", origin.encode("latin-1")), (b"vary", b"Origin")]
            if scope["method"] == "OPTIONS" and b"access-control-request-method" in headers:
                await send(
                    {
                        "type": "http.response.start",
                        "status": 204,
                        "headers": [
                            *cors,
                            (b"access-control-allow-methods", b"GET, POST, OPTIONS"),
                            (b"access-control-allow-headers", b"authorization, content-type"),
                            (b"access-control-max-age", b"600"),
                            (b"content-length", b"0"),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": b""})
                return
        if cors:
            send = _with_headers(send, cors)
        if self.api_key is not None and scope["path"] not in PUBLIC_PATHS:
            if not token_valid(headers, self.api_key):
                message = (
                    "missing or invalid API key: send 'Authorization: Bearer <token>' (the token is "
                    f"in {paths.token_file()}, or set with --api-key / DIFFU_API_KEY)"
                )
                await send_json_error(
                    send,
                    401,
                    message,
                    "authentication_error",
                    [(b"www-authenticate", b"Bearer")],
                    code="invalid_api_key",
                )
                return
        length = headers.get(b"content-length")
        if length is not None:
            try:
                declared = int(length)
            except ValueError:
                await send_json_error(send, 400, "Content-Length is not a number", "invalid_request_error")
                return
            if declared > self.max_body_bytes:
                await self._too_large(send)
                return
        if scope["method"] in ("POST", "PUT", "PATCH"):
            body = bytearray()
            while True:
                chunk = await receive()
                if chunk["type"] == "http.disconnect":
                    return
                body += chunk.get("body", b"")
                if len(body) > self.max_body_bytes:
                    await self._too_large(send)
                    return
                if not chunk.get("more_body", False):
                    break
            receive = _replay(bytes(body), receive)
        await self.app(scope, receive, send)

    async def _too_large(self, send: Send) -> None:
        await send_json_error(
            send,
            413,
            f"request body too large (limit {self.max_body_bytes} bytes, max_body_bytes in the config)",
            "invalid_request_error",
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
