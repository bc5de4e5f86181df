"""The conversation as shown: the welcome line, the prompts, the answers and the notices, anchored to the
bottom (it follows new output only while the user has not scrolled up), and the code block selected among
the answers' (ctrl+up/down; copied with ctrl+g, applied with /apply)."""

from __future__ import annotations

from textual.containers import VerticalScroll
from textual.widget import Widget
from textual.widgets.markdown import MarkdownFence

from tui.widgets import AnswerView, Notice


class ChatLog(VerticalScroll):
    """The scrolling log of the chat."""

    def __init__(self, *children: Widget, id: str | None = None) -> None:
        super().__init__(*children, id=id)
        self.selected: MarkdownFence | None = None

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

    def move_selection(self, delta: int) -> bool:
        """Select the next (``delta`` 1) or previous (-1) code block and scroll to it; False when there
        is no code block."""
        fences = self.fences()
        if not fences:
            return False
        if self.selected in fences:
            index = max(0, min(fences.index(self.selected) + delta, len(fences) - 1))
        else:
            index = len(fences) - 1 if delta < 0 else 0
        if self.selected is not None:
            self.selected.remove_class("-selected")
        self.selected = fences[index]
        self.selected.add_class("-selected")
        self.scroll_to_widget(self.selected, animate=False, top=True)
        return True
