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
from typing import Any

from rich.style import Style
from rich.text import Text

from assistant.client import Step, Waiting
from assistant.wire import DoneStats

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

    A step is one forward of the model, with either decoder. Each frame's ``seconds`` is that step's own
    time on the daemon (not the wait for a compile or for other requests), so the rate a header shows
    is generation speed: tokens revealed over the steps' summed time.
    """

    total: int
    """Tokens in the generated region (the request's ``max_new_tokens``)."""
    frames: list[Step] = field(default_factory=list)
    waiting: Waiting | None = field(default=None, compare=False)
    """Why the first step has not come yet (its programs compile), when the daemon said so; not part of
    the history (nor saved with it)."""

    def add(self, step: Step) -> None:
        self.frames.append(step)

    def __len__(self) -> int:
        return len(self.frames)

    def revealed(self, index: int = -1) -> int:
        """Tokens no longer masked after frame ``index``."""
        if not self.frames:
            return 0
        return max(0, self.total - self.frames[index].masks)

    def elapsed(self, index: int = -1) -> float:
        """Generation seconds up to and including frame ``index``."""
        upto = index % len(self.frames) + 1 if self.frames else 0
        return sum(frame.seconds for frame in self.frames[:upto])

    def unmasked_per_step(self, upto: int | None = None) -> list[int]:
        """Tokens committed at each step (frames ``0..upto``), from the drop in the mask count."""
        frames = self.frames if upto is None else self.frames[: upto + 1]
        counts, before = [], self.total
        for frame in frames:
            counts.append(max(0, before - frame.masks))
            before = frame.masks
        return counts


def step_label(step: int, steps: int, block: int = 0, blocks: int = 0) -> str:
    """``step 12/64`` (the reference decoder: a fixed number of steps), or ``step 12 · block 2/8`` (the
    fast decoder: it ends a block as soon as no position in it is masked, so only blocks are counted)."""
    if blocks:
        return f"step {step + 1} · block {block + 1}/{blocks}"
    return f"step {step + 1}/{steps}"


def waiting_text(waiting: Waiting) -> str:
    """``compiling the program for 1 x 320 tokens, fast decoder (about 6 s)…``"""
    eta = f" (about {waiting.eta_seconds:.0f} s)" if waiting.eta_seconds is not None else ""
    return f"{waiting.detail}{eta}…"


def header_text(trace: Trace, index: int = -1, *, label: str = "") -> Text:
    """``step 12/64 · 87/128 tokens revealed · 412 tok/s`` for frame ``index`` of ``trace``."""
    text = Text()
    if label:
        text.append(label + "  ", style="bold")
    if not trace.frames:
        waiting = waiting_text(trace.waiting) if trace.waiting else "waiting for the first step…"
        text.append(waiting, style="dim")
        return text
    frame = trace.frames[index]
    revealed = trace.revealed(index)
    elapsed = trace.elapsed(index)
    rate = revealed / elapsed if elapsed > 0 else 0.0
    text.append(step_label(frame.step, frame.steps, frame.block, frame.blocks), style="bold")
    text.append(" · ")
    text.append(f"{revealed}/{trace.total} tokens revealed")
    text.append(" · ")
    text.append(f"{rate:.0f} tok/s")
    return text


def summary(stats: dict[str, Any], steps: int = 0) -> str:
    """``182 tokens · 57 steps · 1.9s · 96 tok/s``: a finished answer's stats (``steps``: the trace's
    length, when the stats lack it). The time and rate are generation only; a compile the answer waited
    for is named apart."""
    parts = [f"{stats.get('new_tokens', 0)} tokens", f"{stats.get('steps', steps)} steps"]
    if "generate_seconds" in stats:
        parts.append(f"{float(stats['generate_seconds']):.1f}s")
    if "tokens_per_second" in stats:
        parts.append(f"{float(stats['tokens_per_second']):.0f} tok/s")
    if float(stats.get("compile_seconds", 0.0)) >= 0.05:
        parts.append(f"after {float(stats['compile_seconds']):.1f}s compiling")
    retried = stats.get("retried")
    if isinstance(retried, dict):
        parts.append(retried_note(retried))
    return " · ".join(parts)


# -- the second decode of an answer whose code does not parse (ChatSettings.retry_settings) ---------------
def retry_label(retry: Any) -> str:
    """What the live view says while the second decode runs (``retry``: its ChatSettings)."""
    return f"the code did not parse: decoding again in blocks of {retry.block_length}"


def retried_stats(first: DoneStats, retry: Any) -> dict[str, Any]:
    """What an answer's stats keep of its first decode when it was decoded again with ``retry`` (its
    ChatSettings): ``stats["retried"]``."""
    return {"block_length": retry.block_length, "first_seconds": first.generate_seconds}


def answer_stats(stats: DoneStats, retried: dict[str, Any] | None = None) -> dict[str, Any]:
    """The stats a chat keeps with an answer (and saves): the daemon's, plus its first decode's when
    the answer was decoded twice (``retried``, from :func:`retried_stats`)."""
    kept = stats.to_dict()
    if retried is not None:
        kept["retried"] = retried
    return kept


def retried_note(retried: dict[str, Any]) -> str:
    """``decoded twice: the first answer's code did not parse (1.2s); this one used blocks of 128``."""
    spent = f" ({float(retried['first_seconds']):.1f}s)" if "first_seconds" in retried else ""
    block = retried.get("block_length")
    return f"decoded twice: the first answer's code did not parse{spent}; this one used blocks of {block}"


# -- a file as the canvas (diffu fill, /fill) --------------------------------------------------------------
FILE_CONTEXT_LINES = 6  # lines of the file shown above the first hole and below the last


def file_canvas(
    before: str,
    region: Step | str,
    after: str,
    styles: CanvasStyles | None = None,
    *,
    context_lines: int = FILE_CONTEXT_LINES,
) -> Text:
    """A file being filled, as it stands at a step: the step's region (its first hole to its last, masks
    dim, this step's tokens highlighted) between the file's text before and after it, numbered lines,
    ``context_lines`` of them around the region. ``region`` is the file's own text before the first step.
    """
    head = before.split("\n")
    tail = after.split("\n")
    if len(tail) > 1 and not tail[-1]:
        tail.pop()  # the file's last newline ends its last line; it starts no line of its own
    shown_head = head[-(context_lines + 1) :]
    first_line = len(head) - len(shown_head) + 1
    text = Text("\n".join(shown_head))
    text.append_text(canvas_text(region, styles) if isinstance(region, Step) else Text(region))
    text.append("\n".join(tail[: context_lines + 1]))
    lines = text.split("\n", allow_blank=True)
    numbered = Text(no_wrap=False)
    dim = (styles or CanvasStyles()).special
    if first_line > 1:
        numbered.append("     ⋮\n", dim)
    for n, line in enumerate(lines, start=first_line):
        numbered.append(f"{n:>4} │ ", dim)
        numbered.append_text(line)
        numbered.append("\n")
    if len(tail) > context_lines + 1:
        numbered.append("     ⋮\n", dim)
    numbered.rstrip()
    return numbered
