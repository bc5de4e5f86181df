"""A change to one of the user's files, shown before it is written (``/apply``, ``/fill``): its unified
diff, coloured, and two keys: ``y`` writes it, ``n`` (or escape) drops it. Nothing is written here: the
screen answers True or False and the caller writes (``assistant.workspace.edits``), refusing a file
that changed since this diff was made."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Footer, Static

from tui import keys


def diff_text(diff: str) -> Text:
    """A unified diff coloured as git colours it: additions green, removals red, hunks cyan."""
    text = Text(no_wrap=False)
    for line in diff.splitlines(keepends=True):
        if line.startswith(("+++", "---")):
            style = "bold"
        elif line.startswith("@@"):
            style = "cyan"
        elif line.startswith("+"):
            style = "green"
        elif line.startswith("-"):
            style = "red"
        else:
            style = ""
        # Carriage returns of a CRLF file would move the cursor: shown as nothing, as diff(1) pages do.
        text.append(line.replace("\r", ""), style)
    return text


class ReviewScreen(ModalScreen[bool]):
    """The diff of a change with its title and a one-line summary; dismissed with whether to write it."""

    BINDINGS = keys.bindings(*keys.REVIEW_IDS)
    DEFAULT_CSS = """
    ReviewScreen { align: center middle; }
    ReviewScreen > #review {
        width: 96%;
        height: 92%;
        border: round $warning;
        border-title-style: bold;
        background: $surface;
        padding: 0 1;
    }
    ReviewScreen #review-summary { height: auto; color: $text-muted; }
    ReviewScreen #review-diff { height: 1fr; }
    ReviewScreen #review-ask { height: 1; text-style: bold; }
    """

    def __init__(self, title: str, summary: str, diff: str) -> None:
        super().__init__()
        self.title_text = title
        self.summary = summary
        self.diff = diff

    def compose(self) -> ComposeResult:
        with Vertical(id="review"):
            yield Static(Text(self.summary), id="review-summary")
            with VerticalScroll(id="review-diff"):
                yield Static(diff_text(self.diff))
            yield Static("Write it? y writes it, n drops it", id="review-ask")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#review").border_title = self.title_text
        self.query_one("#review-diff").focus()

    def action_write(self) -> None:
        self.dismiss(True)

    def action_drop(self) -> None:
        self.dismiss(False)
