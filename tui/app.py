"""``diffu chat``: a Textual chat with the diffu daemon that shows every answer being denoised.

All model I/O runs in workers (connect, generate, cancel) so the prompt stays responsive; step events
are recorded as they come and redrawn at most 30 times a second; the conversation log is anchored to the
bottom (it follows new output only while the user has not scrolled up). Conversations, histories,
settings and prompt history persist in SQLite (:mod:`tui.store`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from textual import on, work
from textual.app import App, ComposeResult, SystemCommand
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Header, Static
from textual.widgets.markdown import MarkdownFence

from assistant.client import DaemonUnavailable, Done, Step, Waiting
from assistant.wire import DoneStats
from tui import keys
from tui.backend import Backend
from tui.errors import describe_error, is_settings_error
from tui.render import MASK_GLYPH, SPECIAL_GLYPH, Trace, retried_stats, retry_label
from tui.screens import ConversationsScreen, HelpScreen, ReplayScreen, SettingsScreen
from tui.settings import ChatSettings, apply_saved
from tui.store import ChatStore
from tui.widgets import AnswerView, ConnectPanel, ErrorNotice, PromptInput, UserMessage

log = logging.getLogger("diffu.chat")

WELCOME = (
    f"Type a prompt and press Enter. The answer is denoised live: [dim]{MASK_GLYPH}[/] still masked, "
    f"[$background on $success] highlighted [/] unmasked in this step, [dim]{SPECIAL_GLYPH}[/] the end of "
    "the answer (stop and padding tokens). The model sees the whole conversation: ctrl+n starts a new one "
    "for a new topic. Escape cancels; ctrl+r replays; f2 settings; f1 help."
)
CANCEL_WAIT = 3.0  # seconds to wait for the daemon to confirm a cancel before dropping the stream


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

    @property
    def log_view(self) -> VerticalScroll:
        return self.query_one("#log", VerticalScroll)

    def _set_subtitle(self) -> None:
        title = ""
        if self.conversation_id:
            info = self.store.conversation(self.conversation_id)
            title = info.title if info else ""
        self.sub_title = " · ".join(part for part in (self.model, title) if part)

    # -- connecting ------------------------------------------------------------------------------------
    @work(exclusive=True, group="connect")
    async def connect(self) -> None:
        """Reach (or start) the daemon now, so the model loads while the user types."""
        await self._ensure_connected()

    async def _ensure_connected(self) -> bool:
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
            self.settings, saved_problem = self._load_settings()
            for note in filter(None, (problem, saved_problem)):
                self.notify(note, severity="warning", timeout=10)
        for notice in self.query(ErrorNotice).filter(".connect-error"):
            await notice.remove()
        self._set_subtitle()
        return True

    async def _connect_failed(self, exc: Exception) -> None:
        for notice in self.query(ErrorNotice).filter(".connect-error"):
            await notice.remove()
        notice = ErrorNotice(describe_error(exc), kind="connect", classes="connect-error")
        await self.log_view.mount(notice)
        self.log_view.scroll_end(animate=False)

    # -- sending and generating ------------------------------------------------------------------------
    @on(PromptInput.Submitted)
    async def _submitted(self, event: PromptInput.Submitted) -> None:
        if self.live_answer is not None:
            self.notify("Still answering: press Escape to cancel it first.", severity="warning")
            return
        text = event.text.strip()
        event.prompt.remember(text)
        self.store.add_prompt(text)
        await self.send(text)

    async def send(self, text: str) -> None:
        """Add a user turn and start its answer."""
        if self.conversation_id is None:
            self.conversation_id = self.store.new_conversation(text)
            self._set_subtitle()
        self.store.add_message(self.conversation_id, "user", text)
        self.conversation.append({"role": "user", "content": text})
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
        self.live_answer = answer
        self.refresh_bindings()
        self._generate(answer, self.context(), self.settings)

    def context(self) -> list[dict[str, str]]:
        """The conversation as chat messages: user turns and the answers that completed."""
        return list(self.conversation)

    @work(exclusive=True, group="generate")
    async def _generate(
        self, answer: AnswerView, messages: list[dict[str, str]], settings: ChatSettings
    ) -> None:
        try:
            if not await self._ensure_connected():
                raise DaemonUnavailable("not connected to the diffu daemon (see the error above)")
            done = await self._stream(answer, messages, settings)
            retry = settings.retry_for(done.text, done.finish_reason) if done is not None else None
            retried = None
            if done is not None and retry is not None:
                # The answer becomes the second decode's (see ChatSettings.retry_settings).
                retried = retried_stats(done.stats, retry)
                await answer.restart(retry.max_new_tokens, retry_label(retry))
                done = await self._stream(answer, messages, retry)
            if self.live_answer is not answer:
                return
            if done is None:
                raise DaemonUnavailable("the daemon ended the stream without an answer")
            self.live_answer = None
            self.refresh_bindings()
            # Saved before it is drawn: quitting while the Markdown renders must not lose the answer.
            answer.record(done, retried)
            self._save_answer(answer)
            if _completed(done.finish_reason, answer.content):
                self.conversation.append({"role": "assistant", "content": answer.content})
            answer.denoise.flush_now()
            await answer.finish()
        except asyncio.CancelledError:
            raise  # cancelled from the UI (which updates the view), or the app is closing
        except Exception as exc:  # shown inline with a Retry button; never a traceback on screen
            if self.live_answer is not answer:
                return
            self.live_answer = None
            if isinstance(exc, DaemonUnavailable):
                self.connected = False
            log.debug("generation failed", exc_info=exc)
            self.refresh_bindings()
            notice = ErrorNotice(
                describe_error(exc),
                kind="generate",
                classes="generate-error",
                settings_button=is_settings_error(exc),
            )
            await answer.fail(notice)

    async def _stream(
        self, answer: AnswerView, messages: list[dict[str, str]], settings: ChatSettings
    ) -> Done | None:
        """One decode into ``answer``'s live canvas: its Done, or None when the stream ended without one
        or the answer was cancelled from the UI meanwhile."""
        async for event in self.backend.generate(messages, settings, session=self.conversation_id):
            if self.live_answer is not answer:
                return None
            if isinstance(event, Step):
                answer.push(event)
            elif isinstance(event, Waiting):
                answer.wait(event)
            else:
                return event
        return None

    def _save_answer(self, answer: AnswerView) -> None:
        if self.conversation_id is None:
            return
        answer.message_id = self.store.add_message(
            self.conversation_id,
            "assistant",
            answer.content,
            finish_reason=answer.finish_reason,
            stats=answer.stats,
            trace=answer.trace,
        )

    @on(ErrorNotice.Retry)
    async def _retry(self, event: ErrorNotice.Retry) -> None:
        notice = event.notice
        if notice.kind == "connect":
            await notice.remove()
            self.connect()
            return
        if self.live_answer is not None:
            self.notify("Still answering: press Escape to cancel it first.", severity="warning")
            return
        answer = notice.parent
        if isinstance(answer, AnswerView):
            await answer.remove()
        await self._start_answer()

    # -- cancelling ------------------------------------------------------------------------------------
    def action_cancel(self) -> None:
        answer = self.live_answer
        if answer is not None:
            answer.denoise.label = "cancelling…"
            answer.denoise.flush_now()
            self.run_worker(self._cancel(answer), group="cancel")

    async def _cancel(self, answer: AnswerView) -> None:
        """Ask the daemon to stop the request, then stop reading its stream.

        Closing the stream alone would also cancel the job (the daemon watches for disconnects), but
        the explicit cancel frees the device at once even if the connection lingers.
        """
        if answer.request_id:
            try:
                await asyncio.wait_for(self.backend.cancel(answer.request_id), CANCEL_WAIT)
            except Exception as exc:  # the stream is dropped below either way
                log.debug("cancel request failed: %s", exc)
        if self.live_answer is not answer:
            return  # it finished (or failed) while the cancel was on its way
        self.live_answer = None
        self.workers.cancel_group(self, "generate")
        stats = DoneStats(steps=len(answer.trace), new_tokens=answer.trace.revealed())
        answer.record(Done(answer.request_id, "", "cancelled", stats=stats))
        self._save_answer(answer)
        self.refresh_bindings()
        await answer.finish()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "cancel":
            return self.live_answer is not None
        return True

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
            if message.role == "user" or _completed(message.finish_reason, message.content):
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

    # -- replay ----------------------------------------------------------------------------------------
    def _replayable(self) -> list[AnswerView]:
        return [a for a in self.query(AnswerView) if a.replayable]

    def action_replay(self) -> None:
        answers = self._replayable()
        if not answers:
            self.notify("No answer to replay yet.", severity="warning")
            return
        target = answers[-1]
        if self.selected_fence is not None:
            owner = next((a for a in answers if self.selected_fence in a.code_blocks()), None)
            target = owner or target
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

    # -- copying and code blocks -----------------------------------------------------------------------
    def action_copy_message(self) -> None:
        answers = [a for a in self.query(AnswerView) if a.answered]
        if not answers:
            self.notify("No answer to copy yet.", severity="warning")
            return
        self._copy(answers[-1].content, "the answer")

    def action_copy_code(self) -> None:
        fences = self._fences()
        fence = self.selected_fence if self.selected_fence in fences else (fences[-1] if fences else None)
        if fence is None:
            self.notify("No code block to copy.", severity="warning")
            return
        self._copy(fence.code, "the code block")

    def _copy(self, text: str, what: str) -> None:
        self.copy_to_clipboard(text)  # OSC 52: works over SSH and in tmux with set-clipboard on
        lines = text.count("\n") + 1
        self.notify(f"Copied {what} ({lines} line{'s' if lines != 1 else ''}).")

    def _fences(self) -> list[MarkdownFence]:
        return list(self.log_view.query(MarkdownFence))

    def action_next_code(self) -> None:
        self._move_code(1)

    def action_prev_code(self) -> None:
        self._move_code(-1)

    def _move_code(self, delta: int) -> None:
        fences = self._fences()
        if not fences:
            self.notify("No code blocks in this conversation.", severity="warning")
            return
        if self.selected_fence in fences:
            index = max(0, min(fences.index(self.selected_fence) + delta, len(fences) - 1))
        else:
            index = len(fences) - 1 if delta < 0 else 0
        if self.selected_fence is not None:
            self.selected_fence.remove_class("-selected")
        self.selected_fence = fences[index]
        self.selected_fence.add_class("-selected")
        self.log_view.scroll_to_widget(self.selected_fence, animate=False, top=True)

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


def _completed(finish_reason: str | None, content: str) -> bool:
    """Whether an answer belongs in the conversation the model sees (as ``AnswerView.answered``)."""
    return finish_reason not in (None, "cancelled") and bool(content)
