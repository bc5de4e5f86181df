"""Instruction data from Python source, without a download: conversations and the held-out requests.

Every documented function, method and class of a source file can become a coding request whose answer
is its own code in a fenced python block. The request is phrased from the docstring and the signature
in one of several framings (so the model does not learn one phrasing), chosen by a hash of the file and
the definition's name (the same corpus always gives the same data):

- ``plain``: "Write a Python function that returns ...", the summary turned into a relative clause
  (when it starts with a verb: "Return the sum." -> "that returns the sum.");
- ``signature``: "Write a Python function `sig`." with the docstring's summary;
- ``summary``: the docstring's summary first, then "... as a Python function named `name`";
- ``docstring``: "Implement `name` in Python." with the whole docstring;
- ``complete``: "Complete this function:" with the signature and docstring in a fence; the answer is
  the completed function (signature, docstring and body: a block that runs on its own);
- ``evalplus``: the EvalPlus/HumanEval instruct prompt (a problem in a fence) and its response opening;
- ``method`` and ``class`` for methods and classes.

Answers to the first three framings, methods and classes leave the definition's own docstring out: it
was the request, and a shorter answer is what a small model can write whole.

HumanEval stays clean (its numbers are measured on this model): a definition is dropped when its name is
a HumanEval entry point or when its code holds most of a canonical solution (``HumanEvalGuard``: at least
half of a solution's 8-token shingles, after dropping comments, docstrings and layout).
"""

from __future__ import annotations

import ast
import hashlib
import io
import random
import textwrap
import tokenize
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from assistant.code_blocks import FENCE, parsed
from assistant.evals import humaneval as he

FRAMINGS = ("plain", "signature", "summary", "docstring", "complete", "evalplus", "method", "class")
SHINGLE = 8  # tokens per shingle of the HumanEval solution check
LEADS = ("", "", "Here is the function:\n\n", "Sure.\n\n", "One way to write it:\n\n")


@dataclass(frozen=True)
class Definition:
    """A documented function, method or class of a source file."""

    path: str
    kind: str  # "function", "method" or "class"
    name: str
    owner: str | None  # the class of a method
    signature: str  # "def name(args) -> ret:" / "class Name(Base):"
    docstring: str
    source: str  # the whole definition, dedented, decorators left out
    answer: str  # the definition without its own docstring

    @property
    def summary(self) -> str:
        """The docstring's first paragraph on one line."""
        first = self.docstring.strip().split("\n\n")[0]
        return " ".join(first.split())


Def = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef


def _signature(lines: list[str], node: Def) -> str:
    """The header of a def or class, up to its colon (possibly over several lines)."""
    body0 = node.body[0]
    head = lines[node.lineno - 1 : body0.lineno - 1] or [lines[node.lineno - 1]]
    text = textwrap.dedent("\n".join(head)).rstrip()
    if not text.endswith(":"):  # the body starts on the header's line ("def f(): return 1")
        return ""
    return text


def _is_trivial(body: list[ast.stmt]) -> bool:
    """Nothing to write: only pass, ``...`` or ``raise NotImplementedError`` after the docstring."""
    rest = body[1:]
    if not rest:
        return True
    for stmt in rest:
        if isinstance(stmt, ast.Pass):
            continue
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and stmt.value.value is ...:
            continue
        if isinstance(stmt, ast.Raise) and "NotImplementedError" in ast.dump(stmt):
            continue
        return False
    return True


def _clean_docstring(doc: str) -> bool:
    """A docstring that reads as a request: some words, mostly ASCII prose, no doctest-only text."""
    summary = " ".join(doc.strip().split("\n\n")[0].split())
    if not 12 <= len(summary) <= 400 or len(summary.split()) < 3:
        return False
    ascii_share = sum(c.isascii() for c in doc) / max(len(doc), 1)
    return ascii_share > 0.98 and not summary.startswith((">>>", "..", ":", "#"))


