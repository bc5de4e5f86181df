"""Fill holes: find hole markers in a document, build the masked prompt, turn fills into edits.

A masked-diffusion model denoises every ``<|mask|>`` of its canvas together, wherever it sits, so all the
holes of a selection can be filled in one run with each fill seeing the others: something an
autoregressive assistant cannot do in one pass. A run of N ``<|mask|>`` markers is a hole of exactly N
tokens; the configurable marker (``???`` by default) is a hole of ``hole_tokens`` tokens.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from lsp.context import header_line, window
from lsp.postprocess import cut_special

MASK = "<|mask|>"


@dataclass(frozen=True)
class Hole:
    """A hole in the document: ``[start, end)`` character offsets and the canvas tokens it gets."""

    start: int
    end: int
    tokens: int


@dataclass(frozen=True)
class HolePrompt:
    """The masked text sent to the daemon and where it sits in the document."""

    text: str
    holes: list[Hole]
    offset: int  # document offset of the first character after the header


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


def masked_prompt(text: str, holes: list[Hole], *, path: str, language: str, budget_chars: int) -> HolePrompt:
    """The document with every hole replaced by its mask tokens, windowed around the holes.

    The span from the first hole to the last is always sent whole (each hole needs its neighbours); the
    rest of the budget goes to the text before and after that span, cut at line boundaries.
    """
    first, last = holes[0].start, holes[-1].end
    pieces, pos = [], first
    for hole in holes:
        pieces.append(text[pos : hole.start])
        pieces.append(MASK * hole.tokens)
        pos = hole.end
    span = "".join(pieces)
    header = header_line(path, language)
    # A mask token costs one token but eight characters; count the span's masks as single characters.
    left = budget_chars - len(header) - (len(span) - sum(h.tokens for h in holes) * (len(MASK) - 1))
    before, after, _ = window(text[:first], text[last:], max(left, 0), 0.7)
    return HolePrompt(text=header + before + span + after, holes=holes, offset=first - len(before))


def clean_fill(fill: str, document: str, hole: Hole) -> str:
    """A fill as it should replace its hole: special tokens cut, one line when the hole sits inside a line.

    A hole with code before or after it on its line is an expression or statement part: a newline in its
    fill would break the line. A hole alone on its line may take several lines, but not a trailing
    newline (the line already ends).
    """
    fill = cut_special(fill)
    line_start = document.rfind("\n", 0, hole.start) + 1
    line_end = document.find("\n", hole.end)
    line_end = len(document) if line_end < 0 else line_end
    inline = bool(document[line_start : hole.start].strip() or document[hole.end : line_end].strip())
    if inline:
        fill = fill.lstrip("\n").split("\n", 1)[0].rstrip()
        # Spaces around an inline fill are the document's business: keep what the marker had.
        return fill.strip() if fill.strip() else ""
    return fill.strip("\n").rstrip()
