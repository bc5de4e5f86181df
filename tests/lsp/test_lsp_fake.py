"""``diffu lsp`` end to end over stdio against a real daemon on the JAX-free fake backend.

The fake model answers with words from a small vocabulary after ``steps`` steps of 20 ms, so these tests
can time cancellation and supersede against a generation that is really running in the daemon.
"""

from __future__ import annotations

import asyncio
import re

import pytest
from lsprotocol import types
from pygls.exceptions import JsonRpcInvalidParams, JsonRpcRequestCancelled

from assistant.client.calls import warm_body
from assistant.server.fake_runtime import _WORDS
from lsp.settings import Settings
from lsp.state import STAGES
from lsp.suggest import warm_shapes
from tests.assistant.helpers import isolated_env, start_daemon, stop_background_daemons
from tests.lsp.conftest import daemon_counter, daemon_running, wait_for

pytestmark = pytest.mark.asyncio

FAKE_WORD = re.compile(
    "^(?:" + "|".join(re.escape(w) for w in sorted(_WORDS, key=len, reverse=True)) + r"| )+$"
)


def fake_words(text: str) -> bool:
    """The fake model's words, the last one possibly cut where the canvas ended."""
    *words, last = text.split(" ")
    return all(w in _WORDS for w in words if w) and any(w.startswith(last) for w in _WORDS)


SOURCE = (
    "import os\n\n\ndef total(items):\n    result = 0\n    for x in items:\n        result = \n"
    "    return result\n"
)


async def test_capabilities_follow_the_client(lsp, fake_daemon) -> None:
    """Inline completion for clients that declare it, the completion fallback for the others."""
    nvim11 = await lsp("neovim", daemon=fake_daemon)
    caps = nvim11.result.capabilities
    assert caps.inline_completion_provider is None
    assert caps.completion_provider is not None and "." in caps.completion_provider.trigger_characters
    assert caps.code_action_provider is not None
    assert "diffu.fillHoles" in caps.execute_command_provider.commands

    nvim12 = await lsp("neovim-0.12", daemon=fake_daemon)
    caps = nvim12.result.capabilities
    assert caps.inline_completion_provider is not None and caps.completion_provider is None

    # VS Code offers dynamic registration: nothing static, then client/registerCapability.
    code = await lsp("vscode-proposed", daemon=fake_daemon, settings={"languages": ["python", "rust"]})
    caps = code.result.capabilities
    assert caps.inline_completion_provider is None and caps.completion_provider is None
    reg = await wait_for(
        lambda: code.registrations.get(types.TEXT_DOCUMENT_INLINE_COMPLETION), what="registration"
    )
    assert sorted(f["language"] for f in reg.register_options["documentSelector"]) == ["python", "rust"]
    assert types.TEXT_DOCUMENT_COMPLETION not in code.registrations

    plain = await lsp("vscode", daemon=fake_daemon)
    reg = await wait_for(lambda: plain.registrations.get(types.TEXT_DOCUMENT_COMPLETION), what="registration")
    assert reg.register_options["triggerCharacters"]


async def test_inline_completion(lsp, fake_daemon) -> None:
    session = await lsp("neovim-0.12", daemon=fake_daemon)
    uri = session.open("total.py", SOURCE)
    before = daemon_counter(fake_daemon, "completed")
    result = await session.inline(uri, 6, 17)  # after "result = ", inside the loop
    assert len(result.items) == 1  # typing: one suggestion
    item = result.items[0]
    assert item.range.start == item.range.end == types.Position(6, 17)
    # Single-line mode (code follows on the next lines, the cursor ends a non-opener line): one line of
    # the fake model's words, stripped, with no special tokens.
    assert "\n" not in item.insert_text and FAKE_WORD.match(item.insert_text), item.insert_text
    assert item.insert_text == item.insert_text.rstrip() and len(item.insert_text.strip()) >= 4
    assert item.command is not None and item.command.command == "diffu.accepted"
    assert daemon_counter(fake_daemon, "completed") == before + 1


