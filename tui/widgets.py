"""The chat's widgets: the prompt, answers (their live canvas is :mod:`tui.denoise`), messages, notices,
inline errors, connect progress."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.text import Text
from textual import events, on
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.message import Message
from textual.widgets import Button, Label, Markdown, ProgressBar, Static, TextArea
from textual.widgets.markdown import MarkdownFence

from assistant.client import Done, Step, Waiting
from assistant.workspace.files import common_prefix, complete_path
from tui.commands import path_argument
from tui.denoise import DenoiseView
from tui.render import Trace, answer_stats, step_label, summary

EMPTY_ANSWER = "*(the model gave an empty answer)*"
_FINISH_NOTES = {
    "length": "used the whole canvas (max new tokens); the answer may be cut short",
    "time": "stopped at the daemon's time budget; the rest is unfinished",
}


class PromptInput(TextArea):
    """The prompt: Enter sends, shift+Enter / ctrl+j / alt+Enter add a line, up/down recall history, Tab
    completes a path after ``@`` or in a file command's arguments (under ``root``).

    History recall only happens on the first (up) or last (down) line, so multi-line prompts stay
    editable with the arrow keys; a half-typed prompt is kept as a draft while browsing.
    """

    DEFAULT_CSS = """
    PromptInput {
        height: auto;
        max-height: 12;
        min-height: 3;
    }
    """

    @dataclass
    class Submitted(Message):
        prompt: PromptInput
        text: str

    def __init__(self, history: list[str] | None = None, *, root: Path | None = None, **kwargs: Any) -> None:
        super().__init__(soft_wrap=True, show_line_numbers=False, highlight_cursor_line=False, **kwargs)
        self.root = root or Path.cwd()
        self.prompt_history: list[str] = list(history or [])
        self._index = len(self.prompt_history)  # len(history) means "the draft", not a history entry
        self._draft = ""

    def on_key(self, event: events.Key) -> None:
        # A subclass's handler runs before TextArea's own key handling; prevent_default() then keeps
        # TextArea from inserting the newline Enter would type.
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            if self.text.strip():
                self.post_message(self.Submitted(self, self.text))
        elif event.key in ("shift+enter", "ctrl+j", "alt+enter"):
            event.stop()
            event.prevent_default()
            start, end = self.selection
            self.replace("\n", start, end, maintain_selection_offset=False)
        elif event.key == "tab" and self.complete():
            event.stop()
            event.prevent_default()

    def complete(self) -> bool:
        """Complete the path at the cursor: the one match, or what all matches share (and list them);
        False where no path is being typed (Tab then moves the focus, as it does elsewhere)."""
        cursor = self.cursor_location
        before = self.document.get_text_range((0, 0), cursor)
        spot = path_argument(before, len(before))
        if spot is None:
            return False
        partial = spot[1]
        found = complete_path(partial, self.root)
        if not found:
            self.app.bell()
            return True
        insert = (
            found[0] + ("" if found[0].endswith("/") else " ") if len(found) == 1 else common_prefix(found)
        )
        start = (cursor[0], cursor[1] - len(partial))
        self.replace(insert, start, cursor, maintain_selection_offset=False)
        if len(found) > 1:
            shown = "  ".join(found[:24]) + ("  …" if len(found) > 24 else "")
            self.notify(shown, title=f"{len(found)} paths match", timeout=6)
        return True

    def action_cursor_up(self, select: bool = False) -> None:
        if not select and self.cursor_at_first_line and self._index > 0:
            self._recall(self._index - 1)
        else:
            super().action_cursor_up(select)

    def action_cursor_down(self, select: bool = False) -> None:
        if not select and self.cursor_at_last_line and self._index < len(self.prompt_history):
            self._recall(self._index + 1)
        else:
            super().action_cursor_down(select)

    def _recall(self, index: int) -> None:
        if self._index == len(self.prompt_history):
            self._draft = self.text
        self._index = index
        self.load_text(self._draft if index == len(self.prompt_history) else self.prompt_history[index])
        self.move_cursor(self.document.end)

    def remember(self, text: str) -> None:
        """Add a sent prompt to the history and clear the input."""
        if not self.prompt_history or self.prompt_history[-1] != text:
            self.prompt_history.append(text)
        self._index = len(self.prompt_history)
        self._draft = ""
        self.load_text("")


class UserMessage(Static):
    DEFAULT_CSS = """
    UserMessage {
        margin: 1 0 0 8;
        padding: 0 1;
        background: $boost;
        border-left: thick $accent;
    }
    """

    def __init__(self, text: str, *, files: list[str] | None = None) -> None:
        # Prompts are code and often contain [brackets]: the text is a Text, never markup.
        shown = Text(text)
        if files:  # what went with it: the files in context, as they were read for this turn
            shown.append(f"\nwith {', '.join(files)}", style="dim")
        super().__init__(shown)
        self.text = text
        self.files = list(files or ())


class Notice(Static):
    """One line of the chat's own in the log: what a command did, or why it did nothing (``error``)."""

    DEFAULT_CSS = """
    Notice { margin: 1 0 0 0; padding: 0 1; color: $text-muted; border-left: thick $primary 30%; }
    Notice.-error { color: $text-error; border-left: thick $error; }
    """

    def __init__(self, text: str, *, error: bool = False) -> None:
        # Markup off: the text names files and quotes code.
        super().__init__(text, markup=False, classes="-error" if error else "")
        self.text = text


