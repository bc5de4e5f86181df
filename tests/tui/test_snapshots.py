"""SVG snapshots of the chat's main views (pytest-textual-snapshot; update with ``--snapshot-update``).

They depend on the pinned Textual, Rich and Pygments versions (see pyproject's test extra); cursor blink
and animations are off and the scripted daemon's steps take a fixed time, so every run draws the same frame.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from textual.pilot import Pilot

from tests.tui.helpers import ScriptedBackend, answered, ask, until
from tui.app import ChatApp
from tui.screens import ReplayScreen, SettingsScreen

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