async def test_block_completion_stays_in_scope(lsp, fake_daemon) -> None:
    """After a block opener the canvas is a block, and the completion stays inside its indentation."""
    session = await lsp("neovim-0.12", daemon=fake_daemon, settings={"maxTokens": 48})
    uri = session.open("f.py", "def f(items):\n    \n\nprint(1)\n")
    result = await session.inline(uri, 1, 4, invoked=True)
    # The fake model is deterministic: this prompt gets words on one line (it writes no newlines), each
    # candidate in scope, starting at the cursor's column (no space of its own before it).
    assert result.items, "the fake model's answer for this prompt must be shown"
    for item in result.items:
        text = item.insert_text
        assert fake_words(text) and text == text.strip(), text
        assert all(not line.strip() or line.startswith(" ") for line in text.split("\n")[1:]), text


async def test_completion_fallback(lsp, fake_daemon) -> None:
    session = await lsp("neovim", daemon=fake_daemon)
    uri = session.open("total.py", SOURCE.replace("result = \n", "result = to\n"))
    result = await session.complete(uri, 6, 19)  # after "result = to"
    assert isinstance(result, types.CompletionList) and result.is_incomplete is True
    # Invoked: several distinct candidates, the greedy one first.
    assert 1 < len(result.items) <= 3 and len({i.text_edit.new_text for i in result.items}) == len(
        result.items
    )
    assert [i.sort_text for i in result.items] == [str(k) for k in range(len(result.items))]
    item = result.items[0]
    # The edit replaces the typed word with the word plus the infill, so word filters keep the item.
    assert item.text_edit.range == types.Range(types.Position(6, 17), types.Position(6, 19))
    assert item.text_edit.new_text.startswith("to") and len(item.text_edit.new_text) > 4
    assert item.filter_text == item.text_edit.new_text
    assert item.insert_text_format == types.InsertTextFormat.PlainText


async def test_cache_and_typing_through_a_suggestion(lsp, fake_daemon) -> None:
    session = await lsp("neovim-0.12", daemon=fake_daemon)
    uri = session.open("total.py", SOURCE)
    first = (await session.inline(uri, 6, 17)).items[0].insert_text
    completed = daemon_counter(fake_daemon, "completed")
    again = (await session.inline(uri, 6, 17)).items[0].insert_text
    assert again == first
    # The user types the first three characters of the suggestion: the rest comes from the cache.
    session.replace_all(uri, SOURCE.replace("result = \n", "result = " + first[:3] + "\n"))
    rest = await session.inline(uri, 6, 20)
    assert rest.items[0].insert_text == first[3:]
    assert daemon_counter(fake_daemon, "completed") == completed  # the daemon was not asked again
    status = await session.status()
    assert status["cache"]["hits"] == 1 and status["cache"]["forward_hits"] == 1


async def test_cancel_request_reaches_the_daemon(lsp, fake_daemon) -> None:
    """``$/cancelRequest``: RequestCancelled for the editor, and the daemon drops the running job."""
    # 60 steps of 20 ms: the generation runs long enough to be cancelled mid-way.
    session = await lsp("neovim-0.12", daemon=fake_daemon, settings={"steps": 60, "maxTokens": 64})
    uri = session.open("total.py", SOURCE)
    cancelled = daemon_counter(fake_daemon, "cancelled")
    request = asyncio.ensure_future(session.inline(uri, 1, 0, invoked=True, msg_id="slow-1"))
    await wait_for(lambda: daemon_running(fake_daemon) >= 1, what="the job to run in the daemon")
    session.client.cancel_request(types.CancelParams(id="slow-1"))
    with pytest.raises(JsonRpcRequestCancelled):
        await request
    await wait_for(lambda: daemon_counter(fake_daemon, "cancelled") > cancelled, what="the daemon to cancel")
    assert (await session.status())["counters"]["cancelled"] == 1
    # The server keeps serving.
    assert (await session.inline(uri, 6, 17)).items