class ErrorNotice(Vertical):
    """An inline error with a Retry button (and a Settings button when a setting was refused)."""

    DEFAULT_CSS = """
    ErrorNotice {
        height: auto;
        margin: 1 0 0 0;
        padding: 0 1;
        border-left: thick $error;
        background: $error 10%;
    }
    ErrorNotice > .error--message { color: $text-error; }
    ErrorNotice > Horizontal { height: auto; }
    ErrorNotice Button { margin: 0 1 0 0; min-width: 10; }
    """

    @dataclass
    class Retry(Message):
        notice: ErrorNotice

    def __init__(self, message: str, *, kind: str, settings_button: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.message = message
        self.kind = kind  # "connect" or "generate": what Retry does
        self.settings_button = settings_button

    def compose(self) -> ComposeResult:
        yield Static(Text(self.message), classes="error--message")
        with Horizontal():
            yield Button("Retry", id="retry", variant="error", compact=True)
            if self.settings_button:
                yield Button("Settings", id="open-settings", compact=True)

    @on(Button.Pressed, "#retry")
    def _retry(self, event: Button.Pressed) -> None:
        event.stop()
        self.post_message(self.Retry(self))

    @on(Button.Pressed, "#open-settings")
    def _settings(self, event: Button.Pressed) -> None:
        event.stop()
        self.app.action_settings()  # type: ignore[attr-defined]


class AnswerView(Vertical):
    """One assistant answer: the live canvas while it denoises, then Markdown with a stats line.

    ``message_id`` is its row in the chat database once saved; the trace is kept in memory for answers of
    this session and loaded from the database on demand for reopened ones.
    """

    DEFAULT_CSS = """
    AnswerView {
        height: auto;
        margin: 1 0 0 0;
        padding: 0 1;
        border-left: thick $primary 50%;
    }
    AnswerView.-live { border-left: thick $success; }
    AnswerView.-failed { border-left: none; padding: 0; }
    AnswerView > Markdown { margin: 0; padding: 0; }
    AnswerView > .answer--footer { color: $text-muted; height: auto; }
    AnswerView MarkdownFence.-selected { outline-left: thick $warning; }
    """

    def __init__(
        self,
        *,
        total: int = 0,
        content: str = "",
        finish_reason: str | None = None,
        stats: dict[str, Any] | None = None,
        trace: Trace | None = None,
        message_id: int | None = None,
        has_trace: bool = False,
        live: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.trace = trace if trace is not None else Trace(total)
        self.content = content
        self.finish_reason = finish_reason
        self.stats = stats or {}
        self.message_id = message_id
        self.has_trace = has_trace  # a reopened answer whose history is in the database, loaded on replay
        self.live = live
        self.request_id = ""
        if live:
            self.add_class("-live")

    def compose(self) -> ComposeResult:
        if self.live:
            yield DenoiseView(self.trace)
        else:
            yield from self._final_widgets()

    @property
    def denoise(self) -> DenoiseView:
        return self.query_one(DenoiseView)

    @property
    def replayable(self) -> bool:
        """Whether there is a denoising history to replay (none for an answer cancelled before its first
        step)."""
        return bool(self.trace.frames) or self.has_trace

    @property
    def answered(self) -> bool:
        """A finished answer that belongs in the conversation context (not cancelled, not failed)."""
        return not self.live and self.finish_reason not in (None, "cancelled") and bool(self.content)

    def push(self, step: Step) -> None:
        self.request_id = step.id or self.request_id
        self.denoise.push(step)

    def wait(self, waiting: Waiting) -> None:
        """The daemon compiles this answer's programs first: say so (and how long) until the first step."""
        self.request_id = waiting.id or self.request_id
        self.trace.waiting = waiting
        self.denoise.flush_now()

    async def restart(self, total: int, label: str) -> None:
        """A second decode replaces the first (its code did not parse): a new trace on a new canvas,
        headed by ``label``; the answer keeps only the second's trace, which replay shows."""
        self.trace = Trace(total)
        await self.remove_children()
        await self.mount(DenoiseView(self.trace, label=label))

    def record(self, done: Done, retried: dict[str, Any] | None = None) -> None:
        """Take the final text, finish reason and stats (before drawing them, so they can be saved);
        ``retried``: what is kept of a first decode (``render.retried_stats``)."""
        self.content = done.text
        self.finish_reason = done.finish_reason
        self.stats = answer_stats(done.stats, retried)

    async def finish(self) -> None:
        """The answer (recorded) is final: the canvas becomes Markdown (or stays, frozen, when cancelled)."""
        if self.finish_reason == "cancelled":
            self.denoise.label = ""  # no longer "cancelling…": the footer says what happened
            self.denoise.flush_now()
            await self.mount(Static(self._footer_text(), classes="answer--footer"))
        else:
            # The Markdown goes in before the canvas goes out: were the log to shrink in between, a reader
            # who scrolled up would be clamped to the bottom and pulled along again.
            canvas = list(self.children)
            markdown = Markdown()
            await self.mount_all([markdown, Static(self._footer_text(), classes="answer--footer")])
            # Markdown parses after mounting; wait for it, so code blocks exist once the answer is final.
            await markdown.update(self.content or EMPTY_ANSWER)
            await self.remove_children(canvas)
        self.live = False  # last: "not live" means the final view is complete
        self.remove_class("-live")

    async def fail(self, notice: ErrorNotice) -> None:
        self.live = False
        self.remove_class("-live")
        self.add_class("-failed")  # the notice has its own (red) border
        self.finish_reason = None
        await self.remove_children()
        await self.mount(notice)

    def _final_widgets(self) -> list[Any]:
        if self.finish_reason == "cancelled":
            widgets: list[Any] = [DenoiseView(self.trace)] if self.trace.frames else []
            return [*widgets, Static(self._footer_text(), classes="answer--footer")]
        return [
            Markdown(self.content or EMPTY_ANSWER),
            Static(self._footer_text(), classes="answer--footer"),
        ]

    def _footer_text(self) -> Content:
        stats = self.stats
        if self.finish_reason == "cancelled":
            last = self.trace.frames[-1] if self.trace.frames else None
            if last is not None:
                markup = f"[b]cancelled at {step_label(last.step, last.steps, last.block, last.blocks)}[/b]"
            else:
                markup = f"[b]cancelled after {stats.get('steps', 0)} steps[/b]"
        else:
            markup = summary(stats, len(self.trace))
            note = _FINISH_NOTES.get(self.finish_reason or "")
            if note:
                markup += f" · [i]{note}[/i]"
        if self.replayable:
            # A link: clicking it opens this answer's denoising history.
            markup += f"  [@click=app.replay_answer('{self.id}')]⟲ replay[/]"
        return Content.from_markup(markup)

    def code_blocks(self) -> list[MarkdownFence]:
        return list(self.query(MarkdownFence))


class ConnectPanel(Vertical):
    """Connection progress while a daemon starts, loads its model and compiles its shapes."""

    DEFAULT_CSS = """
    ConnectPanel {
        height: auto;
        padding: 0 1;
        background: $boost;
    }
    ConnectPanel > Horizontal { height: 1; }
    ConnectPanel #stage { width: auto; min-width: 12; text-style: bold; }
    ConnectPanel ProgressBar { width: 40; margin: 0 2; }
    ConnectPanel #detail { color: $text-muted; }
    """

    def compose(self) -> ComposeResult:
        with Horizontal():
            yield Label("connecting", id="stage")
            yield ProgressBar(total=1.0, show_eta=False, id="progress")
            yield Label("", id="detail")

    def report(self, stage: str, fraction: float, detail: str) -> None:
        self.query_one("#stage", Label).update(stage)
        self.query_one("#detail", Label).update(Text(detail))
        self.query_one(ProgressBar).update(progress=max(0.0, min(fraction, 1.0)))
