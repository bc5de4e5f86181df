"""Every configurable key binding of ``diffu chat``, by binding id.

The screens build their ``BINDINGS`` from this table, the help screen lists it, and the ``[keymap]`` table
of ``config.toml`` is checked against its ids; Textual's ``App.set_keymap`` then rebinds them by id.
Default keys avoid the ones the prompt (a TextArea) uses for editing: ctrl+a/e/k/u/w/d/x/c/v/z/y.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # Textual is imported only by the full-screen app, not by ``diffu chat --once``
    from textual.binding import BindingType


@dataclass(frozen=True)
class KeySpec:
    id: str
    keys: str
    action: str
    description: str
    show: bool = False
    priority: bool = False


_SPECS = (
    # The chat screen.
    KeySpec("cancel", "escape", "cancel", "Cancel", show=True),
    KeySpec("new-chat", "ctrl+n", "new_chat", "New chat", show=True),
    KeySpec("conversations", "ctrl+o", "conversations", "Chats", show=True),
    KeySpec("replay", "ctrl+r", "replay", "Replay", show=True),
    KeySpec("settings", "f2", "settings", "Settings", show=True),
    KeySpec("help", "f1", "help", "Help", show=True),
    KeySpec("copy-message", "ctrl+l", "copy_message", "Copy answer"),
    KeySpec("copy-code", "ctrl+g", "copy_code", "Copy code block"),
    KeySpec("next-code", "ctrl+down", "next_code", "Next code block"),
    KeySpec("prev-code", "ctrl+up", "prev_code", "Previous code block"),
    KeySpec("apply-code", "f3", "apply_code", "Apply the code block to a file (/apply)"),
    KeySpec("quit", "ctrl+q", "quit", "Quit", priority=True),
    # The replay screen. Priority: its scrolling body must not take the arrow keys for itself.
    KeySpec("replay-prev", "left", "step(-1)", "Step back", show=True, priority=True),
    KeySpec("replay-next", "right", "step(1)", "Step forward", show=True, priority=True),
    KeySpec("replay-first", "home", "first", "First step", priority=True),
    KeySpec("replay-last", "end", "last", "Last step", priority=True),
    KeySpec("replay-play", "space", "toggle_play", "Play/pause", show=True, priority=True),
    KeySpec("replay-prev-answer", "pageup", "answer(-1)", "Previous answer", show=True, priority=True),
    KeySpec("replay-next-answer", "pagedown", "answer(1)", "Next answer", show=True, priority=True),
    KeySpec("replay-close", "escape,q", "close", "Close", show=True),
    # The review of a change to a file (/apply, /fill).
    KeySpec("review-write", "y", "write", "Write it", show=True),
    KeySpec("review-drop", "n,escape", "drop", "Drop it", show=True),
)

SPECS: dict[str, KeySpec] = {spec.id: spec for spec in _SPECS}
DESCRIPTIONS: dict[str, str] = {spec.id: spec.description for spec in _SPECS}
CHAT_IDS = tuple(spec.id for spec in _SPECS if not spec.id.startswith(("replay-", "review-")))
REPLAY_IDS = tuple(spec.id for spec in _SPECS if spec.id.startswith("replay-"))
REVIEW_IDS = tuple(spec.id for spec in _SPECS if spec.id.startswith("review-"))


def bindings(*ids: str) -> list[BindingType]:
    """Textual bindings for the given ids (their default keys; the app's keymap overrides them)."""
    from textual.binding import Binding

    return [
        Binding(
            SPECS[i].keys,
            SPECS[i].action,
            SPECS[i].description,
            show=SPECS[i].show,
            priority=SPECS[i].priority,
            id=i,
        )
        for i in ids
    ]
