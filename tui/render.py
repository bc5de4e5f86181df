"""Pure rendering of denoising steps (Rich only, no Textual), shared by the chat canvas and ``--once``.

A step event carries the generated region as text: every still-masked token is one ``░`` and ``masked`` /
``unmasked`` are character spans in that text (the tokens still masked, and those committed in this
step). A chat answer usually ends well before the region does; the rest fills up with stop/pad tokens
(``<|im_end|>``, ``<|endoftext|>``, ``<|dlm_pad|>``), which are drawn as one small dot each so that the
answer, not fifty copies of ``<|endoftext|>``, fills the screen.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from rich.style import Style
from rich.text import Text

from assistant.client import Step

MASK_GLYPH = "░"
SPECIAL_GLYPH = "·"
# Special tokens as the tokenizer spells them; DiffuCoder's are all <|name|>.
_SPECIAL = re.compile(r"<\|[A-Za-z0-9_]{1,40}\|>")


@dataclass(frozen=True)
class CanvasStyles:
    """How the three kinds of positions look; Textual fills this from component classes."""

    mask: Style = field(default_factory=lambda: Style(dim=True))
    fresh: Style = field(default_factory=lambda: Style(bold=True, color="black", bgcolor="bright_green"))
    special: Style = field(default_factory=lambda: Style(dim=True))


def canvas_text(step: Step, styles: CanvasStyles | None = None) -> Text:
    """The generated region of ``step``: masks dim, tokens unmasked in this step highlighted."""
    styles = styles or CanvasStyles()
    canvas = step.canvas
    # One style per character first (spans may overlap special tokens), then special tokens collapse
    # to one glyph that keeps the style of their first character.
    kinds = bytearray(len(canvas))  # 0 plain, 1 masked, 2 fresh
    for lo, hi in step.masked:
        kinds[max(lo, 0) : min(hi, len(canvas))] = b"\x01" * max(0, min(hi, len(canvas)) - max(lo, 0))
    for lo, hi in step.unmasked:
        kinds[max(lo, 0) : min(hi, len(canvas))] = b"\x02" * max(0, min(hi, len(canvas)) - max(lo, 0))
    by_kind = {0: Style(), 1: styles.mask, 2: styles.fresh}
    text = Text(no_wrap=False)
    pos = 0

    def plain(lo: int, hi: int) -> None:
        # Runs of one kind become one span: a canvas of a few thousand characters stays cheap to draw.
        start = lo
        for i in range(lo + 1, hi + 1):
            if i == hi or kinds[i] != kinds[start]:
                text.append(canvas[start:i], by_kind[kinds[start]])
                start = i

    for match in _SPECIAL.finditer(canvas):
        plain(pos, match.start())
        kind = kinds[match.start()]
        text.append(SPECIAL_GLYPH, styles.fresh if kind == 2 else styles.special)
        pos = match.end()
    plain(pos, len(canvas))
    return text


@dataclass
class Trace:
    """The denoising history of one answer: every step event, in order, and the region size.

    The recorders set each frame's ``seconds`` to the wall time since the request was sent: the daemon
    passes the runtime's own figure through, and that is the step's time for the JAX runtime but the
    time since the start for the fake one, so a rate needs a clock of our own.
    """

    total: int
    """Tokens in the generated region (the request's ``max_new_tokens``)."""
    frames: list[Step] = field(default_factory=list)

    def add(self, step: Step) -> None:
        self.frames.append(step)

    def __len__(self) -> int:
        return len(self.frames)

    def revealed(self, index: int = -1) -> int:
        """Tokens no longer masked after frame ``index``."""
        if not self.frames:
            return 0
        return max(0, self.total - self.frames[index].masks)

    def unmasked_per_step(self, upto: int | None = None) -> list[int]:
        """Tokens committed at each step (frames ``0..upto``), from the drop in the mask count."""
        frames = self.frames if upto is None else self.frames[: upto + 1]
        counts, before = [], self.total
        for frame in frames:
            counts.append(max(0, before - frame.masks))
            before = frame.masks
        return counts


def header_text(trace: Trace, index: int = -1, *, label: str = "") -> Text:
    """``step 12/64 · 87/128 tokens revealed · 412 tok/s`` for frame ``index`` of ``trace``."""
    text = Text()
    if label:
        text.append(label + "  ", style="bold")
    if not trace.frames:
        text.append("waiting for the first step…", style="dim")
        return text
    frame = trace.frames[index]
    revealed = trace.revealed(index)
    rate = revealed / frame.seconds if frame.seconds > 0 else 0.0
    text.append(f"step {frame.step + 1}/{frame.steps}", style="bold")
    text.append(" · ")
    text.append(f"{revealed}/{trace.total} tokens revealed")
    text.append(" · ")
    text.append(f"{rate:.0f} tok/s")
    return text
