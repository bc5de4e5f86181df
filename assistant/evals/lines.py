"""Single-line infills from held-out source files: the decoder decision set beside HumanEval's 1,033.

HumanEval's single-line infilling (``humaneval.infill_tasks``) is small and is the benchmark the decoders
are reported on, so settings must not be chosen on it. These tasks come from the bundled model's
held-out files (the 2.5% of its pre-training corpus it never saw, ``scripts/bundled_corpus.py`` and the
hash split of ``model_runtime.train.corpus``), built the same way: hide one line of code, show the code
before and after it, and ask for the line through the editor's infill path. With no tests to run, a
fill is right when its text equals the hidden line (surrounding whitespace aside), as in the training
evaluation's line infill.

A task hides a line that holds code: not blank, not a comment, not inside a string that spans lines
(docstrings). Its context is the whole lines around it, up to ``PREFIX_CHARS`` before and
``SUFFIX_CHARS`` after, as an editor sends a window of the file. Lines are drawn with a fixed seed from
every such line of every held-out file, so the same corpus gives the same tasks on any machine.
"""

from __future__ import annotations

import io
import json
import random
import tokenize
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from assistant.evals import jsonl
from assistant.infill.context import classify
from assistant.infill.postprocess import scope_of

PREFIX_CHARS = 1000
SUFFIX_CHARS = 400
MAX_LINE_TOKENS = 32  # the editor's canvas for an empty line; a longer line cannot be filled exactly
SPAN_LINES = (2, 3, 4)  # a multi-line task's hidden lines
MAX_SPAN_TOKENS = 64  # the editor's canvas for a block


@dataclass(frozen=True)
class LineTask:
    task_id: str  # "<path>:L<line>" (1-based)
    prefix: str  # whole lines before the hidden one (ends with a newline)
    middle: str  # the hidden line, newline included
    suffix: str  # whole lines after it

    def correct(self, fill: str) -> bool:
        """The fill is the hidden line (whitespace around both ignored)."""
        return fill.strip() == self.middle.strip()


