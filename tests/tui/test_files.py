"""Pilot tests of the chat with the user's files: files in context (``/add``, ``@path``, Tab, ``/drop``,
``/files``), answers applied as reviewed diffs (``/apply``, F3, ``y``/``n``, ``/undo``) and holes filled
in place (``/fill``), against the scripted daemon. What a turn sends is read from the backend's requests
(the request side), never from the screen."""

from __future__ import annotations

import ast
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from textual.pilot import Pilot

from assistant.client import APIError, Step
from assistant.workspace.files import context_block
from tests.tui.helpers import ANSWER, BROKEN, ScriptedBackend, answered, screen_text, until
from tui.app import ChatApp
from tui.denoise import CanvasView
from tui.fill_view import FillView
from tui.review import ReviewScreen
from tui.widgets import Notice, PromptInput

pytestmark = pytest.mark.asyncio
SIZE = (100, 34)
GEO = "def add(a, b):\n    return 0\n\n\ndef untouched():\n    return 1\n"


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """The chat's working directory, with a Python file in it."""
    root = tmp_path / "work"
    root.mkdir()
    (root / "geo.py").write_text(GEO)
    return root


async def type_in(pilot: Pilot, text: str) -> None:
    prompt = pilot.app.query_one(PromptInput)
    prompt.focus()
    prompt.load_text(text)
    await pilot.press("enter")


async def command(pilot: Pilot, text: str) -> list[str]:
    """Run a command (or a prompt that sends nothing) and return the lines it added to the log."""
    app = pilot.app
    before = len(app.query(Notice))
    await type_in(pilot, text)
    await until(pilot, lambda: len(app.query(Notice)) > before and not app.workbench_busy)
    return [n.text for n in list(app.query(Notice))[before:]]


def last_prompt(backend: ScriptedBackend) -> str:
    return backend.requests[-1].messages[-1]["content"]


async def test_added_files_go_with_every_turn_as_they_are_then(
    make_app: Callable[..., ChatApp], work: Path
) -> None:
    backend = ScriptedBackend()
    app = make_app(backend, root=work)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await until(pilot, lambda: app.connected)
        block = f"geo.py\n```python\n{GEO}```"
        assert await command(pilot, "/add geo.py") == [f"added geo.py ({len(block)} tokens)"]
        assert backend.counted[-1] == block  # counted by the daemon's tokenizer, as the prompt holds it
        assert f"1 file · {len(block)}/{8192 - 160 - 2:,} tokens" in app.sub_title
        await answered(pilot, "What does add return?")
        assert last_prompt(backend) == f"{block}\n\nWhat does add return?"
        assert "with geo.py" in screen_text(app)  # under the prompt: what went with it
        # Edited on disk between turns: the next turn sends the file as it is now, once.
        (work / "geo.py").write_text(GEO.replace("return 0", "return a + b"))
        await answered(pilot, "And now?")
        sent = backend.requests[-1].messages
        assert sent[0]["content"] == "What does add return?"  # earlier turns carry no file
        assert "return a + b" in sent[-1]["content"] and "return 0" not in sent[-1]["content"]
        listing = await command(pilot, "/files")
        assert listing[0].startswith("geo.py") and "total:" in listing[0]
        assert await command(pilot, "/drop") == ["dropped geo.py"]
        await answered(pilot, "Without it")
        assert last_prompt(backend) == "Without it" and "file" not in app.sub_title


async def test_files_that_cannot_be_sent_are_one_line_each_and_nothing_goes(
    make_app: Callable[..., ChatApp], work: Path
) -> None:
    backend = ScriptedBackend()
    backend_limit = 400  # a small model: the prompt may hold 400 - 160 - 2 = 238 tokens
    app = make_app(backend, root=work)
    (work / "pkg").mkdir()
    (work / "blob.bin").write_bytes(b"\x7fELF\0\0\0")
    (work / "big.py").write_text("x = 1\n" * 50)
    big = len(context_block("big.py", "x = 1\n" * 50))  # the fake tokenizer: a token per character
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await until(pilot, lambda: app.connected)
        backend.max_context = backend_limit
        lines = await command(pilot, "/add missing.py pkg blob.bin big.py")
        assert lines == [
            "missing.py: no such file; not added",
            "pkg: is a directory (add the files in it by name); not added",
            "blob.bin: a binary file, not text; not added",
            f"big.py: {big} tokens, beyond the prompt's limit of 238 tokens (the model's context of 400 less "
            "the 160-token answer); not added",
        ]
        assert not app.context.files and all("\n" not in line for line in lines)
        # A mention of a file that is not there: one line, nothing sent, the prompt kept to fix.
        lines = await command(pilot, "Explain @nothere.py please")
        assert lines == ["nothere.py: no such file; not added"] and backend.requests == []
        assert app.query_one(PromptInput).text == "Explain @nothere.py please"
        # A file in context that went away, or grew past the limit, stops the turn before it is sent.
        await command(pilot, "/add geo.py")
        (work / "geo.py").unlink()
        lines = await command(pilot, "Now?")
        assert lines == [
            "geo.py: no such file (it is in the context: /drop geo.py, or put it back); nothing sent"
        ]
        (work / "geo.py").write_text(GEO * 6)
        lines = await command(pilot, "Now?")
        grown = len(context_block("geo.py", GEO * 6))
        assert lines == [
            f"the files in context are {grown} tokens (geo.py {grown}), beyond the prompt's limit of 238 "
            "tokens (the model's context of 400 less the 160-token answer); /drop one; nothing sent"
        ]
        assert backend.requests == []


