"""Finding A of the editors issue (#34): documents whose URI carries percent-escapes.

Editors escape what a URI cannot hold raw: a space (``my%20file.py``), any non-ASCII character
(``caf%C3%A9.py``), and on Windows VS Code even the drive letter's colon (``file:///c%3A/...``). pygls keeps
open documents under the unescaped URI; a lookup with the URI as sent found nothing, so such files got no
suggestion (answered empty and counted stale) and fill-holes refused them as "not an open document".
"""

from __future__ import annotations

from pathlib import Path

import pytest
from lsprotocol import types

from tests.lsp.conftest import Session

pytestmark = pytest.mark.asyncio

TEXT = "def total(items):\n    result = 0\n    for x in items:\n        result = \n    return ???\n"


def _uri(root: Path, kind: str) -> str:
    if kind == "space":
        uri = (root / "ws" / "my file.py").as_uri()
        assert uri.endswith("/my%20file.py")
    elif kind == "non-ascii":
        uri = (root / "ws" / "café.py").as_uri()
        assert uri.endswith("/caf%C3%A9.py")
    else:
        uri = "file:///c%3A/proj/a.py"  # how VS Code on Windows sends every file
    return uri


async def _suggestion_and_fills(session: Session, uri: str) -> None:
    inline = await session.inline(uri, 3, 17, invoked=True)
    assert inline.items and inline.items[0].insert_text.strip()
    assert inline.items[0].range.start == types.Position(3, 17)
    edit = await session.command("diffu.fillHoles", uri)
    assert edit is not None, session.logs()
    (fill,) = edit["changes"][uri]  # keyed by the URI the editor sent, escapes and all
    assert fill["range"]["start"] == {"line": 4, "character": 11} and fill["newText"].strip()
    assert session.applied_edits and list(session.applied_edits[-1].changes) == [uri]
    actions = await session.client.text_document_code_action_async(
        types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            range=types.Range(types.Position(0, 0), types.Position(0, 0)),
            context=types.CodeActionContext(diagnostics=[]),
        )
    )
    assert actions and actions[0].title == "Fill 1 hole in this file with diffu"
    resolved = await session.client.code_action_resolve_async(actions[0])
    assert resolved.edit is not None and resolved.edit.changes and list(resolved.edit.changes) == [uri]


@pytest.mark.parametrize("kind", ["space", "non-ascii", "windows-drive"])
async def test_escaped_uris_get_suggestions_and_fills(lsp, fake_daemon, kind: str) -> None:
    session = await lsp("neovim-0.12", daemon=fake_daemon)
    uri = _uri(session.root, kind)
    session.open("", TEXT, uri=uri)
    await _suggestion_and_fills(session, uri)
    counters = (await session.status())["counters"]
    assert counters["stale"] == 0 and counters["errors"] == 0 and counters["answered"] == 1
    assert not session.logs(types.MessageType.Error)


async def test_a_request_may_escape_the_uri_differently_from_didopen(lsp, fake_daemon) -> None:
    """One document, whatever escaping each message uses (``%3a`` and ``%3A``, a raw space or ``%20``)."""
    session = await lsp("neovim-0.12", daemon=fake_daemon)
    session.open("", TEXT, uri="file:///c%3a/proj/my%20file.py")
    inline = await session.inline("file:///c%3A/proj/my file.py", 3, 17, invoked=True)
    assert inline.items
    edit = await session.command("diffu.fillHoles", "file:///c:/proj/my%20file.py")
    # The edit names the document as the editor opened it: that is the URI it knows.
    assert edit is not None and list(edit["changes"]) == ["file:///c%3a/proj/my%20file.py"]
