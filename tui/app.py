"""``diffu chat``: a Textual chat with the diffu daemon that shows every answer being denoised.

The app is composed of parts, each with a narrow interface, and inherits nothing but Textual's ``App``:
the log (:class:`tui.chat_log.ChatLog`: what is shown, the selected code block), the conversation the
model sees (:class:`tui.conversation.Conversation`), the turn runner (:class:`tui.turns.TurnRunner`: each
answer's worker, posting what became of it), the files in context (:class:`tui.context.ChatContext`) and
the file commands (:class:`tui.workbench.Workbench`: ``/add``, ``/apply``, ``/undo``, ``/fill``...). The
app lays them out, connects, routes the prompt (a command, or a turn with its files) and the runner's
messages, and opens the screens. Conversations, histories, settings and prompt history persist
in SQLite (:mod:`tui.store`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from textual import on
from textual.app import App, ComposeResult, SystemCommand
from textual.screen import Screen
from textual.widgets import Footer, Header, Static
from textual.widgets.markdown import MarkdownFence

from assistant.client import DaemonUnavailable
from assistant.workspace.files import mentions, with_files
from tui import keys
from tui.backend import Backend
from tui.chat_log import ChatLog
from tui.commands import Command, CommandError, parse_command, prompt_text
from tui.context import ChatContext, Limit
from tui.conversation import Conversation
from tui.errors import describe_error, is_settings_error
from tui.render import MASK_GLYPH, SPECIAL_GLYPH, Trace
from tui.review import ReviewScreen
from tui.screens import ConversationsScreen, HelpScreen, SettingsScreen
from tui.settings import ChatSettings, apply_saved
from tui.store import ChatStore
from tui.turns import TurnRunner
from tui.widgets import AnswerView, ConnectPanel, ErrorNotice, PromptInput, UserMessage
from tui.workbench import Workbench

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
        root: Path | None = None,
        files: Sequence[str] = (),
    ) -> None:
        """``root``: the working directory (paths are relative to it; Tab completes under it);
        ``files``: paths to put in the context at the start (``diffu chat --file``)."""
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
        self._connecting = asyncio.Lock()  # one connection attempt at a time (startup, a turn, a command)
        self.model = ""
        self.root = root or Path.cwd()
        self.context = ChatContext(self.root, backend.count_tokens)
        self._chat_log = ChatLog(Static(WELCOME, classes="welcome"), id="log")
        self.workbench = Workbench(
            log=self._chat_log,
            context=self.context,
            backend=backend,
            limit=self.limit,
            review=self.review,
            changed=self._set_subtitle,
        )
        self._initial_files = list(files)

    # -- layout ----------------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Header(icon="◌")
        yield self._chat_log
        yield ConnectPanel()
        yield PromptInput(
            self.store.prompts(),
            root=self.root,
            placeholder="Ask DiffuCoder… (Enter sends, F1 help)",
            id="prompt",
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
        if self._initial_files:
            self.run_command(Command("add", tuple(self._initial_files)))

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
        files = ""
        if self.context.files:
            count = len(self.context.files)
            limit = self.limit().tokens
            tokens = f"{self.context.tokens:,}" + (f"/{limit:,}" if limit is not None else "")
            files = f"{count} file{'s' if count != 1 else ''} · {tokens} tokens"
        self.sub_title = " · ".join(part for part in (self.model, files, self.conversation.title) if part)

    def limit(self) -> Limit:
        """The prompt's token limit: the model's context less the answer's canvas."""
        return Limit(self.backend.max_context, self.settings.max_new_tokens)

    # -- connecting ------------------------------------------------------------------------------------
    def connect(self) -> None:
        """Reach (or start) the daemon now, so the model loads while the user types."""
        self.run_worker(self.ensure_connected(), group="connect", exclusive=True)

    async def ensure_connected(self) -> bool:
        """Connected, or connect now (progress above the prompt; a failure inline with Retry)."""
        async with self._connecting:
            return await self._connect_once()

    async def _connect_once(self) -> bool:
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
        # What these settings' first turns need is compiled ahead of the daemon's other warm-up.
        self.run_worker(self.backend.warm(self.settings), group="warm", exit_on_error=False)
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
        text = event.text.strip()
        try:
            command = parse_command(text)
        except CommandError as exc:
            await self.log_view.say(str(exc), error=True)
            return
        if command is None and self.turns.live is not None:
            self.notify("Still answering: press Escape to cancel it first.", severity="warning")
            return
        if command is not None and self.workbench_busy:
            self.notify("A command is still running: press Escape to cancel it first.", severity="warning")
            return
        event.prompt.remember(text)
        self.store.add_prompt(text)
        if command is not None:
            self.run_command(command)
        elif not await self.send(prompt_text(text)):
            # Nothing was sent: the prompt stays, to fix and send again.
            event.prompt.load_text(text)
            event.prompt.move_cursor(event.prompt.document.end)

    async def send(self, text: str) -> bool:
        """Add a user turn with the files in context and start its answer; False (with one line per
        problem in the log) when a file cannot be sent, and then nothing is."""
        named = mentions(text, self.root)
        if named or self.context.files:
            if not await self.ensure_connected():
                return False
        if named:
            refused = [line for line, error in await self.context.add(named, self.limit()) if error]
            self._set_subtitle()
            if refused:
                for line in refused:
                    await self.log_view.say(line, error=True)
                return False
        blocks = await self._file_blocks()
        if blocks is None:
            return False
        self.conversation.add_prompt(text)
        self._set_subtitle()
        for notice in self.query(ErrorNotice).filter(".generate-error"):
            # An earlier failed answer can no longer be retried in place: the conversation moved on.
            for button in notice.query("#retry"):
                button.disabled = True
        await self.log_view.mount(UserMessage(text, files=[f.name for f in self.context.files]))
        await self._start_answer(blocks)
        return True

    async def _file_blocks(self) -> list[str] | None:
        """The files in context, read now; None (each problem said in the log) when any cannot be sent."""
        blocks, problems = await self.context.blocks(self.limit())
        self._set_subtitle()
        for line in problems:
            await self.log_view.say(f"{line}; nothing sent", error=True)
        return None if problems else blocks

    async def _start_answer(self, blocks: list[str]) -> None:
        answer = AnswerView(total=self.settings.max_new_tokens, live=True, id=self.log_view.new_answer_id())
        await self.log_view.mount(answer)
        self.log_view.anchor()  # a new turn brings the view back to the bottom
        self.turns.start(answer, self.context_messages(blocks), self.settings)
        self.refresh_bindings()

    def context_messages(self, blocks: Sequence[str] = ()) -> list[dict[str, str]]:
        """The conversation as chat messages (user turns and the answers that completed), the files'
        ``blocks`` in front of the last prompt: each turn sends the files as they are now, once."""
        messages = list(self.conversation.messages)
        if blocks and messages and messages[-1]["role"] == "user":
            messages[-1] = {"role": "user", "content": with_files(list(blocks), messages[-1]["content"])}
        return messages

    # -- commands --------------------------------------------------------------------------------------
    def run_command(self, command: Command) -> None:
        self.run_worker(self._command(command), group="command")

    async def _command(self, command: Command) -> None:
        # Token counts and fills need the daemon; connecting first shows its progress and errors.
        if command.name in ("add", "fill") and not await self.ensure_connected():
            return
        await self.workbench.run(command)
        self.refresh_bindings()

    @property
    def workbench_busy(self) -> bool:
        return any(w.group == "command" and w.is_running for w in self.workers)

    async def review(self, title: str, summary: str, diff: str) -> bool:
        """Show a change to a file; whether the user chose to write it (only from a worker)."""
        screen = ReviewScreen(title, summary, diff)
        written = await self.push_screen_wait(screen)
        return written is True

    def action_apply_code(self) -> None:
        if self.workbench_busy:
            self.notify("A command is still running: press Escape to cancel it first.", severity="warning")
            return
        self.run_command(Command("apply"))

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
        blocks = await self._file_blocks()
        if blocks is None:
            return
        answer = notice.parent
        if isinstance(answer, AnswerView):
            await answer.remove()
        await self._start_answer(blocks)

    def action_cancel(self) -> None:
        if self.turns.live is not None:
            self.turns.cancel()
        elif self.workbench_busy:
            # Closing a fill's stream cancels its job on the daemon; nothing was written.
            self.workers.cancel_group(self, "command")
            self.run_worker(self.log_view.say("cancelled; no file was changed"))
        self.refresh_bindings()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "cancel":
            return self.turns.live is not None or self.workbench_busy
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
            await self.turns.stop(answer)  # saved as cancelled; its view is cleared away next

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
        await self.log_view.show(self.conversation.open(conversation_id), self.store.trace)
        self._set_subtitle()

    # -- the answers on screen: replay, copy, code blocks (the log's) ---------------------------------
    def action_replay(self) -> None:
        self.log_view.replay(self._trace_of)

    def action_replay_answer(self, widget_id: str) -> None:
        self.log_view.replay(self._trace_of, widget_id)

    def _trace_of(self, answer: AnswerView) -> Trace | None:
        if not answer.trace.frames and answer.message_id is not None:
            stored = self.store.trace(answer.message_id)
            if stored is not None:
                answer.trace = stored
        return answer.trace

    def action_copy_message(self) -> None:
        self.log_view.copy_answer()

    def action_copy_code(self) -> None:
        self.log_view.copy_code()

    def action_next_code(self) -> None:
        self.log_view.move_selection(1)

    def action_prev_code(self) -> None:
        self.log_view.move_selection(-1)

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
            if self.connected:
                self.run_worker(self.backend.warm(settings), group="warm", exit_on_error=False)

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
