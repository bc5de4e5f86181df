"""A turn of ``diffu chat``: reaching the daemon, sending a prompt and streaming its answer (once more
with the retry settings when the first decode's code does not parse), the Retry button of a failed one,
and cancelling.

All model I/O runs in workers (connect, generate, cancel) so the prompt stays responsive; step events
are recorded as they come and redrawn at most 30 times a second.
"""

from __future__ import annotations

import asyncio
import logging

from textual import on, work

from assistant.client import DaemonUnavailable, Done, Step, Waiting
from assistant.wire import DoneStats
from tui.chat_base import ChatBase
from tui.errors import describe_error, is_settings_error
from tui.render import retried_stats, retry_label
from tui.settings import ChatSettings
from tui.widgets import AnswerView, ConnectPanel, ErrorNotice, PromptInput, UserMessage

log = logging.getLogger("diffu.chat")

CANCEL_WAIT = 3.0  # seconds to wait for the daemon to confirm a cancel before dropping the stream


def completed(finish_reason: str | None, content: str) -> bool:
    """Whether an answer belongs in the conversation the model sees (as ``AnswerView.answered``)."""
    return finish_reason not in (None, "cancelled") and bool(content)


class Turns(ChatBase):
    """Connecting, generating, retrying and cancelling: the part of the chat that talks to the model."""

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
            if completed(done.finish_reason, answer.content):
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
