"""JSON-RPC 2.0 and LSP base-protocol conformance of ``diffu lsp`` (finding 6 of the editors issue).

Units for the framer and the envelope checks, then a real ``diffu lsp`` process driven byte by byte: the
answers the specification asks for, no traceback in any answer, and a server that keeps answering after
every kind of malformed input.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lsp.jsonrpc import FrameError, Framer, Message, Rejected, check, decode
from tests.lsp.rawclient import RawServer, frame

OK = b'{"jsonrpc":"2.0","id":1,"method":"x"}'


# -- units --------------------------------------------------------------------------------------------
BROKEN_HEADERS = {
    "no Content-Length": b"Content-Type: application/json\r\n\r\n" + OK,
    "not a number": b"Content-Length: abc\r\n\r\n" + OK,
    "negative": b"Content-Length: -5\r\n\r\n" + OK,
    "too small": b"Content-Length: 10\r\n\r\n" + OK,
    "conflicting": b"Content-Length: 3\r\nContent-Length: 4\r\n\r\n" + OK,
    "garbage line": b"hello world\r\n",
    "body without header": OK,
    "other charset": b"Content-Length: %d\r\nContent-Type: text/x; charset=latin-1\r\n\r\n" % len(OK) + OK,
}
TOLERATED_HEADERS = {
    "LF line ends": b"Content-Length: %d\n\n" % len(OK) + OK,
    "lower case, no space": b"content-length:%d\r\n\r\n" % len(OK) + OK,
    "extra header": b"Content-Length: %d\r\nX-Thing: 1\r\n\r\n" % len(OK) + OK,
}


@pytest.mark.parametrize("name", sorted(BROKEN_HEADERS))
def test_framer_recovers_from_broken_headers(name: str) -> None:
    """One or more framing errors, then the next message arrives intact, whatever the read sizes."""
    data = BROKEN_HEADERS[name] + frame(OK)
    for step in (1, 7, len(data)):
        framer = Framer()
        out = [item for i in range(0, len(data), step) for item in framer.feed(data[i : i + step])]
        assert out[-1] == OK, (name, step, out)
        assert all(isinstance(o, FrameError) or o != OK for o in out[:-1])
        assert any(isinstance(o, FrameError) for o in out[:-1]) or name == "too small"


@pytest.mark.parametrize("name", sorted(TOLERATED_HEADERS))
def test_framer_tolerates_header_variants(name: str) -> None:
    assert Framer().feed(TOLERATED_HEADERS[name] + frame(OK)) == [OK, OK]


def test_framer_cuts_a_too_large_length_at_the_next_header() -> None:
    """A Content-Length beyond the body would swallow the next message; the next header ends it instead."""
    assert Framer().feed(b"Content-Length: 500\r\n\r\n" + OK + frame(OK)) == [OK, OK]


def test_decode_and_check() -> None:
    assert isinstance(decode(b'{"a": NaN}'), Rejected) and decode(b'{"a": NaN}').code == -32700
    assert decode(b"\xff").code == -32700  # type: ignore[union-attr]
    assert decode(b"[" * 100_000).code == -32700  # type: ignore[union-attr]
    assert check(json.loads('{"jsonrpc":"2.0","id":1e999,"method":"x"}')) == Rejected(
        -32600, "Invalid Request: id must be an integer or a string, got inf"
    )
    assert check([1]).code == -32600 and check(3).code == -32600  # type: ignore[union-attr]
    assert check({"jsonrpc": "1.0", "id": 7, "method": "x"}).id == 7  # type: ignore[union-attr]
    assert check({"jsonrpc": "2.0", "id": 1, "result": None}) == Message(
        "response", {"jsonrpc": "2.0", "id": 1, "result": None}
    )
    assert check({"jsonrpc": "2.0", "method": "n", "params": 3}).answer is False  # type: ignore[union-attr]
    assert check({"jsonrpc": "2.0", "id": "a", "method": "m", "params": "x"}).code == -32600  # type: ignore[union-attr]


# -- a real server ------------------------------------------------------------------------------------
@pytest.fixture
def server(tmp_path: Path):
    raw = RawServer(tmp_path / "raw")
    yield raw
    raw.close()


def _error(response: dict, code: int) -> str:
    assert "result" not in response and response["error"]["code"] == code, response
    assert set(response["error"]) == {"code", "message"}, response  # no data: no traceback
    assert "Traceback" not in response["error"]["message"]
    return response["error"]["message"]


def test_lifecycle(server: RawServer) -> None:
    """-32002 before initialize (shutdown too, which must not stop a later initialize), one initialize,
    -32600 after shutdown, and exit code 0 after shutdown."""
    hover = {"textDocument": {"uri": "file:///x.py"}, "position": {"line": 0, "character": 0}}
    assert "before initialize" in _error(server.request(1, "textDocument/inlineCompletion", hover), -32002)
    _error(server.request(2, "shutdown"), -32002)
    server.notify("textDocument/didOpen", {"textDocument": {"uri": "file:///x.py"}})  # dropped
    assert "capabilities" in server.initialize(3)["result"]
    assert "only once" in _error(server.initialize(4), -32600)
    assert server.request(5, "shutdown") == {"jsonrpc": "2.0", "id": 5, "result": None}
    assert "after shutdown" in _error(
        server.request(6, "workspace/executeCommand", {"command": "diffu.status"}), -32600
    )
    server.notify("exit")
    assert server.exit_code() == 0
    assert not server.violations
    # Nothing above deserved a popup (the one about the daemon is about the daemon: there is none here).
    assert all("daemon" in m["params"]["message"] for m in server.notifications("window/showMessage"))


def test_exit_without_shutdown_exits_1(server: RawServer) -> None:
    server.initialize()
    server.notify("exit")
    assert server.exit_code() == 1


def test_malformed_messages_get_the_specified_errors(server: RawServer) -> None:
    server.initialize()
    server.send(frame(b'{"jsonrpc": "2.0", "id": 1, "method": '))  # truncated JSON
    assert "Parse error" in _error(server.wait(lambda: server.responses(None), what="-32700")[0], -32700)
    server.send(frame(b'{"jsonrpc":"2.0","id":1e999,"method":"shutdown"}'))
    server.send(frame(b'{"jsonrpc":"2.0","id":7,"method":"textDocument/inlineCompletion","params":"x"}'))
    _error(server.response(7), -32600)
    # The 1e999 id is answered with null (echoing it would print Infinity, which is not JSON).
    assert [r["error"]["code"] for r in server.responses(None)] == [-32700, -32600]
    assert "Method not found" in _error(server.request(8, "no/such/method"), -32601)
    _error(server.request(9, "$/custom"), -32601)
    _error(server.request(10, "textDocument/didSave", {"textDocument": {"uri": "file:///x"}}), -32601)
    bad_position = {"textDocument": {"uri": "file:///x.py"}, "position": {"line": "zero", "character": 0}}
    assert "position" in _error(server.request(11, "textDocument/completion", bad_position), -32602)
    unopened = {"textDocument": {"uri": "file:///never/opened.py"}, "position": {"line": 0, "character": 0}}
    assert "not an open document" in _error(server.request(12, "textDocument/completion", unopened), -32602)
    server.notify("no/such/notification", {})  # ignored, as the specification says
    assert server.request(13, "shutdown")["result"] is None
    assert not server.violations and "Traceback" not in server.raw.decode(errors="replace")
    assert all("daemon" in m["params"]["message"] for m in server.notifications("window/showMessage"))


def test_broken_headers_never_leave_the_server_deaf(server: RawServer) -> None:
    """After each of the broken framings, the next well-formed request is answered."""
    server.initialize()
    for i, name in enumerate(sorted(BROKEN_HEADERS)):
        server.send(BROKEN_HEADERS[name])
        response = server.request(100 + i, "workspace/executeCommand", {"command": "diffu.status"})
        assert "result" in response, (name, response)
    nulls = server.responses(None)
    assert nulls and all(r["error"]["code"] in (-32700, -32600) for r in nulls)
    assert not server.violations


@pytest.mark.asyncio
async def test_notifications_leave_nothing_behind() -> None:
    """pygls keeps a future per handler run and only a request's answer removes it; a didChange per
    keystroke must not pile up for the life of the server."""
    import asyncio

    from lsprotocol import types
    from pygls.lsp.server import LanguageServer

    from lsp.jsonrpc import ConformantProtocol

    server = LanguageServer("t", "1", protocol_cls=ConformantProtocol)
    sent: list[bytes] = []

    @server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
    async def changed(ls: LanguageServer, params: types.DidChangeTextDocumentParams) -> None:
        await asyncio.sleep(0)

    class Sink:
        def write(self, data: bytes) -> None:
            sent.append(data)

        def close(self) -> None:
            pass

    protocol = server.protocol
    protocol.set_writer(Sink())
    framer = Framer()
    uri = "file:///t/a.py"
    messages = [
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {"processId": None, "capabilities": {}},
        },
        {"jsonrpc": "2.0", "method": "initialized", "params": {}},
        {
            "jsonrpc": "2.0",
            "method": "textDocument/didOpen",
            "params": {"textDocument": {"uri": uri, "languageId": "python", "version": 1, "text": ""}},
        },
    ]
    change = {
        "range": {"start": {"line": 0, "character": 0}, "end": {"line": 0, "character": 0}},
        "text": "x",
    }
    for version in range(2, 202):
        params = {"textDocument": {"uri": uri, "version": version}, "contentChanges": [change]}
        messages.append({"jsonrpc": "2.0", "method": "textDocument/didChange", "params": params})
    for message in messages:
        for body in framer.feed(frame(message)):
            protocol.handle_frame(body)
        await asyncio.sleep(0)
    await asyncio.sleep(0.05)
    assert protocol.workspace.get_text_document(uri).source == "x" * 200
    assert len(protocol._request_futures) <= 65  # pygls' own bookkeeping (one per handler run) stays bounded