async def test_newer_request_supersedes_older(lsp, fake_daemon) -> None:
    session = await lsp("neovim-0.12", daemon=fake_daemon, settings={"steps": 60, "maxTokens": 64})
    uri = session.open("total.py", SOURCE)
    cancelled = daemon_counter(fake_daemon, "cancelled")
    older = asyncio.ensure_future(session.inline(uri, 1, 0, invoked=True))
    await wait_for(lambda: daemon_running(fake_daemon) >= 1, what="the older job to run")
    newer = await session.inline(uri, 6, 17, invoked=True)
    assert (await older).items == ()  # answered, empty: a newer request of the editor took over
    assert newer.items and newer.items[0].insert_text
    await wait_for(lambda: daemon_counter(fake_daemon, "cancelled") > cancelled, what="the daemon to cancel")
    assert (await session.status())["counters"]["superseded"] == 1


async def test_debounce_drops_keystroke_bursts(lsp, fake_daemon) -> None:
    """Requests inside the debounce window never reach the daemon; only the last one does."""
    session = await lsp("neovim-0.12", daemon=fake_daemon, settings={"debounceMs": 300})
    uri = session.open("total.py", SOURCE)
    requests = daemon_counter(fake_daemon, "requests")
    burst = [asyncio.ensure_future(session.inline(uri, 6, 17)) for _ in range(4)]
    results = await asyncio.gather(*burst)
    assert [r.items for r in results[:3]] == [(), (), ()] and results[3].items
    assert daemon_counter(fake_daemon, "requests") == requests + 1


def _code_actions(session, uri: str, start: tuple[int, int], end: tuple[int, int]):
    return session.client.text_document_code_action_async(
        types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            range=types.Range(types.Position(*start), types.Position(*end)),
            context=types.CodeActionContext(diagnostics=[]),
        )
    )


def edits_of(edit, uri: str) -> list[types.TextEdit]:
    """The text edits of a workspace edit, whichever form the client's capabilities asked for."""
    if edit.document_changes:
        return list(edit.document_changes[0].edits)
    return list(edit.changes[uri])


HOLES = "def area(w, h):\n    return ???\n\n\ndef name():\n    ???\n"


async def test_fill_holes_code_action(lsp, fake_daemon) -> None:
    """The code action is cheap to list; resolving it runs the model and returns the fills as its edit."""
    session = await lsp("neovim-0.12", daemon=fake_daemon)
    uri = session.open("holes.py", HOLES)
    completed = daemon_counter(fake_daemon, "completed")
    actions = await _code_actions(session, uri, (0, 0), (0, 0))
    assert [a.title for a in actions] == ["Fill 2 holes in this file with diffu"]
    assert actions[0].kind == types.CodeActionKind.RefactorRewrite and actions[0].edit is None
    assert daemon_counter(fake_daemon, "completed") == completed  # listing ran no model
    resolved = await session.client.code_action_resolve_async(actions[0])
    edits = edits_of(resolved.edit, uri)  # Neovim 0.12 takes plain ``changes``
    assert [(e.range.start.line, e.range.start.character, e.range.end.character) for e in edits] == [
        (1, 11, 14),
        (5, 4, 7),
    ]
    assert "\n" not in edits[0].new_text and edits[0].new_text.strip()  # an inline hole gets one line
    assert all("???" not in e.new_text for e in edits)

    selected = await _code_actions(session, uri, (0, 0), (2, 0))
    assert [a.title for a in selected] == ["Fill 1 hole in the selection with diffu"]
    assert await _code_actions(session, uri, (2, 0), (3, 0)) is None  # no hole there: no action


