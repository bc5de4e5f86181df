"""The files in a chat's context (``/add``, ``@path``, ``--file``): read again at every turn, counted in
the model's tokens, and refused, one line each, when they cannot be sent or do not fit.

No Textual here: the app and the commands (:mod:`tui.workbench`) show what these methods return. Token
counts come from the daemon (``count``: the backend's ``/tokenize``), cached by text, so a turn whose
files did not change asks nothing again. The limit is the prompt's: the model's context less the
answer's canvas (``assistant.wire.prompt_budget``); the conversation itself is the daemon's to check.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from assistant.client import APIError, DaemonUnavailable
from assistant.wire import prompt_budget
from assistant.workspace.files import FileProblem, FileRef, context_block, display_path, parse_ref, read_text
from assistant.workspace.files import select_lines as lines_of
from tui.errors import describe_error


@dataclass
class ContextFile:
    """One file (or range of one) in the context, and its tokens when last read."""

    ref: FileRef  # its path resolved against the chat's working directory
    name: str  # as the prompt names it: relative to the working directory, with its range
    tokens: int = 0


@dataclass(frozen=True)
class Limit:
    """The prompt's token limit beside an answer (None where the model's context is not known)."""

    context: int | None
    canvas: int

    @property
    def tokens(self) -> int | None:
        return prompt_budget(self.context, self.canvas, self.context) if self.context else None

    def describe(self) -> str:
        return (
            f"the prompt's limit of {self.tokens:,} tokens (the model's context of {self.context:,} less "
            f"the {self.canvas:,}-token answer)"
        )


class ChatContext:
    """The files in context, in the order added."""

    def __init__(self, root: Path, count: Callable[[str], Awaitable[int]]) -> None:
        self.root = root
        self.files: list[ContextFile] = []
        self._count = count
        self._counts: dict[str, int] = {}  # tokens by the digest of a block's text

    @property
    def tokens(self) -> int:
        return sum(f.tokens for f in self.files)

    def find(self, text: str) -> ContextFile | None:
        ref = parse_ref(text)
        return next((f for f in self.files if f.name == self._name(ref)), None)

    def _name(self, ref: FileRef) -> str:
        return str(FileRef(display_path(self.root / ref.path, self.root), ref.start, ref.end))

    async def _block(self, entry: ContextFile) -> str:
        """``entry`` read now, as the prompt holds it, with its tokens counted."""
        path = self.root / entry.ref.path
        text = lines_of(read_text(path, entry.ref.path), entry.ref)
        block = context_block(display_path(path, self.root), text, entry.ref)
        digest = hashlib.sha256(block.encode()).hexdigest()
        if digest not in self._counts:
            try:
                self._counts[digest] = await self._count(block)
            except APIError as exc:
                raise FileProblem(f"{entry.name}: cannot count its tokens ({_counting(exc)})") from None
            except DaemonUnavailable as exc:
                raise FileProblem(f"{entry.name}: cannot count its tokens ({exc})") from None
        entry.tokens = self._counts[digest]
        return block

    async def add(self, texts: list[str], limit: Limit) -> list[tuple[str, bool]]:
        """Add each path (``path`` or ``path:FIRST-LAST``); one line per path, and whether it is a
        refusal. A refused file is not added; the others are."""
        lines = []
        for text in texts:
            try:
                ref = parse_ref(text)
                entry = ContextFile(ref, self._name(ref))
                if self.find(text) is not None:
                    lines.append((f"{entry.name} is already in the context", False))
                    continue
                await self._block(entry)
            except FileProblem as exc:
                lines.append((f"{exc}; not added", True))
                continue
            others = self.tokens
            allowed = limit.tokens
            if allowed is not None and others + entry.tokens > allowed:
                with_others = f" (with the {others:,} of the files already in context)" if others else ""
                size = f"{entry.name}: {entry.tokens:,} tokens{with_others}"
                lines.append((f"{size}, beyond {limit.describe()}; not added", True))
                continue
            self.files.append(entry)
            lines.append((f"added {entry.name} ({entry.tokens:,} tokens)", False))
        return lines

    def drop(self, texts: list[str]) -> list[tuple[str, bool]]:
        """Take the named files out (every file without names); one line per path."""
        if not texts:
            names = [f.name for f in self.files]
            self.files.clear()
            return [(f"dropped {', '.join(names)}" if names else "no files in context", not names)]
        lines = []
        for text in texts:
            entry = self.find(text)
            if entry is None:
                lines.append((f"{text} is not in the context (/files lists it)", True))
            else:
                self.files.remove(entry)
                lines.append((f"dropped {entry.name}", False))
        return lines

    def listing(self, limit: Limit) -> str:
        """``/files``: each file with its tokens, and the total against the limit."""
        if not self.files:
            return "no files in context (/add PATH or @PATH in a prompt adds one)"
        width = max(len(f.name) for f in self.files)
        rows = [f"{f.name:<{width}}  {f.tokens:>7,} tokens" for f in self.files]
        total = f"{self.tokens:,} tokens"
        if limit.tokens is not None:
            total += (
                f" of {limit.tokens:,} (the model's context of {limit.context:,} less the answer's canvas)"
            )
        return "\n".join([*rows, f"total: {total}"])

    async def blocks(self, limit: Limit) -> tuple[list[str], list[str]]:
        """Every file read again for this turn: (their blocks, problems). Any problem means nothing may
        be sent: a file gone, no longer text, or the files grown beyond the limit."""
        blocks, problems = [], []
        for entry in self.files:
            try:
                blocks.append(await self._block(entry))
            except FileProblem as exc:
                problems.append(f"{exc} (it is in the context: /drop {entry.name}, or put it back)")
        allowed = limit.tokens
        if not problems and allowed is not None and self.tokens > allowed:
            each = ", ".join(f"{f.name} {f.tokens:,}" for f in self.files)
            problems.append(
                f"the files in context are {self.tokens:,} tokens ({each}), beyond {limit.describe()}; "
                "/drop one"
            )
        return blocks, problems


def _counting(exc: APIError) -> str:
    if exc.status == 404:  # a daemon started by an older diffu, before /tokenize
        return "the daemon has no /tokenize: it is older than this client; restart it (diffu daemon stop)"
    return describe_error(exc)
