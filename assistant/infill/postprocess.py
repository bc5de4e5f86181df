"""Post-processing of an infill before it is shown: the pipeline editor completion servers converged on.

Order matters: special tokens first (they end the text), then markdown fences (a model that has seen
chat answers wraps code in them), then the single-line cut (or the blank lines a block starts with),
suffix overlap, repeated lines, indentation scope, and last the minimum length. Every step is a pure
function on strings so each is tested alone.
"""

from __future__ import annotations

from assistant.infill.context import Mode

# Decoded special tokens end the text: end-of-text and pad tokens inside the canvas mean the model chose
# a shorter answer. The daemon already cuts at the model's stop ids; these catch the others (a file
# separator starts another file, a stray mask was never filled).
STOP_STRINGS = (
    "<|endoftext|>",
    "<|dlm_pad|>",
    "<|im_end|>",
    "<|im_start|>",
    "<|file_sep|>",
    "<|fim_pad|>",
    "<|fim_prefix|>",
    "<|fim_suffix|>",
    "<|fim_middle|>",
    "<|repo_name|>",
    "<|mask|>",
    "<|beginoftext|>",
)
_CLOSERS = {")": "(", "]": "[", "}": "{"}
MIN_OVERLAP = 4  # a shorter text/suffix overlap is cut only when it is closing brackets the text opened not


def cut_special(text: str) -> str:
    cuts = [i for i in (text.find(s) for s in STOP_STRINGS) if i >= 0]
    return text[: min(cuts)] if cuts else text


def first_line(text: str) -> str:
    """Single-line mode: up to the first newline. A text that starts with a newline keeps its next line."""
    if text.startswith("\n"):
        return "\n" + text[1:].split("\n", 1)[0]
    return text.split("\n", 1)[0]


FENCE = "```"  # a markdown code fence; no programming language starts a line with three backticks


def is_fence(line: str) -> bool:
    """A markdown fence line: an opening one (three backticks, a language or none) or a closing one."""
    return line.lstrip().startswith(FENCE)


def cut_fences(text: str, cursor_line: str) -> str:
    """The code inside markdown fences, never a fence line: a leading fence (on the first line that holds
    anything) is dropped with the blank lines before it, and the text ends before the next fence (the
    closing one, or the opening of another block). The code between the fences is often the right code,
    so it is kept rather than the whole answer dropped; a bare fence leaves nothing, which the minimum
    length then drops.

    After text on the cursor's line the text's first line continues that line: it is no line of its own,
    and when it holds code, the code has started and a fence after it can only close.
    """
    lines = text.split("\n")
    own = 1 if cursor_line.strip() else 0
    head, body = lines[:own], lines[own:]
    first = next((i for i, line in enumerate(body) if line.strip()), None)
    if first is not None and is_fence(body[first]) and not (head and head[0].strip()):
        body = body[first + 1 :]
    end = next((i for i, line in enumerate(body) if is_fence(line)), len(body))
    return "\n".join(head + body[:end])


def drop_leading_blank_lines(text: str, cursor_line: str) -> str:
    """The lines that hold nothing at the start of the suggestion: accepting them would insert blank
    lines before the code. On a blank cursor line the text's first line is a whole line and goes with
    them; after text on the cursor line (an opener such as ``class Mode(Enum):``) the first line
    continues the cursor's line, and when it holds nothing, one line break stays to start the body."""
    lines = text.split("\n")
    if cursor_line.strip():
        if lines[0].strip() or len(lines) == 1:
            return text  # code continues the cursor's line: later blank lines are the code's own
        lines = lines[1:]
        first = next((i for i, line in enumerate(lines) if line.strip()), len(lines))
        return "\n" + "\n".join(lines[first:])
    first = next((i for i, line in enumerate(lines) if line.strip()), len(lines))
    return "\n".join(lines[first:])


def _balance(text: str) -> int:
    """Opening minus closing brackets (quotes ignored): < 0 means the text closes what came before it."""
    depth = 0
    for ch in text:
        if ch in "([{":
            depth += 1
        elif ch in _CLOSERS:
            depth -= 1
    return depth