async def test_fill_holes_command(lsp, fake_daemon) -> None:
    """``diffu.fillHoles`` (what the editor keymaps call) applies the edit and returns it."""
    # VS Code's capabilities: versioned document changes, so a stale edit is refused by the editor.
    session = await lsp("vscode-proposed", daemon=fake_daemon, settings={"holeMarker": "TODO_HOLE"})
    uri = session.open("holes.py", HOLES.replace("???", "TODO_HOLE").replace("w, h", "<|mask|><|mask|>"))
    edit = await session.command("diffu.fillHoles", uri)
    assert len(session.applied_edits) == 1
    edits = session.applied_edits[0].document_changes[0].edits
    assert session.applied_edits[0].document_changes[0].text_document.version == 1
    # Three holes: the run of two masks (two tokens), then the two configured markers.
    assert [(e.range.start.line, e.range.start.character) for e in edits] == [(0, 9), (1, 11), (5, 4)]
    assert edits[0].range.end.character == 9 + 2 * len("<|mask|>")
    assert edit["documentChanges"][0]["edits"][1]["newText"] == edits[1].new_text
    # Only the selection's holes: the first function.
    selected = await session.command(
        "diffu.fillHoles", uri, {"start": {"line": 0, "character": 0}, "end": {"line": 2, "character": 0}}
    )
    assert len(selected["documentChanges"][0]["edits"]) == 2
    # Bad arguments are an error for that request only.
    with pytest.raises(JsonRpcInvalidParams):
        await session.command("diffu.fillHoles", "file:///not/open.py")
    with pytest.raises(JsonRpcInvalidParams):
        await session.command("diffu.fillHoles", uri, "line 3")
    assert (await session.status())["counters"]["holes_filled"] == 5
    # No holes: nothing to apply, and the user is told.
    plain = session.open("plain.py", "x = 1\n")
    assert await session.command("diffu.fillHoles", plain) is None
    assert any("no holes" in m.message for m in session.client.messages)


async def test_did_change_configuration(lsp, fake_daemon) -> None:
    session = await lsp("vscode-proposed", daemon=fake_daemon)
    uri = session.open("total.py", SOURCE)
    await wait_for(
        lambda: session.registrations.get(types.TEXT_DOCUMENT_INLINE_COMPLETION), what="registration"
    )
    session.configure({"enable": False})
    await wait_for(
        lambda: types.TEXT_DOCUMENT_INLINE_COMPLETION in session.unregistered, what="unregistration"
    )
    assert (await session.inline(uri, 6, 17)).items == ()

    session.configure({"enable": True, "languages": ["rust"], "debounceMs": "fast", "bogus": 1})
    reg = await wait_for(
        lambda: session.registrations.get(types.TEXT_DOCUMENT_INLINE_COMPLETION), what="re-registration"
    )
    assert [f["language"] for f in reg.register_options["documentSelector"]] == ["rust"]
    assert (await session.inline(uri, 6, 17)).items == ()  # python is not in the languages any more
    warnings = session.logs(types.MessageType.Warning)
    assert any("debounceMs: expected an integer" in w for w in warnings)
    assert any("bogus: unknown setting" in w for w in warnings)

    session.configure({"languages": [], "maxTokens": 8})
    await wait_for(
        lambda: session.registrations.get(types.TEXT_DOCUMENT_INLINE_COMPLETION) != reg,
        what="registration for every language",
    )
    status = await session.status()
    assert status["settings"]["maxTokens"] == 8 and status["settings"]["debounceMs"] == 0
    assert (await session.inline(uri, 6, 17)).items

    # An empty push means "pull": the server asks workspace/configuration for its section.
    session.client.set_configuration({"maxTokens": 12, "currentFileOnly": True}, section="diffu")
    session.client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings=None))
    for _ in range(100):
        settings = (await session.status())["settings"]
        if settings["maxTokens"] == 12:
            break
        await asyncio.sleep(0.02)
    assert settings["maxTokens"] == 12 and settings["currentFileOnly"] is True


async def test_stopped_daemon_is_a_log_message_not_a_crash(lsp, tmp_path) -> None:
    root = tmp_path / "doomed"
    daemon = start_daemon(root, "fake:step_delay=0.01", env=isolated_env(root))
    session = await lsp("neovim-0.12", daemon=daemon)
    uri = session.open("total.py", SOURCE)
    assert (await session.inline(uri, 6, 17)).items
    daemon.stop()
    session.replace_all(uri, SOURCE.replace("for x", "for y"))  # not from the cache
    assert (await session.inline(uri, 6, 17)).items == ()
    errors = await wait_for(lambda: session.logs(types.MessageType.Error), what="an error log message")
    assert any("daemon" in e for e in errors), errors
    # Still serving: requests are answered (empty, fast) and commands work.
    assert (await session.inline(uri, 6, 17, invoked=True)).items == ()
    status = await session.status()
    assert status["counters"]["errors"] >= 2 and session.client.error is None