def definitions(path: str, text: str) -> Iterator[Definition]:
    """Documented, non-trivial functions, methods (not dunders) and classes of one file, in file order."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return
    lines = text.split("\n")

    def make(node: Def, kind: str, owner: str | None) -> Definition | None:
        doc = ast.get_docstring(node, clean=True)
        body = node.body
        if not doc or not _clean_docstring(doc) or _is_trivial(body):
            return None
        sig = _signature(lines, node)
        if not sig:
            return None
        start, end = node.lineno, node.end_lineno or node.lineno
        source = textwrap.dedent("\n".join(lines[start - 1 : end])).rstrip() + "\n"
        indent = len(lines[start - 1]) - len(lines[start - 1].lstrip())
        # The answer: the definition with the docstring's lines removed.
        d0, d1 = body[0].lineno, body[0].end_lineno or body[0].lineno
        kept = lines[start - 1 : d0 - 1] + lines[d1:end]
        # Dedent by the header's indentation (a blank line inside a string may hold less of it).
        answer = "\n".join(line[indent:] if not line[:indent].strip() else line for line in kept)
        answer = answer.rstrip() + "\n"
        for candidate in (source, answer):
            try:
                ast.parse(candidate)
            except (SyntaxError, ValueError):
                return None
        return Definition(path, kind, node.name, owner, sig, doc, source, answer)

    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            found = make(node, "function", None)
            if found:
                yield found
        elif isinstance(node, ast.ClassDef):
            found = make(node, "class", None)
            if found:
                yield found
            for sub in node.body:
                if isinstance(sub, ast.FunctionDef | ast.AsyncFunctionDef) and not sub.name.startswith("__"):
                    found = make(sub, "method", node.name)
                    if found:
                        yield found


# -- HumanEval ------------------------------------------------------------------------------------
def code_tokens(code: str) -> list[str]:
    """The code's tokens without comments, docstrings, layout or type-only noise (for similarity)."""
    out: list[str] = []
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT}
    prev = None
    try:
        for tok in tokenize.generate_tokens(io.StringIO(code).readline):
            if tok.type in skip or tok.type == tokenize.ENDMARKER:
                continue
            # A string standing alone as a statement is a docstring: not code.
            if tok.type == tokenize.STRING and prev in (
                None,
                tokenize.NEWLINE,
                tokenize.INDENT,
                tokenize.DEDENT,
            ):
                prev = tok.type
                continue
            out.append(tok.string)
            prev = tok.type
            continue
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return out
    return out


def _shingles(tokens: Sequence[str], n: int = SHINGLE) -> set[tuple[str, ...]]:
    if len(tokens) < n:
        return {tuple(tokens)} if tokens else set()
    return {tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)}


class HumanEvalGuard:
    """Says whether a definition matches a HumanEval problem, by name or by canonical solution."""

    def __init__(self, problems: Iterable[he.Problem]) -> None:
        self.names: dict[str, str] = {}
        self.solutions: list[tuple[str, set[tuple[str, ...]]]] = []
        self.index: dict[tuple[str, ...], list[int]] = {}
        for p in problems:
            self.names[p.entry_point] = p.task_id
            shingles = _shingles(code_tokens(p.canonical_solution))
            self.solutions.append((p.task_id, shingles))
            for s in shingles:
                self.index.setdefault(s, []).append(len(self.solutions) - 1)

    def match(self, name: str, code: str) -> str | None:
        """``"name: HumanEval/N"`` or ``"solution: HumanEval/N"`` when it matches; None when clean."""
        if name in self.names:
            return f"name: {self.names[name]}"
        hits: dict[int, int] = {}
        for s in _shingles(code_tokens(code)):
            for i in self.index.get(s, ()):
                hits[i] = hits.get(i, 0) + 1
        for i, n in hits.items():
            task_id, shingles = self.solutions[i]
            if n * 2 >= len(shingles):
                return f"solution: {task_id}"
        return None


# -- conversations --------------------------------------------------------------------------------
def _pick(key: str, options: Sequence[str]) -> str:
    h = int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:4], "big")
    return options[h % len(options)]


# First words of a summary that are not an imperative verb ("The parser's state.", "Helper for ...").
_NOT_VERBS = frozenset(
    "a an the this that these it its if when while for given helper internal private utility used "
    "called deprecated note see like same".split()
)


def _third_person(summary: str) -> str | None:
    """'Return the sum of x.' -> 'returns the sum of x.'; None when it does not start with a verb."""
    words = summary.split(" ", 1)
    first = words[0]
    if len(words) < 2 or not first.isalpha() or not first[0].isupper() or first.lower() in _NOT_VERBS:
        return None
    verb = first.lower()
    if not verb.endswith("s"):
        if verb.endswith("y") and verb[-2:-1] not in tuple("aeiou"):
            verb = verb[:-1] + "ies"
        elif verb.endswith(("sh", "ch", "x", "z", "o")):
            verb += "es"
        else:
            verb += "s"
    return f"{verb} {words[1]}"


def framing(d: Definition) -> str:
    """The framing of a definition's request: fixed by its file and name."""
    if d.kind != "function":
        return d.kind
    how = _pick(f"{d.path}:{d.name}", FRAMINGS[:6])
    if how == "plain" and _third_person(d.summary) is None:
        how = "summary"
    return how


def _fence(code: str) -> str:
    return f"```python\n{code.rstrip()}\n```"


def _sentence(text: str) -> str:
    text = text.strip()
    return text if text.endswith((".", "!", "?", ":")) else text + "."


