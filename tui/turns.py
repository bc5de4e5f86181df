"""A turn of ``diffu chat``: an answer streamed from the daemon (once more with the retry settings when the
first decode's code does not parse), saved when it ends, or cancelled.

:class:`TurnRunner` is a widget without a view (posting's habit: work in workers, results as messages):
the app hands it an answer view and the messages to send, its worker streams the steps into the view,
records and saves the answer in the :class:`~tui.conversation.Conversation`, then posts what became of
it (:class:`TurnRunner.Answered`, :class:`TurnRunner.Failed`); the app only draws the outcome. The model
I/O runs in workers so the prompt stays responsive; step events are recorded as they come and redrawn at
most 30 times a second (:class:`tui.widgets.DenoiseView`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from textual import work
from textual.message import Message
from textual.widget import Widget

from assistant.client import DaemonUnavailable, Done, Step, Waiting
from assistant.wire import DoneStats
from tui.backend import Backend
from tui.conversation import Conversation
from tui.render import retried_stats, retry_label
from tui.settings import ChatSettings
from tui.widgets import AnswerView

log = logging.getLogger("diffu.chat")

CANCEL_WAIT = 3.0  # seconds to wait for the daemon to confirm a cancel before dropping the stream


class TurnRunner(Widget):
    """Generates, retries and cancels answers: the part of the chat that talks to the model."""

    DEFAULT_CSS = "TurnRunner { display: none; }"

    @dataclass
    class Answered(Message):
        """The answer ended (finished, cut short or cancelled) and is saved: draw its final view."""

        answer: AnswerView

    @dataclass
    class Failed(Message):
        """The answer could not be had: show ``error`` in its place."""

        answer: AnswerView
        error: Exception

    def __init__(
        self, backend: Backend, conversation: Conversation, connect: Callable[[], Awaitable[bool]]
    ) -> None:
        super().__init__()
        self.backend = backend
        self.conversation = conversation
        self._connect = connect  # the app's: reach the daemon (showing progress and failures)
        self.live: AnswerView | None = None  # the answer being generated

    def start(self, answer: AnswerView, messages: list[dict[str, str]], settings: ChatSettings) -> None:
        """Generate ``answer`` (mounted, live) to ``messages``."""
        self.live = answer
        self._generate(answer, messages, settings)

    @work(exclusive=True, group="generate")
    async def _generate(
        self, answer: AnswerView, messages: list[dict[str, str]], settings: ChatSettings
    ) -> None:
        try:
            if not await self._connect():
                raise DaemonUnavailable("not connected to the diffu daemon (see the error above)")
            done = await self._stream(answer, messages, settings)
            retry = settings.retry_for(done.text, done.finish_reason) if done is not None else None
            retried = None
            if done is not None and retry is not None:
                # The answer becomes the second decode's (see ChatSettings.retry_settings).
                retried = retried_stats(done.stats, retry)
                await answer.restart(retry.max_new_tokens, retry_label(retry))
                done = await self._stream(answer, messages, retry)
            if self.live is not answer:
                return
            if done is None:
                raise DaemonUnavailable("the daemon ended the stream without an answer")
            self.live = None
            # Saved before it is drawn: quitting while the Markdown renders must not lose the answer.
            answer.record(done, retried)
            self.conversation.add_answer(answer)
            answer.denoise.flush_now()
            self.post_message(self.Answered(answer))
        except asyncio.CancelledError:
            raise  # cancelled from the UI (which updates the view), or the app is closing
        except Exception as exc:  # shown inline with a Retry button; never a traceback on screen
            if self.live is not answer:
                return
            self.live = None
            log.debug("generation failed", exc_info=exc)
            self.post_message(self.Failed(answer, exc))

    async def _stream(
        self, answer: AnswerView, messages: list[dict[str, str]], settings: ChatSettings
    ) -> Done | None:
        """One decode into ``answer``'s live canvas: its Done, or None when the stream ended without one
        or the answer was cancelled from the UI meanwhile."""
        session = self.conversation.id
        async for event in self.backend.generate(messages, settings, session=session):
            if self.live is not answer:
                return None
            if isinstance(event, Step):
                answer.push(event)
            elif isinstance(event, Waiting):
                answer.wait(event)
            else:
                return event
        return None

    def cancel(self) -> None:
        """Cancel the answer being generated (the daemon frees the device at its next step)."""
        answer = self.live
        if answer is not None:
            answer.denoise.label = "cancelling…"
            answer.denoise.flush_now()
            self.run_worker(self.stop(answer), group="cancel")

    async def stop(self, answer: AnswerView) -> None:
        """Ask the daemon to stop the request, then stop reading its stream; the partial answer is saved
        as cancelled.

        Closing the stream alone would also cancel the job (the daemon watches for disconnects), but
        the explicit cancel frees the device at once even if the connection lingers.
        """
        if answer.request_id:
            try:
                await asyncio.wait_for(self.backend.cancel(answer.request_id), CANCEL_WAIT)
            except Exception as exc:  # the stream is dropped below either way
                log.debug("cancel request failed: %s", exc)
        if self.live is not answer:
            return  # it finished (or failed) while the cancel was on its way
        self.live = None
        self.workers.cancel_group(self, "generate")
        stats = DoneStats(steps=len(answer.trace), new_tokens=answer.trace.revealed())
        answer.record(Done(answer.request_id, "", "cancelled", stats=stats))
        self.conversation.add_answer(answer)
        self.post_message(self.Answered(answer))