async def test_no_daemon_at_start(lsp, tmp_path) -> None:
    """A URL nobody listens on: initialize still answers, the failure is reported once, requests are empty."""
    session = await lsp("neovim-0.12", url="http://127.0.0.1:9")
    uri = session.open("a.py", "x = 1\n")
    errors = await wait_for(lambda: session.logs(types.MessageType.Error), what="an error log message")
    assert "cannot reach the diffu daemon" in errors[0]
    # Shown to the user too (a separate notification, so it may arrive a moment later).
    await wait_for(
        lambda: any(m.type == types.MessageType.Error for m in session.client.messages), what="a shown error"
    )
    assert (await session.inline(uri, 0, 5, invoked=True)).items == ()


def said_twice(message: str) -> bool:
    """A stage's words twice in one message, or a word repeated across a colon ("ready: ready")."""
    return any(message.count(p) > 1 for p in STAGES.values() if len(p) > 5) or bool(
        re.search(r"\b(\w+): \1\b", message)
    )


async def test_progress_while_the_daemon_loads(lsp, tmp_path) -> None:
    """$/progress while the model loads; its messages, the log's and the status item's say each start-up
    stage once (#34 E: "loading the model: loading the model", "diffu daemon: ready: ready")."""
    root = tmp_path / "slow"
    # The model loads until the gate file appears, which the test makes once the editor has been told of
    # the load: however long the server takes to start on a busy machine, the loading stage is seen.
    gate = root / "loaded"
    daemon = start_daemon(root, f"fake:load_gate={gate},warmup_delay=0.2", env=isolated_env(root), wait=False)
    try:
        session = await lsp("neovim-0.12", daemon=daemon)
        uri = session.open("total.py", SOURCE)

        def reports() -> list:
            tokens = [t for t in session.client.progress_reports if str(t).startswith("diffu-daemon")]
            return session.client.progress_reports[tokens[0]] if tokens else []

        # A request made while the model loads waits for it rather than failing.
        request = asyncio.ensure_future(session.inline(uri, 6, 17, invoked=True))
        await wait_for(
            lambda: any((r.message or "").startswith("loading") for r in reports()),
            timeout=120,
            what="the loading stage's progress",
        )
        assert not request.done()
        gate.touch()
        assert (await request).items

        await wait_for(lambda: reports() and reports()[-1].kind == "end", what="the end of the progress")
        kinds = [r.kind for r in reports()]
        assert kinds[0] == "begin" and kinds.count("end") == 1 and "report" in kinds, kinds
        messages = [r.message or "" for r in reports()]
        assert messages[-1] == "model ready"
        percentages = [r.percentage for r in reports() if r.kind != "end"]
        assert percentages == sorted(percentages)  # the load's progress (it serves once loaded)
        shown = [(r.message, r.percentage) for r in reports() if r.kind != "end"]
        assert all(a != b for a, b in zip(shown, shown[1:], strict=False)), shown  # #44 E: no repeats
        stages = [m for m in session.logs() if m.startswith("diffu: ") and "connected to" not in m]
        assert any(m.startswith("diffu: ready") for m in stages), stages
        for message in [*messages, *stages, *(i["message"] for i in session.status_items)]:
            assert not said_twice(message), message
    finally:
        gate.touch()
        daemon.stop()


async def test_autostart_then_discovery(lsp, tmp_path) -> None:
    """No URL anywhere: the first server starts a daemon for the configured model (as the other clients
    do); a second server finds that daemon through its discovery file instead of starting another."""
    shared = tmp_path / "shared"
    env = {
        "DIFFU_AUTOSTART": "1",
        "DIFFU_MODEL": "fake:step_delay=0.01",
        "DIFFU_PORT": "0",
        "DIFFU_CONFIG_DIR": str(shared / "config"),
        "DIFFU_RUNTIME_DIR": str(shared / "run"),
        "DIFFU_LOG_DIR": str(shared / "log"),
    }
    try:
        first = await lsp("neovim-0.12", env=env)
        uri = first.open("total.py", SOURCE)
        assert (await first.inline(uri, 6, 17, invoked=True)).items
        started = (await first.status())["url"]
        assert started and len(list((shared / "run").glob("*.json"))) == 1

        second = await lsp("neovim-0.12", env=env)
        uri = second.open("total.py", SOURCE)
        assert (await second.inline(uri, 6, 17, invoked=True)).items
        assert (await second.status())["url"] == started
        assert len(list((shared / "run").glob("*.json"))) == 1  # still one daemon
    finally:
        stop_background_daemons(shared)


