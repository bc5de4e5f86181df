"""What the model sees for a completion: prefix and suffix windows, a header, snippets of other files.

All pure functions over strings. Budgets are in tokens; the server has no tokenizer (it must not load the
model), so token counts are estimated with a characters-per-token ratio that it learns from the daemon's
``usage.prompt_tokens`` answers. Windows are cut at line boundaries (llm-ls and Continue do the same), and
the whole file is sent when it fits.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum

# Qwen2.5-Coder's repository layout, which DiffuCoder's tokenizer keeps as a special token; the daemon's
# llama.cpp route uses the same layout for ``input_extra`` chunks.
FILE_SEP = "<|file_sep|>"

# Line-comment syntax per LSP language id, for the header line; unknown languages get no comment header.
_COMMENT = {
    **dict.fromkeys(
        (
            "python",
            "shellscript",
            "sh",
            "bash",
            "zsh",
            "ruby",
            "perl",
            "r",
            "yaml",
            "toml",
            "dockerfile",
            "makefile",
            "cmake",
            "elixir",
            "julia",
            "nix",
            "powershell",
            "coffeescript",
            "graphql",
            "terraform",
            "hcl",
        ),
        "#",
    ),
    **dict.fromkeys(
        (
            "c",
            "cpp",
            "objective-c",
            "objective-cpp",
            "csharp",
            "java",
            "javascript",
            "javascriptreact",
            "typescript",
            "typescriptreact",
            "go",
            "rust",
            "kotlin",
            "swift",
            "scala",
            "dart",
            "php",
            "groovy",
            "zig",
            "d",
            "jsonc",
            "proto",
            "solidity",
            "verilog",
        ),
        "//",
    ),
    **dict.fromkeys(("lua", "sql", "haskell", "ada", "elm", "purescript"), "--"),
    **dict.fromkeys(("lisp", "clojure", "scheme", "racket", "commonlisp"), ";;"),
    **dict.fromkeys(("erlang", "latex", "tex", "matlab"), "%"),
    "vim": '"',
}
_BLOCK_COMMENT = {
    "html": ("<!--", "-->"),
    "xml": ("<!--", "-->"),
    "markdown": ("<!--", "-->"),
    "vue": ("<!--", "-->"),
    "svelte": ("<!--", "-->"),
    "css": ("/*", "*/"),
    "scss": ("/*", "*/"),
    "less": ("/*", "*/"),
    "ocaml": ("(*", "*)"),
}

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]{2,}")
SNIPPET_LINES = 24  # lines per candidate chunk of another document
SNIPPET_STRIDE = 12


class Mode(Enum):
    """How much to generate, from the text around the cursor (the llm-ls Empty/Single/Multi classifier)."""

    SINGLE_LINE = "single_line"  # text on the line: finish this line only
    EMPTY_LINE = "empty_line"  # a blank line: the next statement or two
    BLOCK = "block"  # after a block opener (``:``, ``{``, ``(``...): the body


@dataclass(frozen=True)
class Snippet:
    """A chunk of another open document, tagged with its (workspace-relative) file name."""

    name: str
    text: str


@dataclass(frozen=True)
class Prompt:
    """What to send: ``prefix`` ends at the cursor, ``suffix`` starts there (both already windowed)."""

    prefix: str
    suffix: str
    mode: Mode
    snippets: list[Snippet] = field(default_factory=list)
    whole_file: bool = False


def header_line(path: str, language: str) -> str:
    """One line naming the file and its language, as a comment of that language when we know its syntax."""
    text = f"{path} ({language})" if language else path
    if language in _COMMENT:
        return f"{_COMMENT[language]} {text}\n"
    if language in _BLOCK_COMMENT:
        start, end = _BLOCK_COMMENT[language]
        return f"{start} {text} {end}\n"
    return ""


_OPENERS = (":", "{", "(", "[", "=>", "->", " do", " then")


def classify(line_before: str, line_after: str, previous_line: str) -> Mode:
    """Pick the canvas shape from the cursor's line (text before and after the cursor) and the line above.

    Text right of the cursor (auto-closed brackets included) means the user is editing inside a line:
    complete that line only. A blank line after a block opener, or the end of an opener line, starts a
    block body.
    """
    if line_after.strip():
        # Inside a line, auto-closed brackets included (``print(|)``): finish this line only.
        return Mode.SINGLE_LINE
    before = line_before.rstrip()
    if before.strip():
        return Mode.BLOCK if before.endswith(_OPENERS) else Mode.SINGLE_LINE
    return Mode.BLOCK if previous_line.rstrip().endswith(_OPENERS) else Mode.EMPTY_LINE


def canvas_tokens(mode: Mode, max_tokens: int) -> int:
    """The canvas size for a mode; a DLM needs it before it starts (the spec's DLM implications)."""
    if mode is Mode.SINGLE_LINE:
        return min(24, max_tokens)
    if mode is Mode.EMPTY_LINE:
        return min(32, max_tokens)
    return max_tokens


def window(prefix: str, suffix: str, budget_chars: int, prefix_fraction: float) -> tuple[str, str, bool]:
    """Cut ``prefix`` (before the cursor) and ``suffix`` (after it) to ``budget_chars`` in all.

    The prefix gets ``prefix_fraction`` of the budget and the suffix the rest; a side that needs less
    leaves its share to the other. Cuts fall on line boundaries, except that the cursor's own line is
    kept whole even when it alone is over budget (a cut inside it would change what the cursor sits in).
    Returns (prefix, suffix, whether the whole file fit).
    """
    if len(prefix) + len(suffix) <= budget_chars:
        return prefix, suffix, True
    want_pre = int(budget_chars * prefix_fraction)
    want_suf = budget_chars - want_pre
    if len(suffix) < want_suf:
        want_pre += want_suf - len(suffix)
        want_suf = len(suffix)
    elif len(prefix) < want_pre:
        want_suf += want_pre - len(prefix)
        want_pre = len(prefix)
    pre = prefix[len(prefix) - want_pre :] if want_pre < len(prefix) else prefix
    if len(pre) < len(prefix):
        line_start = prefix.rfind("\n") + 1  # the cursor line is kept whole
        cut = pre.find("\n")
        if len(prefix) - line_start > len(pre):
            pre = prefix[line_start:]
        elif cut >= 0:
            pre = pre[cut + 1 :]
    suf = suffix[:want_suf]
    if len(suf) < len(suffix):
        line_end = suffix.find("\n")
        cut = suf.rfind("\n")
        if line_end < 0 or line_end > len(suf):
            suf = suffix[:line_end] if line_end >= 0 else suffix
        elif cut >= 0:
            suf = suf[: cut + 1]
    return pre, suf, False


def identifiers(text: str) -> set[str]:
    return set(_IDENT.findall(text))


def pick_snippets(documents: Iterable[tuple[str, str]], near_cursor: str, budget_chars: int) -> list[Snippet]:
    """Chunks of other documents that share the most identifiers with the text near the cursor.

    ``documents`` is (name, text), most recently used first. Each is split into overlapping chunks of
    SNIPPET_LINES lines; chunks are ranked by Jaccard similarity of their identifier sets with
    ``near_cursor`` (the "similar snippets" retrieval of Copilot and Continue), ties going to the more
    recent document, and taken best first while they fit the budget. Chunks with nothing in common are
    never sent: they would only spend budget.
    """
    wanted = identifiers(near_cursor)
    if not wanted or budget_chars <= 0:
        return []
    scored: list[tuple[float, int, int, Snippet]] = []
    for rank, (name, text) in enumerate(documents):
        lines = text.splitlines(keepends=True)
        for start in range(0, max(len(lines), 1), SNIPPET_STRIDE):
            chunk = "".join(lines[start : start + SNIPPET_LINES])
            ids = identifiers(chunk)
            if not ids:
                continue
            score = len(ids & wanted) / len(ids | wanted)
            if score > 0:
                scored.append((score, -rank, -start, Snippet(name, chunk)))
            if start + SNIPPET_LINES >= len(lines):
                break
    scored.sort(key=lambda s: (s[0], s[1], s[2]), reverse=True)
    picked: list[Snippet] = []
    used = 0
    taken: dict[str, list[str]] = {}
    for _, _, _, snip in scored:
        cost = len(snip.text) + len(snip.name) + len(FILE_SEP) + 1
        if used + cost > budget_chars:
            continue
        # Overlapping chunks of one file would repeat lines; keep the better-scoring one.
        if any(_overlaps(snip.text, other) for other in taken.get(snip.name, [])):
            continue
        picked.append(snip)
        taken.setdefault(snip.name, []).append(snip.text)
        used += cost
    return picked


def _overlaps(a: str, b: str) -> bool:
    lines_a = set(line for line in a.splitlines() if line.strip())
    lines_b = set(line for line in b.splitlines() if line.strip())
    return bool(lines_a and lines_b) and len(lines_a & lines_b) > min(len(lines_a), len(lines_b)) // 2


def build_prompt(
    *,
    before: str,
    after: str,
    path: str,
    language: str,
    budget_tokens: int,
    prefix_fraction: float,
    chars_per_token: float,
    snippet_tokens: int,
    other_documents: Iterable[tuple[str, str]] = (),
) -> Prompt:
    """The infill prompt for a cursor between ``before`` and ``after`` (the whole document's text).

    The header line and snippets are part of the prefix the daemon sees. The file gets the budget first
    (all of it when ``other_documents`` is empty, else all but ``snippet_tokens``); snippets get whatever
    the file leaves.
    """
    header = header_line(path, language)
    others = list(other_documents)
    budget_chars = int(budget_tokens * chars_per_token)
    file_chars = budget_chars - len(header) - (int(snippet_tokens * chars_per_token) if others else 0)
    file_chars = max(file_chars, budget_chars // 4)
    pre, suf, whole = window(before, after, file_chars, prefix_fraction)
    line_before = before[before.rfind("\n") + 1 :]
    line_after = after.split("\n", 1)[0]
    above = before[: len(before) - len(line_before)].rstrip("\n")
    mode = classify(line_before, line_after, above[above.rfind("\n") + 1 :])
    snippets: list[Snippet] = []
    if others:
        left = budget_chars - len(header) - len(pre) - len(suf)
        snippets = pick_snippets(others, pre[-1500:] + suf[:500], left)
    prefix = header + pre
    if snippets:
        # The edited file comes last, introduced like the others, so the model reads it as a new file.
        parts = [f"{FILE_SEP}{s.name}\n{s.text}" + ("" if s.text.endswith("\n") else "\n") for s in snippets]
        prefix = "".join(parts) + f"{FILE_SEP}{path}\n" + prefix
    return Prompt(prefix=prefix, suffix=suf, mode=mode, snippets=snippets, whole_file=whole)