def request(d: Definition, how: str) -> tuple[str, str]:
    """(user message, assistant answer) of one definition in one framing."""
    lead = _pick(f"lead:{d.path}:{d.name}", LEADS)
    summary = _sentence(d.summary)
    sig = d.signature.removesuffix(":").removeprefix("async ").removeprefix("def ")
    if how == "plain":
        clause = _sentence(_third_person(d.summary) or d.summary)
        return f"Write a Python function that {clause}", lead + _fence(d.answer)
    if how == "signature":
        return f"Write a Python function `{sig}`. {summary}", lead + _fence(d.answer)
    if how == "summary":
        return f"{summary}\nWrite it as a Python function named `{d.name}`.", lead + _fence(d.answer)
    if how == "docstring":
        return f"Implement `{d.name}` in Python.\n\n{d.docstring.strip()}", lead + _fence(d.answer)
    if how == "complete":
        doc = textwrap.indent(f'"""{d.docstring.strip()}\n"""', "    ")
        return f"Complete this function:\n{_fence(d.signature + chr(10) + doc)}", _fence(d.source)
    if how == "evalplus":
        doc = textwrap.indent(f'"""{d.docstring.strip()}\n"""', "    ")
        problem = f"{d.signature}\n{doc}"
        user = f"{he.INSTRUCTION_PREFIX}\n```\n{problem}\n```\n"
        return user, f"{he.RESPONSE_PREFIX}\n{_fence(d.source)}"
    if how == "method":
        text = f"Write the `{d.name}` method of a Python class `{d.owner}`. {summary}"
        return text, lead + _fence(d.answer)
    if how == "class":
        name = d.signature.removeprefix("class ").removesuffix(":")
        return f"Write a Python class `{name}`. {summary}", _fence(d.answer)
    raise ValueError(f"unknown framing {how!r}")


def conversation(d: Definition) -> dict:
    """One ``{"messages": [...]}`` record (the Hugging Face chat format) with provenance beside it."""
    how = framing(d)
    user, answer = request(d, how)
    return {
        "messages": [{"role": "user", "content": user}, {"role": "assistant", "content": answer}],
        "source": {"path": d.path, "name": d.name, "kind": d.kind, "framing": how},
    }


# -- the data set ---------------------------------------------------------------------------------
@dataclass
class DataSet:
    """Training conversations, held-out requests (with their reference answers) and what was dropped."""

    train: list[dict] = field(default_factory=list)
    heldout: list[dict] = field(default_factory=list)
    excluded: list[dict] = field(default_factory=list)  # HumanEval matches: path, name, reason
    counts: Counter = field(default_factory=Counter)

    def manifest(self) -> dict:
        return {
            "train": len(self.train),
            "heldout_requests": len(self.heldout),
            "train_framings": dict(Counter(c["source"]["framing"] for c in self.train)),
            "heldout_framings": dict(Counter(c["source"]["framing"] for c in self.heldout)),
            "heldout_files": sorted({c["source"]["path"] for c in self.heldout}),
            "dropped": dict(self.counts),
            "humaneval_excluded": self.excluded,
        }


def build(
    sources: Iterable[tuple[str, str]],
    *,
    is_heldout: Callable[[str], bool],
    guard: HumanEvalGuard,
    fits: Callable[[dict], bool],
    heldout_requests: int = 200,
    seed: int = 0,
) -> DataSet:
    """Conversations from ``(path, text)`` sources; held-out files give only the held-out requests.

    ``fits`` says whether a conversation fits the training context (its token count). Code is compared
    by its tokens without comments and layout: a definition seen once is not repeated in training, and a
    held-out definition whose code is also in a training file (vendored copies: pip bundles rich,
    requests, urllib3 ...) is not a held-out request, so the held-out measures see code never trained on.
    """
    out = DataSet()
    seen: set[str] = set()
    held: list[tuple[str, dict]] = []
    for path, text in sources:
        for d in definitions(path, text):
            reason = guard.match(d.name, d.source)
            if reason:
                out.excluded.append({"path": d.path, "name": d.name, "reason": reason})
                continue
            conv = conversation(d)
            if not fits(conv):
                out.counts["too long"] += 1
                continue
            key = " ".join(code_tokens(d.source))
            if is_heldout(path):
                held.append((key, conv))
            elif key in seen:
                out.counts["duplicate code"] += 1
            else:
                seen.add(key)
                out.train.append(conv)
    fresh: dict[str, dict] = {}
    for key, conv in held:
        if key in seen:
            out.counts["held-out code also in training files"] += 1
        else:
            fresh.setdefault(key, conv)
    pool = list(fresh.values())
    random.Random(seed).shuffle(pool)
    out.heldout = pool[:heldout_requests]
    return out


# -- judging answers (reading the blocks and parsing them: ``assistant.code_blocks``) ---------------
def defines_function(code: str) -> bool:
    """The code parses and defines a function (a def at any depth: a method counts)."""
    tree = parsed(code)
    if tree is None:
        return False
    return any(isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) for n in ast.walk(tree))


def has_good_block(text: str) -> bool:
    """The issue's first measure: a closed fenced block that parses and defines a function."""
    closed = [m.group(1) for m in FENCE.finditer(text) if m.group(0).endswith("```")]
    return any(defines_function(code) for code in closed)


def repeats_a_line(text: str, more_than: int = 3) -> bool:
    """The issue's second measure: one non-blank line occurs more than ``more_than`` times."""
    counts: dict[str, int] = {}
    for line in text.split("\n"):
        if line.strip():
            counts[line.rstrip()] = counts.get(line.rstrip(), 0) + 1
    return any(n > more_than for n in counts.values())


def best_setting(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Of several settings' scores (``good_block`` and ``repeats_line`` shares of the same requests), the
    chat defaults to record: the highest ``good_block - repeats_line``."""
    return max(results, key=lambda r: r["good_block"] - r["repeats_line"])
