"""Fill holes: find hole markers in a text, build the masked prompt, clean the fills, put them in.

A masked-diffusion model denoises every ``<|mask|>`` of its canvas together, wherever it sits, so all the
holes of a selection can be filled in one run with each fill seeing the others: something an
autoregressive assistant cannot do in one pass. A run of N ``<|mask|>`` markers is a hole of exactly N
tokens; the configurable marker (``???`` by default) is a hole of ``hole_tokens`` tokens. Holes outside
the selection are masks in the prompt too (the model sees them as holes, as it sees those inside), but
only the selection's fills are applied.

One implementation for every front end: the language server's fill-holes action (``lsp.fill``), ``diffu
fill`` and the chat's ``/fill`` all find, mask, finish and apply holes here. Plain Python, no JAX.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from assistant.infill.context import Mode, classify, header_line, window
from assistant.infill.postprocess import align_indent, postprocess
from model_runtime.options import like, option, validate
from model_runtime.params import SamplingParams

MASK = "<|mask|>"


def _trimmed(value: str) -> str:
    return "" if value.strip() == value else "must not start or end with whitespace"


@dataclass(frozen=True, kw_only=True)
class FillOptions:
    """How holes are marked and filled, declared once: the editors' settings (``lsp.settings``) and
    ``diffu fill``'s flags are views of these options."""

    hole_marker: str = option(
        "???",
        rule=_trimmed,
        help="Marks a hole for fill-holes besides ``<|mask|>``; empty: only ``<|mask|>``.",
    )
    hole_tokens: int = option(
        16,
        ge=1,
        le=1024,
        help="Canvas tokens per marker hole (a run of N ``<|mask|>`` is a hole of exactly N tokens).",
    )
    # Greedy by default, as the editors fill: a fill should be the model's most probable text.
    temperature: float = like(SamplingParams, "temperature", default=0.0, help="0 is greedy")

    def __post_init__(self) -> None:
        validate(self)


@dataclass(frozen=True)
class Hole:
    """A hole in the document: ``[start, end)`` character offsets and the canvas tokens it gets."""

    start: int
    end: int
    tokens: int


@dataclass(frozen=True)
class HolePrompt:
    """The masked text sent to the daemon and the holes it holds, in order (one fill comes back for each)."""

    text: str
    holes: list[Hole]


class HoleError(Exception):
    """The holes cannot be filled as marked (the message says why and what to do)."""


def _pattern(marker: str) -> re.Pattern[str]:
    parts = [f"(?:{re.escape(MASK)})+"]
    if marker and marker != MASK:
        parts.append(re.escape(marker))
    return re.compile("|".join(parts))


def find_holes(
    text: str, marker: str, hole_tokens: int, start: int = 0, end: int | None = None
) -> list[Hole]:
    """Holes lying wholly inside ``text[start:end]``, in document order."""
    end = len(text) if end is None else end
    holes = []
    for m in _pattern(marker).finditer(text):
        if m.start() < start or m.end() > end:
            continue
        found = m.group(0)
        tokens = found.count(MASK) if found.startswith(MASK) else hole_tokens
        holes.append(Hole(m.start(), m.end(), tokens))
    return holes


def mask_holes(text: str, holes: list[Hole]) -> tuple[str, list[tuple[int, int]]]:
    """``text`` with every hole replaced by its mask tokens, and each hole's ``[start, end)`` in it."""
    pieces, spans, pos, out_len = [], [], 0, 0
    for hole in sorted(holes, key=lambda h: h.start):
        pieces.append(text[pos : hole.start])
        out_len += hole.start - pos
        pieces.append(MASK * hole.tokens)
        spans.append((out_len, out_len + hole.tokens * len(MASK)))
        out_len += hole.tokens * len(MASK)
        pos = hole.end
    pieces.append(text[pos:])
    return "".join(pieces), spans


def masked_prompt(
    text: str,
    targets: list[Hole],
    *,
    others: Sequence[Hole] = (),
    path: str,
    language: str,
    budget_chars: int,
) -> HolePrompt:
    """The document with every hole masked, windowed around the ``targets``.

    The span from the first target to the last is always sent whole (each hole needs its neighbours); the
    rest of the budget goes to the text before and after that span, cut at line boundaries. ``others``
    (holes outside the selection) inside the window are masks like the targets; the returned holes are
    all the holes the prompt holds, in order.
    """
    holes = sorted({*targets, *others}, key=lambda h: h.start)
    masked, spans = mask_holes(text, holes)
    index = {h: i for i, h in enumerate(holes)}
    first, last = spans[index[targets[0]]][0], spans[index[targets[-1]]][1]
    span = masked[first:last]
    header = header_line(path, language)
    # A mask token costs one token but eight characters; count each as one character of the budget.
    inner_masks = sum(h.tokens for h, (s, e) in zip(holes, spans, strict=True) if s >= first and e <= last)
    left = budget_chars - len(header) - (len(span) - inner_masks * (len(MASK) - 1))
    before, after, _ = window(masked[:first], masked[last:], max(left, 0), 0.7)
    lo, hi = first - len(before), last + len(after)
    kept = [h for h, (s, e) in zip(holes, spans, strict=True) if s >= lo and e <= hi]
    return HolePrompt(text=header + before + span + after, holes=kept)


