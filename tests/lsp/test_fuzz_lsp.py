"""A seeded fuzz of ``diffu lsp`` over stdio: 300 malformed messages, each answered as specified.

Malformed params for every request the server handles, broken envelopes, ids and framings, malformed
notifications and stray responses (``tests/lsp/fuzz.py``): every request with an id gets exactly one
response, errors carry a code the specification names and no traceback, unreadable messages get a null
id, and the server keeps answering a normal request throughout. ``scripts/fuzz_lsp.py`` runs the same
generator for thousands of messages.
"""

from __future__ import annotations

from pathlib import Path

from tests.lsp.fuzz import PING, check, malformed_messages
from tests.lsp.rawclient import RawServer

COUNT = 300
SOURCE = "def total(items):\n    result = ???\n    return result\n"


def test_fuzz_lsp(tmp_path: Path) -> None:
    server = RawServer(tmp_path / "fuzz")
    try:
        server.initialize()
        uri = (tmp_path / "fuzz" / "a.py").as_uri()
        doc = {"uri": uri, "languageId": "python", "version": 1, "text": SOURCE}
        server.notify("textDocument/didOpen", {"textDocument": doc})
        cases = list(malformed_messages(seed=21, count=COUNT, uri=uri))
        for i, case in enumerate(cases):
            server.send(case.data)
            if i % 50 == 49:  # still answering, and the cases so far are behind this request
                assert "result" in server.request(f"ping-{i}", "workspace/executeCommand", PING)
        assert "result" in server.request("ping-end", "workspace/executeCommand", PING)
        # A well-formed completion among the cases may still be running (the server answers the pings
        # meanwhile, as it should): wait for every expected answer before judging them.
        expected = {c.id for c in cases if c.id is not None}
        server.wait(lambda: expected <= {r.get("id") for r in server.responses()}, 60, "every answer")
        responses = [r for r in server.responses() if not str(r.get("id")).startswith("ping-")]
        report = check(cases, responses, bytes(server.raw))
        assert not report.problems, report.problems[:10]
        assert not server.violations, server.violations[:5]
        assert server.proc.poll() is None
        # The seeded mix covers every kind of case, and the answers include each specified error.
        assert set(report.cases) == {
            "params",
            "notification",
            "json",
            "envelope",
            "id",
            "method",
            "frame",
            "response",
        }
        assert {"-32700", "-32600", "-32601", "-32602"} <= set(report.answers), report.answers
    finally:
        server.close()
