"""The state of ``diffu chat`` that its parts share: the backend, the store, the settings, the conversation
the model sees, the answer being generated and the selected code block.

:class:`tui.app.ChatApp` is made of parts, one concern each, that all extend :class:`ChatBase`:
:class:`tui.turns.Turns` (connecting, a turn's answer streamed, retried and cancelled) and
:class:`tui.answer_actions.AnswerActions` (replaying, copying and walking the code blocks of the answers
shown); the app itself lays them out and holds the conversations and the screens.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from textual.app import App
from textual.containers import VerticalScroll
from textual.widgets.markdown import MarkdownFence

from tui.backend import Backend
from tui.settings import ChatSettings, apply_saved
from tui.store import ChatStore
from tui.widgets import AnswerView


class ChatBase(App[None]):
    """The chat's state. ``backend`` reaches the model; ``store`` persists conversations and settings."""

    def __init__(
        self,
        backend: Backend,
        store: ChatStore,
        *,
        baseline: ChatSettings | None = None,
        for_model: Callable[[dict[str, Any]], tuple[ChatSettings, str]] | None = None,
        keymap: dict[str, str] | None = None,
        config_file: Path | None = None,
        conversation_id: str | None = None,
        cursor_blink: bool = True,
    ) -> None:
        super().__init__()
        self.backend = backend
        self.store = store
        self.baseline = baseline or ChatSettings()
        self.for_model = for_model  # re-layers the baseline over the model's chat defaults on connect
        self.keymap = dict(keymap or {})
        self.config_file = config_file or Path("config.toml")
        self.cursor_blink = cursor_blink
        self.settings, self._settings_problem = self._load_settings()
        self.conversation_id: str | None = None
        # What the model sees: user turns and completed answers, as data beside the widgets showing them.
        self.conversation: list[dict[str, str]] = []
        self._open_conversation = conversation_id
        self.connected = False
        self.model = ""
        self.live_answer: AnswerView | None = None
        self.selected_fence: MarkdownFence | None = None
        self._answers = 0

    def _load_settings(self) -> tuple[ChatSettings, str]:
        return apply_saved(self.baseline, self.store.saved_settings())

    @property
    def log_view(self) -> VerticalScroll:
        return self.query_one("#log", VerticalScroll)

    def _set_subtitle(self) -> None:
        title = ""
        if self.conversation_id:
            info = self.store.conversation(self.conversation_id)
            title = info.title if info else ""
        self.sub_title = " · ".join(part for part in (self.model, title) if part)
