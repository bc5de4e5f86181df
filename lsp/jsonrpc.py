"""JSON-RPC 2.0 and the LSP base protocol, strictly: every request gets exactly one answer.

pygls parses and dispatches well-formed traffic; what it does with malformed traffic is the business of
this module, which sits in front of it:

- framing (:class:`Framer`): ``Content-Length`` headers are read case-insensitively with CRLF or LF line
  ends; a header block without a usable length, garbage between messages, or a length that disagrees
  with the bytes sent is answered with -32700 and the stream re-synchronised at the next header, so a
  broken message never leaves the server deaf;
- the envelope (:func:`decode`, :func:`check`): invalid JSON is -32700, a message that is not a request,
  notification or response is -32600, and an ``id`` that is neither an integer nor a string (``1e999``,
  ``1.5``, ``null``, an object) is answered with a null id rather than echoed as something that is not
  JSON;
- the lifecycle (:class:`ConformantProtocol`): requests before ``initialize`` get -32002, a second
  ``initialize`` and any request after ``shutdown`` get -32600, ``exit`` ends the process with 0 after
  ``shutdown`` and 1 without it;
- parameters: params that do not match the method's LSP type are -32602 naming the field; an unknown
  method is -32601 (so is a notification's method sent as a request);
- no Python traceback ever reaches the client: internal errors are one line.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import threading
from dataclasses import dataclass
from typing import Any, BinaryIO

import attrs
from cattrs import transform_error
from cattrs.errors import ClassValidationError
from lsprotocol import types
from pygls.io_ import StdoutWriter
from pygls.protocol import JsonRPCNotification, JsonRPCRequestMessage, LanguageServerProtocol

log = logging.getLogger("diffu.lsp")

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
SERVER_NOT_INITIALIZED = -32002

MAX_HEADER_BYTES = 8192  # a header block longer than this is garbage, not a header
MAX_BODY_BYTES = 256 * 1024 * 1024
_HEADER_LINE = re.compile(rb"^([A-Za-z][A-Za-z0-9-]*)[ \t]*:[ \t]*(.*?)[ \t]*$")
_LENGTH_ANYWHERE = re.compile(rb"(?i)content-length[ \t]*:")
# A header inside what was taken for a body. Valid JSON can never hold it: raw line ends are not allowed
# inside JSON strings, and the name is not JSON outside them; so a match means the length was too large.
_HEADER_INSIDE = re.compile(rb"(?i)content-length[ \t]*:[ \t]*\d+[ \t]*\r?\n")
_CL = b"content-length:"
_BLOCK_END = re.compile(rb"\r?\n\r?\n")
_HEADER_START = re.compile(rb"^(?:[A-Za-z][A-Za-z0-9-]*[ \t]*(?::.*)?)?\r?$")


@dataclass(frozen=True)
class FrameError:
    """A framing problem; answered with -32700 and a null id (the message's id cannot be known)."""

    message: str


class Framer:
    """Split a byte stream into message bodies by their ``Content-Length`` headers, recovering from errors.

    ``feed`` takes whatever bytes arrived and returns the bodies (``bytes``) and framing errors
    (:class:`FrameError`) they complete, in order. It is pure: no I/O, no clock.
    """

    def __init__(self) -> None:
        self._buf = bytearray()
        self._length: int | None = None  # the body length being waited for, after its headers
        self._unreadable: FrameError | None = None  # the body being waited for is dropped with this error
        self._skipping = False  # dropping garbage until the next header

    def feed(self, data: bytes) -> list[bytes | FrameError]:
        self._buf += data
        out: list[bytes | FrameError] = []
        while (item := self._next()) is not None:
            out.append(item)
        return out

    def _next(self) -> bytes | FrameError | None:
        if self._length is not None:
            return self._body(self._length)
        if self._skipping and not self._drop_garbage(0):
            return None
        if not self._buf.strip():
            self._buf.clear()  # blank lines between messages are harmless
            return None
        end = _BLOCK_END.search(self._buf)
        if end is None:
            # Wait for the rest of the header, unless what is here can never become one.
            if len(self._buf) > MAX_HEADER_BYTES or not _header_prefix(self._buf):
                return self._skip_garbage()
            return None
        block = bytes(self._buf[: end.start()])
        lines = block.replace(b"\r\n", b"\n").split(b"\n")
        matches = [_HEADER_LINE.match(line) for line in lines]
        if not all(matches):
            return self._skip_garbage()
        del self._buf[: end.end()]
        headers = [m.groups() for m in matches if m is not None]
        lengths = {value for name, value in headers if name.lower() == b"content-length"}
        if not lengths:
            return FrameError("a message header without Content-Length")
        if len(lengths) > 1:
            return FrameError("a message header with conflicting Content-Length values")
        value = lengths.pop()
        if not value.isdigit() or int(value) > MAX_BODY_BYTES:
            return FrameError(f"Content-Length must be a byte count up to {MAX_BODY_BYTES}, got {value!r}")
        kinds = [v for name, v in headers if name.lower() == b"content-type" and not _utf8(v)]
        if kinds:
            # The length is right, so the body can be skipped cleanly; its text cannot be read.
            self._unreadable = FrameError(
                f"unsupported Content-Type {kinds[0].decode('latin-1')!r} (utf-8 only)"
            )
        self._length = int(value)
        return self._body(self._length)

    def _body(self, length: int) -> bytes | FrameError | None:
        inside = _HEADER_INSIDE.search(self._buf, 0, length + 64)
        if inside is not None and inside.start() < length:
            length = inside.start()  # the declared length ran into the next message
        if len(self._buf) < length:
            return None
        body = bytes(self._buf[:length])
        del self._buf[:length]
        self._length = None
        error, self._unreadable = self._unreadable, None
        return error or body

    def _skip_garbage(self) -> FrameError:
        """Start dropping bytes up to the next ``Content-Length`` header: one error per run of garbage."""
        self._skipping = True
        self._drop_garbage(1)
        return FrameError("bytes that are not a message header were skipped")

    def _drop_garbage(self, start: int) -> bool:
        """Drop garbage before the next header (True if one was found), keeping a tail that may start one."""
        found = _LENGTH_ANYWHERE.search(self._buf, start)
        if found is not None:
            del self._buf[: found.start()]
            self._skipping = False
            return True
        ends = range(min(len(self._buf), len(_CL)), 0, -1)
        tail = next((k for k in ends if _CL.startswith(bytes(self._buf[-k:]).lower())), 0)
        del self._buf[: len(self._buf) - tail]
        return False


def _header_prefix(data: bytearray) -> bool:
    """Whether ``data`` (no blank line yet) can still become a header block."""
    *complete, partial = bytes(data).replace(b"\r\n", b"\n").split(b"\n")
    return all(_HEADER_LINE.match(line) for line in complete) and bool(_HEADER_START.match(partial))


def _utf8(content_type: bytes) -> bool:
    charset = re.search(rb"(?i)charset\s*=\s*\"?([A-Za-z0-9_-]+)", content_type)
    return charset is None or charset.group(1).lower() in (b"utf-8", b"utf8")


@dataclass(frozen=True)
class Rejected:
    """A message answered with an error before pygls sees it; ``id`` None is sent as JSON null."""

    code: int
    message: str
    id: int | str | None = None
    answer: bool = True  # False for a notification: it is only logged


@dataclass(frozen=True)
class Message:
    """A well-formed message: kind "request", "notification" or "response"."""

    kind: str
    data: dict[str, Any]

    @property
    def id(self) -> int | str:
        return self.data["id"]

    @property
    def method(self) -> str:
        return self.data.get("method", "")


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def decode(body: bytes) -> Any | Rejected:
    """The body as JSON (NaN and Infinity refused), or a -32700 rejection."""
    try:
        return json.loads(body.decode("utf-8"), parse_constant=_no_constants)
    except UnicodeDecodeError as exc:
        return Rejected(PARSE_ERROR, f"Parse error: the body is not UTF-8 ({exc.reason} at byte {exc.start})")
    except RecursionError:
        return Rejected(PARSE_ERROR, "Parse error: the JSON is nested too deeply")
    except ValueError as exc:
        return Rejected(PARSE_ERROR, f"Parse error: {exc}")


def _valid_id(value: Any) -> bool:
    return (isinstance(value, int) and not isinstance(value, bool)) or isinstance(value, str)


def check(data: Any) -> Message | Rejected:
    """Classify a decoded message, or say what makes it invalid (JSON-RPC 2.0 section 4 and 5)."""
    if isinstance(data, list):
        return Rejected(INVALID_REQUEST, "Invalid Request: batches are not part of the LSP base protocol")
    if not isinstance(data, dict):
        return Rejected(INVALID_REQUEST, f"Invalid Request: expected an object, got {type(data).__name__}")
    has_id = "id" in data
    msg_id = data.get("id") if has_id and _valid_id(data.get("id")) else None
    if has_id and msg_id is None:
        return Rejected(
            INVALID_REQUEST, f"Invalid Request: id must be an integer or a string, got {data['id']!r}"
        )
    if data.get("jsonrpc") != "2.0":
        return Rejected(INVALID_REQUEST, 'Invalid Request: "jsonrpc" must be "2.0"', msg_id)
    if "method" not in data:
        if has_id and ("result" in data) != ("error" in data):
            return Message("response", data)
        return Rejected(INVALID_REQUEST, "Invalid Request: no method (and not a response)", msg_id)
    method = data["method"]
    if not isinstance(method, str) or not method:
        return Rejected(INVALID_REQUEST, "Invalid Request: method must be a non-empty string", msg_id)
    params = data.get("params")
    if "params" in data and not isinstance(params, dict | list):
        return Rejected(
            INVALID_REQUEST, "Invalid Request: params must be an object or an array", msg_id, answer=has_id
        )
    return Message("request" if has_id else "notification", data)


def _summary(exc: Exception) -> str:
    """cattrs' validation error as a short list of what is wrong where (no traceback)."""
    if isinstance(exc, ClassValidationError):
        problems = [p.replace("$.", "").replace("$", "params") for p in transform_error(exc)]
        return "; ".join(problems[:3]) + (f" (and {len(problems) - 3} more)" if len(problems) > 3 else "")
    return f"{type(exc).__name__}: {exc}"


class ConformantProtocol(LanguageServerProtocol):
    """pygls' protocol behind the checks above; :func:`serve` feeds it raw message bodies."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.initialize_received = False
        self.shutdown_received = False
        self.exit_code: int | None = None  # set by ``exit``: the loop stops and the process ends with it
        self.exited = asyncio.Event()

    # -- input -----------------------------------------------------------------------------------------
    def handle_frame(self, frame: bytes | FrameError) -> None:
        if isinstance(frame, FrameError):
            self._reject(Rejected(PARSE_ERROR, f"Parse error: {frame.message}"))
            return
        data = decode(frame)
        checked = data if isinstance(data, Rejected) else check(data)
        if isinstance(checked, Rejected):
            self._reject(checked)
            return
        gate = self._gate(checked)
        if gate is not None:
            self._reject(gate)
            return
        if checked.kind == "response":
            self.handle_message(self._structure_response(checked.data))
            return
        structured = self._structure(checked)
        if isinstance(structured, Rejected):
            self._reject(structured)
            return
        if checked.method == types.INITIALIZE:
            self.initialize_received = True
        elif checked.method == types.SHUTDOWN:
            self.shutdown_received = True
        if len(self._request_futures) > 64:
            self._forget_finished()
        try:
            self.handle_message(structured)
        except Exception as exc:  # a bug in dispatching one message must not end the server
            log.exception("could not handle %s", checked.method)
            if checked.kind == "request":
                self._reject(
                    Rejected(INTERNAL_ERROR, f"Internal error: {type(exc).__name__}: {exc}", checked.id)
                )

    def _forget_finished(self) -> None:
        """Drop the futures of finished handlers.

        pygls keeps the future of every handler run under an id, and only a request's answer removes it:
        notifications (a ``didChange`` per keystroke) and the steps of its built-in handlers would pile
        up for the life of the process.
        """
        self._request_futures = {k: f for k, f in self._request_futures.items() if not f.done()}

    def _gate(self, msg: Message) -> Rejected | None:
        """The lifecycle rules of the LSP specification ("Server lifecycle")."""
        if msg.kind == "response":
            return None
        method = msg.method
        if msg.kind == "notification":
            if method == types.EXIT:
                self.exit_code = 0 if self.shutdown_received else 1
                self.exited.set()
                return Rejected(0, "exit", answer=False)
            if not self.initialize_received or self.shutdown_received:
                why = "before initialize" if not self.initialize_received else "after shutdown"
                return Rejected(0, f"notification {method!r} {why} dropped", answer=False)
            return None
        if method == types.INITIALIZE:
            if self.initialize_received:
                return Rejected(INVALID_REQUEST, "Invalid Request: initialize may be sent only once", msg.id)
            return None
        if not self.initialize_received:
            return Rejected(
                SERVER_NOT_INITIALIZED, f"Server not initialized: {method!r} before initialize", msg.id
            )
        if self.shutdown_received:
            return Rejected(INVALID_REQUEST, f"Invalid Request: {method!r} after shutdown", msg.id)
        if method.startswith("$/"):
            # The specification: a request starting with "$/" that is not understood is MethodNotFound.
            return Rejected(METHOD_NOT_FOUND, f"Method not found: {method}", msg.id)
        return None

    def _structure(self, msg: Message) -> Any | Rejected:
        """The message as pygls' typed object; params that do not fit the method's type are -32602."""
        request = msg.kind == "request"
        cls = self.get_message_type(msg.method)
        if cls is not None and request != ("id" in attrs.fields_dict(cls)):
            if request:
                return Rejected(METHOD_NOT_FOUND, f"Method not found: {msg.method} is a notification", msg.id)
            return Rejected(0, f"{msg.method} is a request, sent as a notification", answer=False)
        data = msg.data
        if cls is None:
            known = msg.method in self.fm.features or msg.method in self.fm.builtin_features
            if request and not known:
                return Rejected(METHOD_NOT_FOUND, f"Method not found: {msg.method}", msg.id)
            cls = JsonRPCRequestMessage if request else JsonRPCNotification
            data = {"params": None, **data}
        try:
            structured = self._converter.structure(data, cls)
            if msg.method == types.CANCEL_REQUEST and not _valid_id(structured.params.id):
                raise ValueError(f"id must be an integer or a string, got {structured.params.id!r}"[:120])
            return structured
        except Exception as exc:
            return Rejected(
                INVALID_PARAMS,
                f"Invalid params for {msg.method}: {_summary(exc)}",
                msg.id if request else None,
                answer=request,
            )

    def _structure_response(self, data: dict[str, Any]) -> Any:
        try:
            return self.structure_message(data)
        except Exception:  # a client's reply we cannot read: its waiter sees the error instead
            log.warning("unreadable response to request %r from the client", data.get("id"))
            return self.structure_message(
                {"jsonrpc": "2.0", "id": data["id"], "error": {"code": PARSE_ERROR, "message": "unreadable"}}
            )

    # -- output ----------------------------------------------------------------------------------------
    def _reject(self, rejected: Rejected) -> None:
        if not rejected.answer:
            if rejected.code:
                log.warning("%s", rejected.message)
            return
        log.warning("answered %d: %s", rejected.code, rejected.message)
        self._send_data(
            {
                "jsonrpc": "2.0",
                "id": rejected.id,
                "error": {"code": rejected.code, "message": rejected.message},
            }
        )

    def _send_response(
        self, msg_id: Any, result: Any | None = None, error: types.ResponseError | None = None
    ) -> None:
        if error is not None and error.data is not None:
            # pygls attaches the Python traceback of an internal error; that stays in our log.
            log.error("request %r failed: %s %s", msg_id, error.message, error.data)
            error = types.ResponseError(code=error.code, message=error.message)
        super()._send_response(msg_id, result, error)


def serve(protocol: ConformantProtocol, stdin: BinaryIO, stdout: BinaryIO) -> int:
    """Serve over a pair of byte streams until ``exit`` (or the input ends); returns the exit code."""
    protocol.set_writer(StdoutWriter(stdout))
    return asyncio.run(_serve(protocol, stdin))


async def _serve(protocol: ConformantProtocol, stdin: BinaryIO) -> int:
    loop = asyncio.get_running_loop()
    chunks: asyncio.Queue[bytes] = asyncio.Queue()

    try:
        fd: int | None = stdin.fileno()
    except (OSError, ValueError, AttributeError):  # an in-memory stream (tests)
        fd = None

    def read() -> None:
        # A daemon thread: a blocked read never holds the process open after exit. It reads the file
        # descriptor itself, so it holds no lock of the buffered stream the interpreter needs at exit.
        while True:
            try:
                data = os.read(fd, 65536) if fd is not None else stdin.read(65536)
            except (OSError, ValueError):
                data = b""
            loop.call_soon_threadsafe(chunks.put_nowait, data)
            if not data:
                return

    threading.Thread(target=read, name="lsp-stdin", daemon=True).start()
    framer = Framer()
    exited = asyncio.ensure_future(protocol.exited.wait())
    try:
        while protocol.exit_code is None:
            chunk = asyncio.ensure_future(chunks.get())
            await asyncio.wait({chunk, exited}, return_when=asyncio.FIRST_COMPLETED)
            if not chunk.done():
                chunk.cancel()
                break
            data = chunk.result()
            if not data:
                # The editor closed the pipe: a clean end only if it asked for shutdown first.
                return 0 if protocol.shutdown_received else 1
            for frame in framer.feed(data):
                protocol.handle_frame(frame)
                if protocol.exit_code is not None:
                    break
    except BrokenPipeError:
        log.error("the editor closed the connection")
        return 1
    finally:
        exited.cancel()
    return protocol.exit_code if protocol.exit_code is not None else 1