async def test_connecting_has_the_daemon_compile_the_editors_shapes_before_the_first_suggestion(
    lsp, tmp_path
) -> None:
    """#21: the first suggestion after connecting should not wait for a compile. The server asks the
    daemon (POST /v1/diffu/warm) for the shapes typing sends, and the daemon compiles them between
    requests, before anything is typed."""
    daemon = start_daemon(tmp_path / "daemon", "fake:warmup_delay=0.3,step_delay=0.002", wait=False)
    try:
        daemon.wait_ready()  # the daemon's own warm-up is over: what follows is the editor's
        before = daemon.health()
        assert before["stage"] == "ready"
        # More candidates than the daemon's own warm-up plans for (it warms the editors' default shapes,
        # whatever the file's length): the batch of 5 sampled candidates is the editor's own program.
        session = await lsp("neovim-0.12", daemon=daemon, settings={"candidates": 6})
        asked = await wait_for(
            lambda: next((m for m in session.logs() if "warm" in m), None), what="the warm request"
        )
        match = re.search(r"asked the daemon to warm (\d+) editor shapes \((\d+) queued, \d+ already", asked)
        assert match and int(match[1]) >= 1 and int(match[2]) >= 1, asked
        # Compiled in the background, with no suggestion requested: asked again, the daemon finds every
        # one of those shapes compiled.
        assert await wait_for(lambda: daemon.health()["stage"] == "ready", what="the warm-up's end")
        with daemon.client() as c:
            entry = c.get("/v1/models").json()["data"][0]
            shapes = warm_shapes(Settings(candidates=6), entry["context_length"], entry["editor_context"])
            again = c.post("/v1/diffu/warm", json=warm_body(shapes)).json()
        assert len(shapes) == int(match[1]) and again["queued"] == 0
        assert again["compiled"] == list(range(len(shapes)))
    finally:
        daemon.stop()


async def test_the_row_is_the_models_recommendation_unless_the_user_sets_a_budget(lsp, tmp_path) -> None:
    """The bundled model writes no better lines with 1,024 tokens of context than with 512, and its first
    forward is half as long at 512 (docs/editors.md): a daemon's model recommends its editors' row
    (``diffu_editor_context``), the server keeps within it while ``contextTokens`` is unset, and a user's
    budget wins."""
    root = tmp_path / "daemon"
    daemon = start_daemon(root, "fake:step_delay=0.002,editor_context=100", env=isolated_env(root))
    try:
        session = await lsp("neovim-0.12", daemon=daemon, settings={"minChars": 1})
        long_file = "x = 1\n" * 400 + "def total(items):\n    result = \n" + "y = 2\n" * 400
        uri = session.open("long.py", long_file)
        await session.inline(uri, 401, 13, invoked=True)
        status = await session.status()
        assert (status["editor_context"], status["row_limit"], status["max_context"]) == (100, 100, 512)
        # A prompt of 100 tokens less the canvas (24) and 2, at the server's first guess of characters a
        # token (2.7; the fake model spends a token a character): 200 characters of the file's 5,000.
        (first,) = status["timings"]
        assert first["prompt_chars"] <= (100 - 24 - 2) * 2.7, first
        session.configure({"contextTokens": 450})
        for _ in range(100):
            status = await session.status()
            if status["context_tokens"] == 450:
                break
            await asyncio.sleep(0.02)
        assert (status["context_tokens"], status["row_limit"]) == (450, 512)
        other = session.open("long2.py", long_file)
        await session.inline(other, 401, 13, invoked=True)
        status = await session.status()
        assert status["timings"][-1]["prompt_chars"] > 100 * 2.7, status["timings"]  # past the model's
    finally:
        daemon.stop()
