"""SVG snapshots of the chat's main views (pytest-textual-snapshot; update with ``--snapshot-update``).

They depend on the pinned Textual, Rich and Pygments versions (see pyproject's test extra); cursor blink
and animations are off and the scripted daemon's steps take a fixed time, so every run draws the same frame.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from textual.pilot import Pilot

from tests.tui.helpers import ANSWER, ScriptedBackend, answered, ask, until
from tui.app import ChatApp
from tui.fill_view import FillView
from tui.review import ReviewScreen
from tui.screens import ReplayScreen, SettingsScreen
from tui.widgets import PromptInput

SIZE = (100, 34)


def test_main_screen_mid_generation(snap_compare: Any, make_app: Callable[..., ChatApp]) -> None:
    """A finished answer (Markdown, highlighted code, stats), then a second one half denoised."""
    backend = ScriptedBackend()
    app = make_app(backend)

    async def run_before(pilot: Pilot) -> None:
        await answered(pilot, "Write a function that adds two numbers")
        backend.pause_at = 7
        answer = await ask(pilot, "Now sum a list")
        await until(pilot, lambda: len(answer.trace) == 8 and answer.denoise.index == 7)

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_replay_view(snap_compare: Any, make_app: Callable[..., ChatApp]) -> None:
    """The replay of an answer, five steps in, paused (it opens playing; home pauses it at the start)."""
    app = make_app(ScriptedBackend())

    async def run_before(pilot: Pilot) -> None:
        await answered(pilot, "Write a function that adds two numbers")
        await pilot.press("ctrl+r", "home", "right", "right", "right", "right", "right")
        await until(pilot, lambda: isinstance(app.screen, ReplayScreen) and app.screen.frame == 5)

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_settings_screen(snap_compare: Any, make_app: Callable[..., ChatApp]) -> None:
    """The settings form with the test settings (decoder: the model's choice)."""
    app = make_app(ScriptedBackend())

    async def run_before(pilot: Pilot) -> None:
        await pilot.press("f2")
        await until(pilot, lambda: isinstance(app.screen, SettingsScreen))

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_review_of_a_change(snap_compare: Any, make_app: Callable[..., ChatApp], tmp_path: Path) -> None:
    """/apply's review: the change's diff, coloured, over the chat, and its two keys."""
    (tmp_path / "geo.py").write_text("def add(a, b):\n    return 0\n\n\ndef untouched():\n    return 1\n")
    app = make_app(ScriptedBackend(answers=[ANSWER]), root=tmp_path)

    async def run_before(pilot: Pilot) -> None:
        await answered(pilot, "Fix add in geo.py")
        prompt = app.query_one(PromptInput)
        prompt.load_text("/apply geo.py")
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, ReviewScreen))

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_a_file_being_filled(snap_compare: Any, make_app: Callable[..., ChatApp], tmp_path: Path) -> None:
    """/fill mid-run: the file's own numbered lines, one hole filled and one still partly masks."""
    (tmp_path / "holes.py").write_text(
        "import math\n\n\ndef area(r):\n    return ???\n\n\ndef double(x):\n    return ???\n"
    )
    backend = ScriptedBackend(fills=["math.pi * r * r", "2 * x"], pause_at=20)
    app = make_app(backend, root=tmp_path)

    async def run_before(pilot: Pilot) -> None:
        await until(pilot, lambda: app.connected)
        prompt = app.query_one(PromptInput)
        prompt.load_text("/fill holes.py")
        await pilot.press("enter")
        await until(pilot, lambda: bool(app.query(FillView)) and len(app.query_one(FillView).trace) == 21)
        app.query_one(FillView).denoise.flush_now()

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)
