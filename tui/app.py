"""``diffu chat``: a Textual chat with the diffu daemon that shows every answer being denoised.

The app is composed of parts, each with a narrow interface, and inherits nothing but Textual's ``App``:
the log (:class:`tui.chat_log.ChatLog`: what is shown, the selected code block), the conversation the
model sees (:class:`tui.conversation.Conversation`), the turn runner (:class:`tui.turns.TurnRunner`: each
answer's worker, posting what became of it). The app lays them out, connects, routes the prompt and the
runner's messages, and opens the screens. Conversations, histories, settings and prompt history persist
in SQLite (:mod:`tui.store`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from textual import on
from textual.app import App, ComposeResult, SystemCommand
from textual.screen import Screen
from textual.widgets import Footer, Header, Static
from textual.widgets.markdown import MarkdownFence

from assistant.client import DaemonUnavailable
from tui import keys
from tui.backend import Backend
from tui.chat_log import ChatLog
from tui.conversation import Conversation
from tui.errors import describe_error, is_settings_error
from tui.render import MASK_GLYPH, SPECIAL_GLYPH, Trace
from tui.screens import ConversationsScreen, HelpScreen, ReplayScreen, SettingsScreen
from tui.settings import ChatSettings, apply_saved
from tui.store import ChatStore
from tui.turns import TurnRunner
from tui.widgets import AnswerView, ConnectPanel, ErrorNotice, PromptInput, UserMessage

WELCOME = (
    f"Type a prompt and press Enter. The answer is denoised live: [dim]{MASK_GLYPH}[/] still masked, "
    f"[$background on $success] highlighted [/] unmasked in this step, [dim]{SPECIAL_GLYPH}[/] the end of "
    "the answer (stop and padding tokens). The model sees the whole conversation: ctrl+n starts a new one "
    "for a new topic. Escape cancels; ctrl+r replays; f2 settings; f1 help."
)


class ChatApp(App[None]):
    """The chat. ``backend`` reaches the model; ``store`` persists conversations and settings."""

    TITLE = "diffu chat"
    BINDINGS = keys.bindings(*keys.CHAT_IDS)
    CSS = """
    #log { height: 1fr; padding: 0 1; scrollbar-gutter: stable; }
    #log > .welcome { color: $text-muted; margin: 1 0 0 0; }
    PromptInput { margin: 0 1; }
    """

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
        self.settings, self._settings_problem = apply_saved(self.baseline, store.saved_settings())
        self.conversation = Conversation(store)
        self.turns = TurnRunner(backend, self.conversation, self.ensure_connected)
        self._open_conversation = conversation_id
        self.connected = False
        self.model = ""
        self._answers = 0

    # -- layout ----------------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Header(icon="◌")
        yield ChatLog(Static(WELCOME, classes="welcome"), id="log")
        yield ConnectPanel()
        yield PromptInput(
            self.store.prompts(), placeholder="Ask DiffuCoder… (Enter sends, F1 help)", id="prompt"
        )
        yield Footer()
        yield self.turns

    async def on_mount(self) -> None:
        self.set_keymap(self.keymap)
        prompt = self.query_one(PromptInput)
        prompt.cursor_blink = self.cursor_blink
        prompt.focus()
        self.log_view.anchor()
        if self._settings_problem:
            self.notify(self._settings_problem, severity="warning", timeout=10)
        if self._open_conversation:
            await self.open_conversation(self._open_conversation)
        self.connect()

    @property
    def log_view(self) -> ChatLog:
        return self.query_one("#log", ChatLog)

    @property
    def conversation_id(self) -> str | None:
        return self.conversation.id

    @property
    def selected_fence(self) -> MarkdownFence | None:
        return self.log_view.selected

    def _set_subtitle(self) -> None:
        self.sub_title = " · ".join(part for part in (self.model, self.conversation.title) if part)

    # -- connecting ------------------------------------------------------------------------------------
    def connect(self) -> None:
        """Reach (or start) the daemon now, so the model loads while the user types."""
        self.run_worker(self.ensure_connected(), group="connect", exclusive=True)

    async def ensure_connected(self) -> bool:
        """Connected, or connect now (progress above the prompt; a failure inline with Retry)."""
        if self.connected:
            return True
        panel = self.query_one(ConnectPanel)
        panel.display = True
        panel.report("connecting", 0.0, "")
        try:
            self.model = await self.backend.connect(panel.report)
        except Exception as exc:  # every failure is shown inline; none may reach the screen as a traceback
            panel.display = False
            await self._connect_failed(exc)
            return False
        panel.display = False
        self.connected = True
        if self.for_model is not None:
            self.baseline, problem = self.for_model(self.backend.chat_defaults)
            self.settings, saved_problem = apply_saved(self.baseline, self.store.saved_settings())
            for note in filter(None, (problem, saved_problem)):
                self.notify(note, severity="warning", timeout=10)
        for notice in self.query(ErrorNotice).filter(".connect-error"):
            await notice.remove()
        self._set_subtitle()
        return True

    async def _connect_failed(self, exc: Exception) -> None:
        for notice in self.query(ErrorNotice).filter(".connect-error"):
            await notice.remove()
        await self.log_view.add(ErrorNotice(describe_error(exc), kind="connect", classes="connect-error"))

    # -- turns -----------------------------------------------------------------------------------------
    @on(PromptInput.Submitted)
    async def _submitted(self, event: PromptInput.Submitted) -> None:
        if self.turns.live is not None:
            self.notify("Still answering: press Escape to cancel it first.", severity="warning")
            return
        text = event.text.strip()
        event.prompt.remember(text)
        self.store.add_prompt(text)
        await self.send(text)

    async def send(self, text: str) -> None:
        """Add a user turn and start its answer."""
        self.conversation.add_prompt(text)
        self._set_subtitle()
        for notice in self.query(ErrorNotice).filter(".generate-error"):
            # An earlier failed answer can no longer be retried in place: the conversation moved on.
            for button in notice.query("#retry"):
                button.disabled = True
        await self.log_view.mount(UserMessage(text))
        await self._start_answer()

    async def _start_answer(self) -> None:
        self._answers += 1
        answer = AnswerView(total=self.settings.max_new_tokens, live=True, id=f"answer-{self._answers}")
        await self.log_view.mount(answer)
        self.log_view.anchor()  # a new turn brings the view back to the bottom
        self.turns.start(answer, self.context(), self.settings)
        self.refresh_bindings()

    def context(self) -> list[dict[str, str]]:
        """The conversation as chat messages: user turns and the answers that completed."""
        return list(self.conversation.messages)

    @on(TurnRunner.Answered)
    async def _answered(self, event: TurnRunner.Answered) -> None:
        self.refresh_bindings()
        if event.answer.is_attached:  # not cleared away meanwhile (a new chat, another conversation)
            await event.answer.finish()

    @on(TurnRunner.Failed)
    async def _failed(self, event: TurnRunner.Failed) -> None:
        exc = event.error
        if isinstance(exc, DaemonUnavailable):
            self.connected = False
        self.refresh_bindings()
        notice = ErrorNotice(
            describe_error(exc),
            kind="generate",
            classes="generate-error",
            settings_button=is_settings_error(exc),
        )
        if event.answer.is_attached:
            await event.answer.fail(notice)

    @on(ErrorNotice.Retry)
    async def _retry(self, event: ErrorNotice.Retry) -> None:
        notice = event.notice
        if notice.kind == "connect":
            await notice.remove()
            self.connect()
            return
        if self.turns.live is not None:
            self.notify("Still answering: press Escape to cancel it first.", severity="warning")
            return
        answer = notice.parent
        if isinstance(answer, AnswerView):
            await answer.remove()
        await self._start_answer()

    def action_cancel(self) -> None:
        self.turns.cancel()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "cancel":
            return self.turns.live is not None
        return True

    # -- conversations ---------------------------------------------------------------------------------
    async def action_new_chat(self) -> None:
        await self._stop_live()
        await self.log_view.clear()
        self.conversation.clear()
        self._set_subtitle()
        self.query_one(PromptInput).focus()

    async def _stop_live(self) -> None:
        answer = self.turns.live
        if answer is not None:
            await self.turns.stop(answer)
            await answer.finish()

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
        await self.log_view.clear()
        widgets: list[Any] = []
        for message in self.conversation.open(conversation_id):
            if message.role == "user":
                widgets.append(UserMessage(message.content))
                continue
            self._answers += 1
            # A cancelled answer is shown as its last canvas, so its history is needed now; the others
            # load theirs when replayed.
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

    # -- the answers on screen: replay, copy, code blocks ----------------------------------------------
    def _replayable(self) -> list[AnswerView]:
        return [a for a in self.log_view.answers() if a.replayable]

    def action_replay(self) -> None:
        answers = self._replayable()
        if not answers:
            self.notify("No answer to replay yet.", severity="warning")
            return
        target = answers[-1]
        selected = self.log_view.selected
        if selected is not None:
            target = next((a for a in answers if selected in a.code_blocks()), target)
        self.push_screen(ReplayScreen(answers, answers.index(target), self._trace_of))

    def action_replay_answer(self, widget_id: str) -> None:
        answers = self._replayable()
        index = next((i for i, a in enumerate(answers) if a.id == widget_id), None)
        if index is not None:
            self.push_screen(ReplayScreen(answers, index, self._trace_of))

    def _trace_of(self, answer: AnswerView) -> Trace | None:
        if not answer.trace.frames and answer.message_id is not None:
            stored = self.store.trace(answer.message_id)
            if stored is not None:
                answer.trace = stored
        return answer.trace

    def action_copy_message(self) -> None:
        answers = [a for a in self.log_view.answers() if a.answered]
        if not answers:
            self.notify("No answer to copy yet.", severity="warning")
            return
        self._copy(answers[-1].content, "the answer")

    def action_copy_code(self) -> None:
        fence = self.log_view.code_block()
        if fence is None:
            self.notify("No code block to copy.", severity="warning")
            return
        self._copy(fence.code, "the code block")

    def _copy(self, text: str, what: str) -> None:
        self.copy_to_clipboard(text)  # OSC 52: works over SSH and in tmux with set-clipboard on
        lines = text.count("\n") + 1
        self.notify(f"Copied {what} ({lines} line{'s' if lines != 1 else ''}).")

    def action_next_code(self) -> None:
        if not self.log_view.move_selection(1):
            self.notify("No code blocks in this conversation.", severity="warning")

    def action_prev_code(self) -> None:
        if not self.log_view.move_selection(-1):
            self.notify("No code blocks in this conversation.", severity="warning")

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
