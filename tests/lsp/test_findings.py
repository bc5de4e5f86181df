"""The numbered findings of the editors issue, each through a real ``diffu lsp`` and a fake-model daemon.

1 stale suggestions, 2 indentation, 3 client-only settings, 4 holes outside a selection, 5 one request
per editor, 7 latency in the status (6, JSON-RPC conformance, is test_jsonrpc.py and test_fuzz_lsp.py),
and what users of other assistants expect: several candidates when invoked, no automatic request in
the middle of a line, a status item, recent edits as context.
"""

from __future__ import annotations

import asyncio

import pytest
from lsprotocol import types

from tests.lsp.conftest import daemon_counter, daemon_running, wait_for

pytestmark = pytest.mark.asyncio

SOURCE = (
    "import os\n\n\ndef total(items):\n    result = 0\n    for x in items:\n        result = \n"
    "    return result\n"
)


# -- 1: stale ghost text ------------------------------------------------------------------------------
async def test_nothing_to_show_is_an_empty_list_never_null(lsp, fake_daemon) -> None:
    """``null`` left Neovim showing the previous suggestion; an empty list makes it hide it."""
    session = await lsp("neovim-0.12", daemon=fake_daemon)
    uri = session.open("a.py", "value = compute(first_argument, second)\n")
    result = await session.inline(uri, 0, 16)  # typing, with 22 characters of code after the cursor
    assert isinstance(result, types.InlineCompletionList) and result.items == ()
    assert not (await session.status())["timings"]  # not worth a model call
    assert (await session.inline(uri, 0, 16, invoked=True)).items  # asked for: it is made
    status = await session.status()
    assert status["counters"]["skipped"] == 1


async def test_an_answer_for_changed_text_is_dropped(lsp, fake_daemon) -> None:
    """A suggestion computed before a didChange would be shown with the old text and range."""
    session = await lsp("neovim-0.12", daemon=fake_daemon, settings={"steps": 40})  # 40 x 20 ms
    uri = session.open("total.py", SOURCE)
    request = asyncio.ensure_future(session.inline(uri, 6, 17, invoked=True))
    await wait_for(lambda: daemon_running(fake_daemon) >= 1, what="the job to run")
    session.insert(uri, 0, 0, "# edited\n")  # the user goes on typing elsewhere; no new request
    assert (await request).items == ()
    assert (await session.status())["counters"]["stale"] == 1


# -- 2: indentation -----------------------------------------------------------------------------------
@pytest.mark.parametrize("newline", ["\n", "\r\n"])
async def test_blank_line_suggestion_starts_at_the_cursor_column(lsp, fake_daemon, newline: str) -> None:
    session = await lsp("neovim-0.12", daemon=fake_daemon)
    text = newline.join(
        ["class A:", "    def f(self):", "        if self:", "            ", "        return 1", ""]
    )
    uri = session.open("a.py", text)
    result = await session.inline(uri, 3, 12, invoked=True)
    assert result.items
    for item in result.items:
        assert item.range.start == item.range.end == types.Position(3, 12)
        assert item.insert_text[:1].strip(), repr(item.insert_text)  # no indentation of its own
    timing = (await session.status())["timings"][-1]
    assert timing["mode"] == "block"  # after "if self:", the body


# -- 3: client-only settings --------------------------------------------------------------------------
async def test_client_only_settings_are_not_reported(lsp, fake_daemon) -> None:
    """VS Code sends the whole diffu section, its own serverCommand included, at start and on changes."""
    vscode_section = {"serverCommand": ["diffu", "lsp"], "trace": {"server": "off"}, "enable": True}
    session = await lsp("vscode-proposed", daemon=fake_daemon, settings=vscode_section)
    session.configure({**vscode_section, "debounceMs": 10})
    await wait_for(lambda: session.registrations, what="registration")
    for _ in range(100):
        if (await session.status())["settings"]["debounceMs"] == 10:
            break
        await asyncio.sleep(0.02)
    assert (await session.status())["settings"]["debounceMs"] == 10
    assert not session.logs(types.MessageType.Warning)
    assert not [m for m in session.client.messages if m.type == types.MessageType.Warning]


# -- 4: holes outside the selection -------------------------------------------------------------------
async def test_fill_holes_in_a_selection_with_a_mask_outside(lsp, fake_daemon) -> None:
    session = await lsp("neovim-0.12", daemon=fake_daemon)
    text = "x = <|mask|><|mask|>\n\n\ndef f():\n    return ???\n"
    uri = session.open("h.py", text)
    selection = {"start": {"line": 3, "character": 0}, "end": {"line": 5, "character": 0}}
    edit = await session.command("diffu.fillHoles", uri, selection)
    assert edit is not None and not session.logs(types.MessageType.Error)
    (only,) = edit["changes"][uri]
    assert only["range"]["start"] == {"line": 4, "character": 11}  # the ??? inside; the mask stays
    assert (await session.status())["counters"]["holes_filled"] == 1


