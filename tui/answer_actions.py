"""What the user does with the answers of ``diffu chat`` already on screen: replay their denoising step
by step, copy an answer or a code block, move the selection between code blocks."""

from __future__ import annotations

from textual.widgets.markdown import MarkdownFence

from tui.chat_base import ChatBase
from tui.render import Trace
from tui.screens import ReplayScreen
from tui.widgets import AnswerView


class AnswerActions(ChatBase):
    """Replay, copy and the code-block selection (``selected_fence``)."""

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