async def test_mentions_and_tab_completion(make_app: Callable[..., ChatApp], work: Path) -> None:
    (work / "geometry.py").write_text("PI = 3.14\n")
    (work / "src").mkdir()
    (work / "src" / "shapes.py").write_text("class Shape: ...\n")
    backend = ScriptedBackend()
    app = make_app(backend, root=work)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await until(pilot, lambda: app.connected)
        prompt = app.query_one(PromptInput)
        prompt.focus()
        await pilot.press(*"Compare @sr", "tab")
        assert prompt.text == "Compare @src/"  # a directory: completion goes on inside it
        await pilot.press("tab")
        assert prompt.text == "Compare @src/shapes.py "
        await pilot.press(*"with @ge", "tab")
        assert prompt.text == "Compare @src/shapes.py with @geo"  # two match: what they share
        assert "geo.py  geometry.py" in screen_text(app)  # and both are listed
        await pilot.press(*"metry", "tab", "enter")
        await until(pilot, lambda: len(backend.requests) == 1)
        sent = last_prompt(backend)
        assert sent.startswith("src/shapes.py\n```python\nclass Shape: ...\n```\n\ngeometry.py\n```python\n")
        assert sent.endswith("\n\nCompare @src/shapes.py with @geometry.py")
        assert [f.name for f in app.context.files] == ["src/shapes.py", "geometry.py"]
        # Tab elsewhere moves the focus, as in any form.
        await until(pilot, lambda: app.turns.live is None)
        prompt.focus()
        prompt.load_text("no path here")
        await pilot.press("tab")
        assert not prompt.has_focus


async def test_apply_shows_the_diff_writes_on_y_and_undo_restores_the_bytes(
    make_app: Callable[..., ChatApp], work: Path
) -> None:
    original = (work / "geo.py").read_bytes()
    backend = ScriptedBackend(answers=[ANSWER])
    app = make_app(backend, root=work)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await answered(pilot, "Fix add")
        await command(pilot, "/add geo.py")
        await type_in(pilot, "/apply")  # the only file in context; the last code block
        await until(pilot, lambda: isinstance(app.screen, ReviewScreen))
        screen = app.screen
        assert isinstance(screen, ReviewScreen)
        assert screen.summary == "replaces add"
        assert (
            "-    return 0\n+    return a + b\n" in screen.diff
            and "Apply the code block to geo.py" in screen_text(app)
        )
        before = len(app.query(Notice))
        await pilot.press("y")
        await until(pilot, lambda: len(app.query(Notice)) > before)
        assert (work / "geo.py").read_text() == GEO.replace("return 0", "return a + b")
        assert list(app.query(Notice))[-1].text == "wrote geo.py (+1 -1); /undo puts it back"
        assert await command(pilot, "/undo") == ["put back geo.py as it was (0 more changes to undo)"]
        assert (work / "geo.py").read_bytes() == original
        # n drops it; the file is as it was.
        await pilot.press("f3")  # the key: the same as /apply
        await until(pilot, lambda: isinstance(app.screen, ReviewScreen))
        await pilot.press("n")
        await until(pilot, lambda: "dropped the change to geo.py" in list(app.query(Notice))[-1].text)
        assert (work / "geo.py").read_bytes() == original
        assert await command(pilot, "/undo") == ["nothing to undo: no change was applied in this session"]


async def test_a_file_changed_after_its_diff_was_shown_is_not_written(
    make_app: Callable[..., ChatApp], work: Path
) -> None:
    backend = ScriptedBackend(answers=[ANSWER])
    app = make_app(backend, root=work)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await answered(pilot, "Fix add")
        await type_in(pilot, "/apply geo.py")
        await until(pilot, lambda: isinstance(app.screen, ReviewScreen))
        (work / "geo.py").write_text(GEO + "# my edit, made while the diff was shown\n")
        before = len(app.query(Notice))
        await pilot.press("y")
        await until(pilot, lambda: len(app.query(Notice)) > before)
        assert list(app.query(Notice))[-1].text == (
            "geo.py changed on disk since its diff was shown; nothing written (run it again)"
        )
        assert (work / "geo.py").read_text() == GEO + "# my edit, made while the diff was shown\n"


