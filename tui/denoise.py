"""The live denoising view: a trace drawn as a header, the canvas and a sparkline, live (coalesced redraws)
or any frame of it (replay). Used by the answers (:class:`tui.widgets.AnswerView`) and the replay screen."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.timer import Timer
from textual.widgets import Label, Sparkline, Static

from assistant.client import Step
from tui.render import CanvasStyles, Trace, canvas_text, header_text

MAX_REDRAWS_PER_SECOND = 30
Draw = Callable[[Step, CanvasStyles], Text]
"""How a step's canvas is drawn: the region alone (an answer), or inside the file it fills (``/fill``)."""


class CanvasView(Static):
    """The generated region's text; its component classes style the three kinds of position."""

    COMPONENT_CLASSES = {"canvas--mask", "canvas--fresh", "canvas--special"}
    DEFAULT_CSS = """
    CanvasView { height: auto; }
    CanvasView > .canvas--mask { color: $foreground 35%; }
    CanvasView > .canvas--fresh { color: $background; background: $success; text-style: bold; }
    CanvasView > .canvas--special { color: $foreground 25%; }
    """

    def __init__(self, draw: Draw = canvas_text) -> None:
        super().__init__()
        self.draw = draw

    def show_step(self, step: Step) -> None:
        styles = CanvasStyles(
            mask=self.get_component_rich_style("canvas--mask"),
            fresh=self.get_component_rich_style("canvas--fresh"),
            special=self.get_component_rich_style("canvas--special"),
        )
        self.update(self.draw(step, styles))


class DenoiseView(Vertical):
    """A trace drawn as header (step i/N, tokens revealed, tokens/s), canvas and tokens-per-step sparkline.

    Live: :meth:`push` records every step but redraws at most ``MAX_REDRAWS_PER_SECOND`` times a second;
    a fast model sends steps far quicker than a terminal can be repainted, and the prompt must stay
    responsive meanwhile. Replay: :meth:`show` draws any frame.
    """

    DEFAULT_CSS = """
    DenoiseView { height: auto; }
    DenoiseView > .denoise--header { height: 1; color: $text-muted; }
    DenoiseView > Horizontal { height: 1; margin: 0 0 1 0; }
    DenoiseView .denoise--spark-label { width: auto; color: $text-muted; }
    DenoiseView Sparkline { height: 1; width: 1fr; }
    """

    def __init__(self, trace: Trace, *, label: str = "", draw: Draw = canvas_text, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.trace = trace
        self.label = label
        self.draw = draw
        self.index = -1
        self.redraws = 0
        self._pending = False
        self._timer: Timer | None = None
        self._last_draw = 0.0

    def compose(self) -> ComposeResult:
        yield Static(header_text(self.trace, label=self.label), classes="denoise--header")
        yield CanvasView(self.draw)
        with Horizontal():
            yield Label("tokens unmasked per step ", classes="denoise--spark-label")
            yield Sparkline([], id="sparkline")

    def on_mount(self) -> None:
        if self.trace.frames:
            self.show(self.index)

    def push(self, step: Step) -> None:
        """Record a live step; the redraw is coalesced with the steps that follow within 1/30 s."""
        self.trace.add(step)
        if self._timer is not None:
            self._pending = True  # the scheduled redraw will show this step
            return
        wait = self._last_draw + 1 / MAX_REDRAWS_PER_SECOND - time.monotonic()
        if wait <= 0:
            self.show(-1)  # slower than 30 steps a second: draw every step at once
        else:
            self._pending = True
            self._timer = self.set_timer(wait, self._flush)

    def _flush(self) -> None:
        self._timer = None
        if self._pending:
            self._pending = False
            self.show(-1)

    def show(self, index: int) -> None:
        """Draw frame ``index`` of the trace (negative counts from the end)."""
        if not self.trace.frames:  # the header alone: waiting for the first step, and why
            self.query_one(".denoise--header", Static).update(header_text(self.trace, label=self.label))
            return
        self.index = index % len(self.trace.frames)
        self.query_one(".denoise--header", Static).update(
            header_text(self.trace, self.index, label=self.label)
        )
        self.query_one(CanvasView).show_step(self.trace.frames[self.index])
        self.query_one(Sparkline).data = [float(n) for n in self.trace.unmasked_per_step(self.index)]
        self.redraws += 1
        self._last_draw = time.monotonic()

    def flush_now(self) -> None:
        """Draw the newest step at once (when generation ends, so the last frame is never skipped)."""
        if self._timer is not None:
            self._timer.stop()
            self._timer = None
        self._pending = False
        self.show(-1)