def finish_fill(fill: str, document: str, hole: Hole) -> str:
    """A fill as it should replace its hole, through the post-processing suggestions get.

    A hole with code before or after it on its line is part of an expression or statement: its fill is
    one line, cut where it repeats the code after it. A hole alone on its line may take several lines
    (not a trailing newline: the line already ends), cut where it repeats the line above or the code
    below or leaves the hole's indentation block, with its first line starting at the hole's column.
    Returns "" when nothing worth inserting is left (the marker then stays, so the user sees it).
    """
    line_start = document.rfind("\n", 0, hole.start) + 1
    line_end = document.find("\n", hole.end)
    line_end = len(document) if line_end < 0 else line_end
    before_on_line = document[line_start : hole.start]
    after_on_line = document[hole.end : line_end]
    above = document[:line_start].rstrip("\r\n")
    line_above = above[above.rfind("\n") + 1 :]
    inline = bool(before_on_line.strip() or after_on_line.strip())
    mode = Mode.SINGLE_LINE if inline else classify(before_on_line, after_on_line, line_above)
    text = postprocess(
        fill.lstrip("\n") if inline else fill.strip("\n"),
        suffix=document[hole.end :],
        mode=mode,
        cursor_line=before_on_line,
        line_above=line_above,
        min_chars=1,
    )
    if text is None:
        return ""
    # Spaces around an inline fill are the document's business: keep what the marker had.
    return text.strip() if inline else align_indent(text, before_on_line)


def split_by_range(holes: Sequence[Hole], start: int, end: int) -> tuple[list[Hole], list[Hole]]:
    """(the holes lying wholly inside ``[start, end)``, the others); an empty range selects them all."""
    if start >= end:
        return list(holes), []
    inside = [h for h in holes if h.start >= start and h.end <= end]
    return inside, [h for h in holes if h not in inside]


@dataclass(frozen=True)
class FillPlan:
    """One fill run over a whole text: the prompt to send, the holes to fill, and where the prompt's
    region (its first hole to its last, the part a step event shows) sits in the text."""

    text: str
    prompt: HolePrompt
    targets: list[Hole]

    @property
    def before(self) -> str:
        """The text before the region: what a live view shows above the step's canvas."""
        return self.text[: self.prompt.holes[0].start]

    @property
    def after(self) -> str:
        """The text after the region."""
        return self.text[self.prompt.holes[-1].end :]

    @property
    def region(self) -> str:
        """The region as the text has it, holes marked: what a live view shows before the first step."""
        return self.text[self.prompt.holes[0].start : self.prompt.holes[-1].end]

    @property
    def masks(self) -> int:
        """Mask tokens in the prompt: the daemon's steps default to one per mask."""
        return sum(h.tokens for h in self.prompt.holes)


def plan_fill(
    text: str,
    *,
    path: str,
    language: str,
    options: FillOptions,
    start: int = 0,
    end: int | None = None,
) -> FillPlan:
    """The run that fills the holes of ``text[start:end]`` (all of them by default), the whole text sent
    (a text too long for the model's context is the daemon's error to report, never cut here); raises
    HoleError when there is nothing to fill."""
    holes = find_holes(text, options.hole_marker, options.hole_tokens)
    targets, others = split_by_range(holes, start, len(text) if end is None else end)
    if not targets:
        marker = f" or {options.hole_marker}" if options.hole_marker else ""
        where = "" if start == 0 and end is None else " in that range"
        raise HoleError(f"{path}: no holes to fill{where} (mark them with <|mask|>{marker})")
    # Room for the whole masked text, the holes outside the target span counted at their full length.
    budget = len(header_line(path, language)) + len(text) + sum(h.tokens * len(MASK) for h in holes)
    prompt = masked_prompt(text, targets, others=others, path=path, language=language, budget_chars=budget)
    return FillPlan(text, prompt, targets)


def target_fills(
    text: str, prompt: HolePrompt, targets: Sequence[Hole], raw: Sequence[str] | None
) -> list[str]:
    """The finished fill of each target from the daemon's fills of the prompt's holes (``Done.holes``,
    one per hole in order); "" where the model gave nothing worth inserting."""
    if raw is None or len(raw) != len(prompt.holes):
        got = "none" if raw is None else str(len(raw))
        raise HoleError(
            f"the daemon filled {got} holes of the {len(prompt.holes)} sent; holes that touch are one run "
            "of masks to the model: put a space or a line between them"
        )
    fills = dict(zip(prompt.holes, raw, strict=True))
    return [finish_fill(fills[h], text, h) for h in targets]


def apply_fills(text: str, targets: Sequence[Hole], fills: Sequence[str]) -> str:
    """``text`` with each target replaced by its fill; a hole whose fill is "" keeps its marker, so the
    user sees which one the model skipped. Every character outside the filled holes is kept."""
    pieces, pos = [], 0
    for hole, fill in sorted(zip(targets, fills, strict=True), key=lambda pair: pair[0].start):
        if fill:
            pieces += [text[pos : hole.start], fill]
            pos = hole.end
    pieces.append(text[pos:])
    return "".join(pieces)
