"""``diffu chat``: a Textual chat with the diffu daemon that shows every answer being denoised.

The app lays out the conversation log, holds the conversations and opens the screens; its parts hold the
rest (:mod:`tui.chat_base`: the state they share; :mod:`tui.turns`: connecting and each answer's worker;
:mod:`tui.answer_actions`: replay, copy, code blocks). The conversation log is anchored to the bottom (it
follows new output only while the user has not scrolled up). Conversations, histories, settings and
prompt history persist in SQLite (:mod:`tui.store`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from textual.app import ComposeResult, SystemCommand
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Header, Static

from tui import keys
from tui.answer_actions import AnswerActions
from tui.render import MASK_GLYPH, SPECIAL_GLYPH
from tui.screens import ConversationsScreen, HelpScreen, SettingsScreen
from tui.settings import ChatSettings
from tui.turns import Turns, completed
from tui.widgets import AnswerView, ConnectPanel, PromptInput, UserMessage

WELCOME = (
    f"Type a prompt and press Enter. The answer is denoised live: [dim]{MASK_GLYPH}[/] still masked, "
    f"[$background on $success] highlighted [/] unmasked in this step, [dim]{SPECIAL_GLYPH}[/] the end of "
    "the answer (stop and padding tokens). The model sees the whole conversation: ctrl+n starts a new one "
    "for a new topic. Escape cancels; ctrl+r replays; f2 settings; f1 help."
)


class ChatApp(Turns, AnswerActions):
    """The chat: its layout, conversations and screens over its parts (:mod:`tui.chat_base`)."""

    TITLE = "diffu chat"
    BINDINGS = keys.bindings(*keys.CHAT_IDS)
    CSS = """
    #log { height: 1fr; padding: 0 1; scrollbar-gutter: stable; }
    #log > .welcome { color: $text-muted; margin: 1 0 0 0; }
    PromptInput { margin: 0 1; }
    """

    # -- layout ----------------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Header(icon="◌")
        with VerticalScroll(id="log"):
            yield Static(WELCOME, classes="welcome")
        yield ConnectPanel()
        yield PromptInput(
            self.store.prompts(), placeholder="Ask DiffuCoder… (Enter sends, F1 help)", id="prompt"
        )
        yield Footer()

    async def on_mount(self) -> None:
        self.set_keymap(self.keymap)
        prompt = self.query_one(PromptInput)
        prompt.cursor_blink = self.cursor_blink
        prompt.focus()
        self.query_one("#log").anchor()
        if self._settings_problem:
            self.notify(self._settings_problem, severity="warning", timeout=10)
        if self._open_conversation:
            await self.open_conversation(self._open_conversation)
        self.connect()

    # -- conversations ---------------------------------------------------------------------------------
    async def action_new_chat(self) -> None:
        await self._stop_live()
        await self._clear()
        self.conversation_id = None
        self._set_subtitle()
        self.query_one(PromptInput).focus()

    async def _stop_live(self) -> None:
        answer = self.live_answer
        if answer is not None:
            await self._cancel(answer)

    async def _clear(self) -> None:
        self.selected_fence = None
        self.conversation = []
        # The welcome line and a connection error stay: neither belongs to the conversation.
        await self.log_view.remove_children(
            [
                w
                for w in self.log_view.children
                if not (w.has_class("welcome") or w.has_class("connect-error"))
            ]
        )

    def action_conversations(self) -> None:
        def chosen(conversation_id: str | None) -> None:
            if conversation_id:
                self.run_worker(self.open_conversation(conversation_id), group="open", exclusive=True)

        self.push_screen(ConversationsScreen(self.store.conversations(), self.conversation_id), chosen)

    async def open_conversation(self, conversation_id: str) -> None:
        """Show a saved conversation; new prompts continue it."""
        if self.store.conversation(conversation_id) is None:
            self.notify(f"No conversation {conversation_id!r}.", severity="error")
            return
        await self._stop_live()
        await self._clear()
        self.conversation_id = conversation_id
        widgets: list[Any] = []
        for message in self.store.messages(conversation_id):
            if message.role == "user" or completed(message.finish_reason, message.content):
                self.conversation.append({"role": message.role, "content": message.content})
            if message.role == "user":
                widgets.append(UserMessage(message.content))
            else:
                self._answers += 1
                # A cancelled answer is shown as its last canvas, so its history is needed now; the
                # others load theirs when replayed.
                cancelled = message.finish_reason == "cancelled" and message.has_trace
                widgets.append(
                    AnswerView(
                        content=message.content,
                        finish_reason=message.finish_reason,
                        stats=message.stats,
                        message_id=message.id,
                        has_trace=message.has_trace,
                        trace=self.store.trace(message.id) if cancelled else None,
                        id=f"answer-{self._answers}",
                    )
                )
        await self.log_view.mount_all(widgets)
        self.log_view.anchor()
        self._set_subtitle()

    # -- screens ---------------------------------------------------------------------------------------
    def action_settings(self) -> None:
        def saved(settings: ChatSettings | None) -> None:
            if settings is None:
                return
            self.settings = settings
            if settings == self.baseline:
                self.store.clear_settings()  # back to config.toml / defaults, and following them
            else:
                self.store.save_settings(settings.to_dict())
            self.notify("Settings saved; they apply to the next answer.")

        self.push_screen(SettingsScreen(self.settings, self.baseline), saved)

    def action_help(self) -> None:
        self.push_screen(HelpScreen(self.keymap, self.config_file))

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for binding_id in keys.CHAT_IDS:
            spec = keys.SPECS[binding_id]
            if binding_id in ("quit", "help"):
                continue
            yield SystemCommand(
                spec.description, f"{spec.description} ({binding_id})", getattr(self, f"action_{spec.action}")
            )
        yield SystemCommand(
            "Help: keys and binding ids", "Show every action, its keys and binding id", self.action_help
        )

    async def on_unmount(self) -> None:
        await self.backend.aclose()