def cut_suffix_overlap(text: str, suffix: str) -> str:
    """Remove the end of ``text`` that repeats the start of ``suffix`` (the code after the cursor).

    Two cases. A long overlap (MIN_OVERLAP characters or more, not just whitespace) is the model
    regenerating what follows. A short one made of closing brackets or quotes is cut only when the text
    closes more than it opens: ``"hi")`` before an auto-closed ``)`` loses its ``)``, but ``f(x)`` before a
    ``)`` keeps it. Then, line-wise: a completion line equal to the first non-blank line of the suffix
    starts a repeat of the code below, so the completion ends before it.
    """
    head = suffix[: len(text)]
    for k in range(min(len(text), len(head)), 0, -1):
        overlap = head[:k]
        if not text.endswith(overlap) or not overlap.strip():
            continue
        if k >= MIN_OVERLAP:
            return text[:-k]
        stripped = overlap.strip()
        if all(c in ")]}\"'`;," for c in stripped) and _balance(text) <= -sum(
            c in _CLOSERS for c in stripped
        ):
            return text[:-k]
    next_line = next((line.strip() for line in suffix.split("\n") if line.strip()), "")
    if next_line:
        lines = text.split("\n")
        for i in range(1, len(lines)):
            if lines[i].strip() == next_line:
                return "\n".join(lines[:i]).rstrip(" \t")
    return text


def drop_repeated_lines(text: str, cursor_line: str, line_above: str) -> str:
    """End the completion where the model starts looping: at a non-blank line equal to the non-blank line
    before it. When the cursor sits on a blank line the completion's first line is a whole line and is
    compared with the line above; otherwise it continues the cursor's line, which joins the comparison."""
    lines = text.split("\n")
    if cursor_line.strip():
        previous, start = (cursor_line + lines[0]).strip(), 1
    else:
        previous, start = line_above.strip(), 0
    for i in range(start, len(lines)):
        current = lines[i].strip()
        if not current:
            continue
        if current == previous:
            return "\n".join(lines[:i])
        previous = current
    return text


def indent_of(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def scope_of(cursor_line: str, line_above: str, mode: Mode) -> int:
    """The columns every later line of a completion must be indented by to stay in the cursor's block.

    In a block body (after an opener at the end of the cursor line, or of the line above a blank cursor
    line) every line must be indented deeper than the opener. Otherwise the scope is the cursor's
    column on a blank line, or the cursor line's indentation. The daemon ends a block or empty-line
    suggestion there while decoding (the ``block_scope`` a request sends).
    """
    if mode is Mode.BLOCK:
        opener = cursor_line if cursor_line.strip() else line_above
        return indent_of(opener) + 1
    return indent_of(cursor_line) if cursor_line.strip() else len(cursor_line)


def limit_scope(text: str, cursor_line: str, line_above: str, mode: Mode) -> str:
    """End the completion where the code leaves the cursor's block (Tabby's limitScopeByIndentation):
    at a line indented less than :func:`scope_of`. The first line of the completion continues the cursor
    line and is never cut.
    """
    scope = scope_of(cursor_line, line_above, mode)
    lines = text.split("\n")
    for i in range(1, len(lines)):
        if lines[i].strip() and indent_of(lines[i]) < scope:
            return "\n".join(lines[:i])
    return text


def align_indent(text: str, cursor_line: str) -> str:
    """Make the first line's indentation relative to a cursor that sits on a whitespace-only line.

    The editor inserts at the cursor, after the line's own ``cursor_line`` indentation. For such a line
    the prompt ends at the line's start (a byte-level BPE tokenizer splits indentation from the word after
    it, so a prompt ending in spaces invites a token like `` return`` and one space too many), and the
    model writes the whole indentation: the part that repeats the cursor's is dropped, an indentation
    that does not extend it is dropped entirely. Later lines are whole lines and stay as they are.
    """
    if not cursor_line or cursor_line.strip():
        return text
    first, sep, rest = text.partition("\n")
    first = first[len(cursor_line) :] if first.startswith(cursor_line) else first.lstrip(" \t")
    return first + sep + rest


_NOT_TEXT = frozenset(" \t\r\n)]}\"'`;,:.")


def line_suffix_chars(line_after: str) -> int:
    """Characters after the cursor on its line that are code, not closing brackets, quotes or spaces."""
    return sum(ch not in _NOT_TEXT for ch in line_after)


def postprocess(
    text: str, *, suffix: str, mode: Mode, cursor_line: str, line_above: str, min_chars: int
) -> str | None:
    """The whole pipeline; None when nothing worth showing is left."""
    text = cut_fences(cut_special(text), cursor_line)
    if mode is Mode.SINGLE_LINE:
        text = first_line(text)
        if text.startswith("\n"):
            return None  # a single-line completion may not break the line it completes
    else:
        text = drop_leading_blank_lines(text, cursor_line)
    text = cut_suffix_overlap(text, suffix)
    text = drop_repeated_lines(text, cursor_line, line_above)
    if mode is not Mode.SINGLE_LINE:
        text = limit_scope(text, cursor_line, line_above, mode)
    text = text.rstrip()
    if len(text.strip()) < max(min_chars, 1):
        return None
    return text
