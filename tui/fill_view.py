"""A file being filled (``/fill``): the file itself is the canvas, its holes' masks resolving step by step
in its own text (the glyphs of the chat's answers), then what the run filled."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from assistant.client import Step, Waiting
from assistant.infill.holes import FillPlan
from tui.denoise import CanvasView, DenoiseView
from tui.render import CanvasStyles, Trace, file_canvas


class FillView(Vertical):
    """The live view of one fill run over ``name``, then its outcome as a footer line."""

    DEFAULT_CSS = """
    FillView {
        height: auto;
        margin: 1 0 0 0;
        padding: 0 1;
        border-left: thick $success;
    }
    FillView.-done { border-left: thick $primary 50%; }
    FillView > .fill--title { text-style: bold; }
    FillView > .fill--footer { color: $text-muted; height: auto; }
    """

    def __init__(self, name: str, plan: FillPlan, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.name_shown = name
        self.plan = plan
        self.trace = Trace(plan.masks)

    def compose(self) -> ComposeResult:
        holes = len(self.plan.targets)
        yield Static(
            Text(f"filling {self.name_shown}: {holes} hole{'s' if holes != 1 else ''}"), classes="fill--title"
        )
        yield DenoiseView(self.trace, draw=self._draw)

    def on_mount(self) -> None:
        # Before the first step: the file as it is, its holes marked.
        plan = self.plan
        self.query_one(CanvasView).update(file_canvas(plan.before, plan.region, plan.after))

    def _draw(self, step: Step, styles: CanvasStyles) -> Text:
        return file_canvas(self.plan.before, step, self.plan.after, styles)

    @property
    def denoise(self) -> DenoiseView:
        return self.query_one(DenoiseView)

    def push(self, step: Step) -> None:
        self.denoise.push(step)

    def wait(self, waiting: Waiting) -> None:
        self.trace.waiting = waiting
        self.denoise.flush_now()

    async def finish(self, outcome: str) -> None:
        """The run is over: the last frame drawn, ``outcome`` under it."""
        if self.trace.frames:
            self.denoise.flush_now()
        self.add_class("-done")
        await self.mount(Static(Text(outcome), classes="fill--footer"))
