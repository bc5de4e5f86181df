"""The conversation as shown: the welcome line, the prompts, the answers and the notices, anchored to the
bottom (it follows new output only while the user has not scrolled up); what the user does with the
answers shown (replay their denoising, copy one, walk and copy their code blocks), and the code block
selected among them (ctrl+up/down; copied with ctrl+g, applied with /apply)."""

from __future__ import annotations

from collections.abc import Callable

from textual.containers import VerticalScroll
from textual.widget import Widget
from textual.widgets.markdown import MarkdownFence

from tui.render import Trace
from tui.screens import ReplayScreen
from tui.store import StoredMessage
from tui.widgets import AnswerView, Notice, UserMessage


class ChatLog(VerticalScroll):
    """The scrolling log of the chat."""

    def __init__(self, *children: Widget, id: str | None = None) -> None:
        super().__init__(*children, id=id)
        self.selected: MarkdownFence | None = None
        self._answers = 0  # answers made, numbering their widget ids

    def new_answer_id(self) -> str:
        self._answers += 1
        return f"answer-{self._answers}"

    async def add(self, widget: Widget) -> None:
        """Mount ``widget`` at the end and show it (scrolling only a reader who is at the bottom)."""
        await self.mount(widget)
        self.scroll_end(animate=False)

    async def say(self, text: str, *, error: bool = False) -> None:
        """One line of the chat's own (a command's result or refusal), in the log."""
        await self.add(Notice(text, error=error))

    async def clear(self) -> None:
        """Remove the conversation's widgets: the welcome line and a connection error stay, since neither
        belongs to the conversation."""
        self.selected = None
        keep = ("welcome", "connect-error")
        await self.remove_children([w for w in self.children if not any(map(w.has_class, keep))])

    # -- answers and their code blocks -----------------------------------------------------------------
    def answers(self) -> list[AnswerView]:
        return list(self.query(AnswerView))

    def fences(self) -> list[MarkdownFence]:
        return list(self.query(MarkdownFence))

    def code_block(self) -> MarkdownFence | None:
        """The selected code block, else the last one shown; None when there is none."""
        fences = self.fences()
        if self.selected in fences:
            return self.selected
        return fences[-1] if fences else None

    def move_selection(self, delta: int) -> None:
        """Select the next (``delta`` 1) or previous (-1) code block and scroll to it."""
        fences = self.fences()
        if not fences:
            self.notify("No code blocks in this conversation.", severity="warning")
            return
        if self.selected in fences:
            index = max(0, min(fences.index(self.selected) + delta, len(fences) - 1))
        else:
            index = len(fences) - 1 if delta < 0 else 0
        if self.selected is not None:
            self.selected.remove_class("-selected")
        self.selected = fences[index]
        self.selected.add_class("-selected")
        self.scroll_to_widget(self.selected, animate=False, top=True)

    async def show(self, messages: list[StoredMessage], stored_trace: Callable[[int], Trace | None]) -> None:
        """Show a saved conversation's messages (``stored_trace``: a saved answer's history by id)."""
        widgets: list[Widget] = []
        for message in messages:
            if message.role == "user":
                widgets.append(UserMessage(message.content))
                continue
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
                    trace=stored_trace(message.id) if cancelled else None,
                    id=self.new_answer_id(),
                )
            )
        await self.mount_all(widgets)
        self.anchor()

    def replay(self, load: Callable[[AnswerView], Trace | None], widget_id: str | None = None) -> None:
        """Open the replay of the answer ``widget_id``, else of the one holding the selected code block,
        else of the last; ``load`` fetches a reopened answer's history."""
        answers = [a for a in self.answers() if a.replayable]
        if widget_id is not None:
            index = next((i for i, a in enumerate(answers) if a.id == widget_id), None)
            if index is not None:
                self.app.push_screen(ReplayScreen(answers, index, load))
            return
        if not answers:
            self.notify("No answer to replay yet.", severity="warning")
            return
        selected = self.selected
        target = next((a for a in answers if selected in a.code_blocks()), answers[-1])
        self.app.push_screen(ReplayScreen(answers, answers.index(target), load))

    def copy_answer(self) -> None:
        answers = [a for a in self.answers() if a.answered]
        if not answers:
            self.notify("No answer to copy yet.", severity="warning")
            return
        self._copy(answers[-1].content, "the answer")

    def copy_code(self) -> None:
        fence = self.code_block()
        if fence is None:
            self.notify("No code block to copy.", severity="warning")
            return
        self._copy(fence.code, "the code block")

    def _copy(self, text: str, what: str) -> None:
        self.app.copy_to_clipboard(text)  # OSC 52: works over SSH and in tmux with set-clipboard on
        lines = text.count("\n") + 1
        self.notify(f"Copied {what} ({lines} line{'s' if lines != 1 else ''}).")