def code_lines(text: str) -> list[int]:
    """0-based numbers of the lines of ``text`` that hold code: a token other than a comment or a string,
    outside any string that spans lines. Empty for a file Python's tokenizer rejects."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return []
    code: set[int] = set()
    inside: set[int] = set()
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT}
    for tok in tokens:
        (r0, _), (r1, _) = tok.start, tok.end
        if tok.type == tokenize.STRING:
            if r1 > r0:
                inside.update(range(r0, r1 + 1))
        elif tok.type not in skip and tok.type != tokenize.ENDMARKER:
            code.add(r0)
    # A line of strings alone (a one-line docstring) is text, not code.
    return sorted(r - 1 for r in code - inside)


def build(
    files: Iterable[tuple[str, str]],
    n_tasks: int,
    count_tokens: Callable[[str], int],
    *,
    seed: int = 0,
) -> list[LineTask]:
    """``n_tasks`` single-line tasks drawn with ``seed`` from the code lines of ``files`` (path, text),
    each line at most ``MAX_LINE_TOKENS`` tokens with its newline."""
    texts, candidates = _candidates(files, seed)
    tasks: list[LineTask] = []
    for f, i in candidates:
        if len(tasks) == n_tasks:
            break
        path, lines = texts[f]
        if i == 0 or i + 1 >= len(lines):
            continue  # a line with nothing before it, or the file's last (no newline to end it)
        middle = lines[i] + "\n"
        if count_tokens(middle) > MAX_LINE_TOKENS:
            continue
        tasks.append(LineTask(f"{path}:L{i + 1}", _before(lines[:i]), middle, _after(lines[i + 1 :])))
    return tasks


def _candidates(
    files: Iterable[tuple[str, str]], seed: int
) -> tuple[list[tuple[str, list[str]]], list[tuple[int, int]]]:
    """Each file as (path, lines), and every (file, code line) in an order drawn with ``seed``."""
    candidates: list[tuple[int, int]] = []
    texts = []
    for f, (path, text) in enumerate(sorted(files)):
        texts.append((path, text.split("\n")))
        candidates += [(f, i) for i in code_lines(text)]
    random.Random(seed).shuffle(candidates)
    return texts, candidates


def build_spans(
    files: Iterable[tuple[str, str]],
    n_tasks: int,
    count_tokens: Callable[[str], int],
    *,
    seed: int = 0,
    sizes: Sequence[int] = SPAN_LINES,
) -> list[LineTask]:
    """``n_tasks`` multi-line tasks: each hides consecutive code lines (as many as one of ``sizes``, drawn
    with ``seed``) from a line's start, as an editor's empty-line or block suggestion would write them:
    every hidden line within the cursor's scope there (``postprocess.scope_of``), at most
    ``MAX_SPAN_TOKENS`` tokens in all."""
    texts, candidates = _candidates(files, seed)
    code = {f: set(code_lines("\n".join(lines))) for f, (_, lines) in enumerate(texts)}
    pick = random.Random(seed + 1)
    tasks: list[LineTask] = []
    for f, i in candidates:
        if len(tasks) == n_tasks:
            break
        path, lines = texts[f]
        n = pick.choice(list(sizes))
        if i == 0 or i + n >= len(lines) or not all(j in code[f] for j in range(i, i + n)):
            continue
        above = lines[i - 1]
        scope = scope_of("", above, classify("", "", above))
        if any(len(line) - len(line.lstrip(" \t")) < scope for line in lines[i : i + n]):
            continue  # the editor would end its suggestion before these lines do
        middle = "\n".join(lines[i : i + n]) + "\n"
        if count_tokens(middle) > MAX_SPAN_TOKENS:
            continue
        tasks.append(LineTask(f"{path}:L{i + 1}-{i + n}", _before(lines[:i]), middle, _after(lines[i + n :])))
    return tasks


# A task whose hidden line, with this many lines on each side, stands verbatim in a file the model trained
# on is held out by path only (a vendored copy of a library, a generated table): the check drops it.
WINDOW_LINES = 2


def window(task: LineTask, k: int = WINDOW_LINES) -> str:
    """The hidden line with ``k`` lines of context on each side (fewer at a file's edge), as text."""
    before = task.prefix.split("\n")[:-1][-k:]  # the prefix ends with a newline
    after = task.suffix.split("\n")[:k]
    return "\n".join([*before, task.middle.rstrip("\n"), *after])


@dataclass(frozen=True)
class Seen:
    """What the training files hold: the hash of every run of ``2k + 1`` consecutive lines, and their
    whole text (for a window a file's edge cut short, looked up as whole lines)."""

    windows: frozenset[int]
    text: str

    @classmethod
    def of(cls, texts: Iterable[str], k: int = WINDOW_LINES) -> Seen:
        windows: set[int] = set()
        size = 2 * k + 1
        whole = []
        for text in texts:
            lines = text.split("\n")
            whole.append(text)
            for i in range(len(lines) - size + 1):
                windows.add(hash("\n".join(lines[i : i + size])))
        return cls(frozenset(windows), "\n" + "\n".join(whole) + "\n")

    def holds(self, text: str, k: int = WINDOW_LINES) -> bool:
        """Whether ``text`` (whole lines) stands in a training file."""
        if text.count("\n") == 2 * k:
            return hash(text) in self.windows
        return "\n" + text + "\n" in self.text


def unseen(tasks: Sequence[LineTask], seen: Seen) -> tuple[list[LineTask], list[LineTask]]:
    """(tasks whose window stands in no training file, those whose window does): held out by content,
    not only by path."""
    kept: list[LineTask] = []
    dropped: list[LineTask] = []
    for task in tasks:
        (dropped if seen.holds(window(task)) else kept).append(task)
    return kept, dropped


def _before(lines: Sequence[str]) -> str:
    """The last whole lines within PREFIX_CHARS (at least one), each with its newline."""
    kept: list[str] = []
    size = 0
    for line in reversed(lines):
        size += len(line) + 1
        if kept and size > PREFIX_CHARS:
            break
        kept.append(line + "\n")
    return "".join(reversed(kept))


def _after(lines: Sequence[str]) -> str:
    """The first whole lines within SUFFIX_CHARS, newlines between them."""
    kept: list[str] = []
    size = 0
    for line in lines:
        size += len(line) + 1
        if size > SUFFIX_CHARS:
            break
        kept.append(line)
    return "\n".join(kept)


def write(tasks: Sequence[LineTask], path: Path) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for t in tasks:
            f.write(json.dumps(asdict(t), ensure_ascii=False) + "\n")


def read(path: Path) -> list[LineTask]:
    """The tasks of a file ``write`` made; ValueError naming the line for anything else."""
    tasks = []
    fields = ("task_id", "prefix", "middle", "suffix")
    for n, row in jsonl.objects(path, ", ".join(fields)):
        if not all(isinstance(row.get(k), str) for k in fields):
            raise ValueError(f"{path}:{n}: not a line task (needs the strings {', '.join(fields)})")
        tasks.append(LineTask(*(row[k] for k in fields)))
    if not tasks:
        raise ValueError(f"{path}: no tasks")
    return tasks