async def test_a_block_that_does_not_parse_needs_force_and_a_new_file_is_created(
    make_app: Callable[..., ChatApp], work: Path
) -> None:
    backend = ScriptedBackend(answers=[BROKEN])
    app = make_app(backend, root=work)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await answered(pilot, "Fix add")
        assert await command(pilot, "/apply geo.py") == [
            "the code block does not parse (line 1: expected ':'); /apply --force puts the block at the end "
            "of geo.py as it is"
        ]
        assert await command(pilot, "/apply") == [
            "name the file: /apply PATH (no file in context defines what the block defines)"
        ]
        await type_in(pilot, "/apply new.py --force")
        await until(pilot, lambda: isinstance(app.screen, ReviewScreen))
        assert app.screen.diff.startswith("--- /dev/null\n+++ b/new.py\n")  # type: ignore[attr-defined]
        await pilot.press("y")
        await until(pilot, lambda: (work / "new.py").exists())
        assert (work / "new.py").read_text() == "def add(a, b)\n    return a + b\n"
        assert await command(pilot, "/undo") == [
            "removed new.py, which diffu had created (0 more changes to undo)"
        ]
        assert not (work / "new.py").exists()
        assert (await command(pilot, "/frobnicate"))[0].startswith(
            "unknown command /frobnicate (commands: /add"
        )


async def test_fill_resolves_the_holes_in_the_files_own_text_then_writes_on_y(
    make_app: Callable[..., ChatApp], work: Path
) -> None:
    source = "def add(a, b):\n    return ???\n\n\ndef double(x):\n    return ???\n"
    (work / "holes.py").write_text(source)
    backend = ScriptedBackend(fills=["a + b", "2 * x"], pause_at=10)
    app = make_app(backend, root=work)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await until(pilot, lambda: app.connected)
        await type_in(pilot, "/fill holes.py")
        await until(pilot, lambda: backend.steps_sent == 0 and len(app.query(FillView)) == 1)
        view = app.query_one(FillView)
        await until(pilot, lambda: len(view.trace) == 11)
        view.denoise.flush_now()
        await pilot.pause()
        # Mid-run: the file's own lines around the holes, the holes partly masks.
        canvas = str(view.query_one(CanvasView).render())
        assert "1 │ def add(a, b):" in canvas and "5 │ def double(x):" in canvas and "░" in canvas
        # The prompt sent: the whole file with each ??? a run of 16 masks.
        assert backend.fill_requests == ["# holes.py (python)\n" + source.replace("???", "<|mask|>" * 16)]
        backend.resume.set()
        await until(pilot, lambda: isinstance(app.screen, ReviewScreen))
        await pilot.press("y")
        await until(pilot, lambda: "wrote holes.py" in list(app.query(Notice))[-1].text)
        filled = (work / "holes.py").read_text()
        assert filled == source.replace("???", "a + b", 1).replace("???", "2 * x", 1)
        ast.parse(filled)
        assert "2 of 2 holes filled" in screen_text(app)
        assert await command(pilot, "/fill holes.py") == [
            "holes.py: no holes to fill (mark them with <|mask|> or ???)"
        ]


async def test_escape_cancels_a_fill_and_daemon_errors_are_one_line(
    make_app: Callable[..., ChatApp], work: Path
) -> None:
    source = "def add(a, b):\n    return ???\n"
    (work / "holes.py").write_text(source)
    backend = ScriptedBackend(fills=["a + b"], pause_at=3)
    old_daemon = False  # then the daemon answers /tokenize with a 404, as one started by an older diffu
    count = backend.count_tokens

    async def tokenize(text: str) -> int:
        if old_daemon:
            raise APIError(404, "no route /tokenize", "not_found_error")
        return await count(text)

    backend.count_tokens = tokenize  # type: ignore[method-assign]
    app = make_app(backend, root=work)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await until(pilot, lambda: app.connected)
        await type_in(pilot, "/fill holes.py")
        await until(pilot, lambda: len(app.query(FillView)) == 1 and len(app.query_one(FillView).trace) == 4)
        await pilot.press("escape")
        await until(pilot, lambda: not app.workbench_busy and "cancelled" in list(app.query(Notice))[-1].text)
        assert list(app.query(Notice))[-1].text == "cancelled; no file was changed"
        assert (work / "holes.py").read_text() == source and not isinstance(app.screen, ReviewScreen)
        old_daemon = True
        assert await command(pilot, "/add geo.py") == [
            "geo.py: cannot count its tokens (the daemon has no /tokenize: it is older than this client; "
            "restart it (diffu daemon stop)); not added"
        ]

        async def refused(prompt: str, options: object) -> AsyncIterator[Step]:
            raise APIError(400, "max_new_tokens: 0 asks to fill the prompt's <|mask|> holes", "invalid")
            yield  # an async generator, as the backend's

        backend.fill = refused  # type: ignore[method-assign,assignment]
        lines = await command(pilot, "/fill holes.py")
        assert lines == [
            "/fill: the daemon refused the request (400): max_new_tokens: 0 asks to fill the "
            "prompt's <|mask|> holes"
        ]
        assert "not filled" in screen_text(app) and app.is_running