# -- 5: one request per editor ------------------------------------------------------------------------
async def test_a_newer_request_supersedes_the_older_one_of_another_document(lsp, fake_daemon) -> None:
    session = await lsp("neovim-0.12", daemon=fake_daemon, settings={"steps": 40})
    first = session.open("a.py", SOURCE)
    second = session.open("b.py", SOURCE.replace("total", "summed"))
    cancelled = daemon_counter(fake_daemon, "cancelled")
    older = asyncio.ensure_future(session.inline(first, 6, 17, invoked=True))
    await wait_for(lambda: daemon_running(fake_daemon) >= 1, what="the older job to run")
    newer = await session.inline(second, 6, 17, invoked=True)
    assert (await older).items == () and newer.items
    await wait_for(lambda: daemon_counter(fake_daemon, "cancelled") > cancelled, what="the daemon to cancel")
    assert (await session.status())["counters"]["superseded"] == 1


async def test_a_burst_for_every_buffer_keeps_the_edited_document(lsp, fake_daemon) -> None:
    """Neovim 0.12 asks for every buffer at once, with the current window's cursor: the document edited
    last is where the user is, whichever request came first."""
    session = await lsp("neovim-0.12", daemon=fake_daemon)
    other = session.open("other.py", SOURCE)
    edited = session.open("edited.py", SOURCE.replace("total", "summed"))
    session.insert(edited, 6, 17, "r")
    mine = asyncio.ensure_future(session.inline(edited, 6, 18))
    theirs = asyncio.ensure_future(session.inline(other, 6, 18))
    assert (await theirs).items == () and (await mine).items
    # This server asked the model once, for the edited document, and answered the other empty (its own
    # counts: the shared daemon's also counts what other tests' servers still had in flight).
    status = await session.status()
    assert len(status["timings"]) == 1 and status["counters"]["superseded"] == 1


# -- 7: latency in the status; the status item -------------------------------------------------------
async def test_status_reports_latency_and_the_status_item(lsp, fake_daemon) -> None:
    session = await lsp("neovim-0.12", daemon=fake_daemon)
    uri = session.open("total.py", SOURCE)
    await session.inline(uri, 6, 17)
    await session.inline(uri, 7, 17)
    status = await session.status()
    latency = status["latency"]
    assert latency["first_after_connect_ms"] is not None and latency["last_ms"] is not None
    modes = latency["by_mode"]
    assert set(modes) == {"single_line"} and modes["single_line"]["n"] == 2
    assert modes["single_line"]["p90_ms"] >= modes["single_line"]["median_ms"] > 0
    assert [t["first"] for t in status["timings"]] == [True, False]
    items = await wait_for(
        lambda: [i for i in session.status_items if i["state"] == "ready" and i["latencyMs"]]
    )
    assert "ready" in items[-1]["message"] and items[-1]["model"] == "fake"
    assert any(i["state"] == "busy" for i in session.status_items)
    assert status["status"]["state"] == "ready"
    session.configure({"enable": False})
    await wait_for(lambda: session.status_items[-1]["state"] == "disabled", what="the disabled state")


# -- what users of other assistants expect ------------------------------------------------------------
async def test_invoked_requests_offer_candidates_to_cycle(lsp, fake_daemon) -> None:
    session = await lsp("neovim-0.12", daemon=fake_daemon)
    uri = session.open("total.py", SOURCE)
    requests = daemon_counter(fake_daemon, "requests")
    result = await session.inline(uri, 6, 17, invoked=True)
    texts = [item.insert_text for item in result.items]
    assert 2 <= len(texts) <= 3 and len(set(texts)) == len(texts)
    assert daemon_counter(fake_daemon, "requests") == requests + 3  # greedy + two sampled, batched
    typing = await session.inline(uri, 6, 17)
    assert [item.insert_text for item in typing.items] == texts[:1]  # the greedy one, from the cache


async def test_recent_edits_in_other_files_are_context(lsp, fake_daemon) -> None:
    """The chunk around an edit stays context after its file is closed (llama.vim's ring of chunks)."""
    # The fake model's tokens are characters: 150 tokens of budget hold the file and one chunk.
    session = await lsp("neovim-0.12", daemon=fake_daemon, settings={"contextTokens": 150})
    other = session.open("helpers.py", "".join(f"h_{i} = {i}\n" for i in range(100)))
    session.insert(other, 50, 0, "def parse_items(items):\n    return [int(x) for x in items]\n")
    session.client.text_document_did_close(
        types.DidCloseTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=other))
    )
    uri = session.open("main.py", "def total(items):\n    values = parse_items(items)\n    result = \n")
    await session.inline(uri, 2, 13, invoked=True)
    status = await session.status()
    assert status["timings"][-1]["context"] == ["helpers.py"], status["timings"]
    assert status["recent_chunks"] >= 1
    session.configure({"currentFileOnly": True})
    await asyncio.sleep(0.1)
    await session.inline(uri, 2, 13, invoked=True)
    assert (await session.status())["timings"][-1]["context"] == []
