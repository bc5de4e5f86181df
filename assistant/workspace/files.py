"""Files as a prompt's context: reading them (or refusing, one line each), line ranges, the format they
take in a prompt, ``@path`` mentions, and completing paths.

The format (docs/chat.md): each file is its path (and its lines, for a range), then its text in a fenced
block labelled with its language, the fence longer than any run of backticks in the text so the file can
never close it early; the blocks go before the user's prompt, a blank line between them::

    src/geo.py (lines 10-40)
    ```python
    def area(r):
        ...
    ```

    What does area return for a negative radius?
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from assistant.errors import UsageError

# More than any model's context could hold, and the daemon's default request body limit: a file this
# large is refused before it is read, whatever its token count would be.
MAX_FILE_BYTES = 4 * 1024 * 1024
BINARY_SNIFF = 8192  # a NUL byte in the first 8 KiB makes a file binary, as git and grep decide

# Fence labels, and which names a bare ``@word`` must end with to be taken for a file rather than prose.
LANGUAGES = {
    ".py": "python",
    ".pyi": "python",
    ".js": "javascript",
    ".jsx": "javascript",
    ".ts": "typescript",
    ".tsx": "typescript",
    ".rs": "rust",
    ".go": "go",
    ".c": "c",
    ".h": "c",
    ".cc": "cpp",
    ".cpp": "cpp",
    ".hpp": "cpp",
    ".java": "java",
    ".kt": "kotlin",
    ".rb": "ruby",
    ".sh": "shellscript",
    ".bash": "shellscript",
    ".lua": "lua",
    ".sql": "sql",
    ".html": "html",
    ".css": "css",
    ".json": "json",
    ".toml": "toml",
    ".yaml": "yaml",
    ".yml": "yaml",
    ".md": "markdown",
    ".txt": "",
    ".cfg": "",
    ".ini": "",
}
_FENCE_LABEL = {"shellscript": "sh"}  # Markdown's name where the editors' language id differs


class FileProblem(UsageError):
    """A path that cannot go into a prompt (or be changed), and why: one line naming it."""


@dataclass(frozen=True)
class FileRef:
    """A path as the user wrote it, with an optional 1-based inclusive line range."""

    path: str
    start: int | None = None
    end: int | None = None

    def __str__(self) -> str:
        if self.start is None:
            return self.path
        return (
            f"{self.path}:{self.start}" if self.start == self.end else f"{self.path}:{self.start}-{self.end}"
        )


_RANGE = re.compile(r"^(?P<path>.+?):(?P<start>\d+)(?:-(?P<end>\d+))?$")


def parse_ref(text: str) -> FileRef:
    """``a.py``, ``a.py:12`` (one line) or ``a.py:10-40``; a bad range is a FileProblem."""
    match = _RANGE.match(text)
    if match is None:
        return FileRef(text)
    start = int(match["start"])
    end = int(match["end"]) if match["end"] is not None else start
    if start < 1 or end < start:
        raise FileProblem(f"{text}: a line range is FIRST-LAST, 1-based, with FIRST <= LAST")
    return FileRef(match["path"], start, end)


def display_path(path: Path, root: Path) -> str:
    """``path`` as the prompt names it: relative to ``root`` (the working directory) when under it."""
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return str(path)


def read_text(path: Path, name: str | None = None) -> str:
    """The file's text, or a FileProblem saying in one line why it cannot be sent: missing, a
    directory, unreadable, too large, binary, not UTF-8. Line endings are kept as they are. ``name``:
    the path as the user wrote it, for the message (default: ``path``)."""
    name = str(path) if name is None else name
    try:
        if path.is_dir():
            raise FileProblem(f"{name}: is a directory (add the files in it by name)")
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise FileProblem(f"{name}: {size:,} bytes, beyond the {MAX_FILE_BYTES:,} bytes a file may have")
        data = path.read_bytes()
    except FileNotFoundError:
        raise FileProblem(f"{name}: no such file") from None
    except OSError as exc:
        raise FileProblem(f"{name}: cannot read it ({exc.strerror or exc})") from None
    return decode_text(data, name)


def decode_text(data: bytes, name: str) -> str:
    """A file's bytes as text, or a FileProblem: binary (a NUL byte early on) or not UTF-8."""
    if b"\0" in data[:BINARY_SNIFF]:
        raise FileProblem(f"{name}: a binary file, not text")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FileProblem(
            f"{name}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})"
        ) from None


def select_lines(text: str, ref: FileRef) -> str:
    """The lines of ``ref``'s range (all of ``text`` without one); a range past the end is clamped to
    the last line, one that starts past it is a FileProblem."""
    if ref.start is None or ref.end is None:
        return text
    lines = text.splitlines(keepends=True)
    if ref.start > len(lines):
        raise FileProblem(f"{ref}: the file has {len(lines)} lines")
    return "".join(lines[ref.start - 1 : ref.end])


def line_span(text: str, ref: FileRef) -> tuple[int, int | None]:
    """Character offsets ``[start, end)`` of ``ref``'s lines in ``text``; ``(0, None)``, the whole text,
    without a range."""
    if ref.start is None or ref.end is None:
        return 0, None
    lines = text.splitlines(keepends=True)
    if ref.start > len(lines):
        raise FileProblem(f"{ref}: the file has {len(lines)} lines")
    start = sum(len(line) for line in lines[: ref.start - 1])
    return start, start + sum(len(line) for line in lines[ref.start - 1 : ref.end])


def language_of(path: str) -> str:
    """The editors' language id for a file name (what the fence is labelled with), "" when unknown."""
    return LANGUAGES.get(os.path.splitext(path)[1].lower(), "")


def fence_for(text: str) -> str:
    """A backtick fence longer than any run of backticks in ``text`` (at least three)."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def context_block(name: str, text: str, ref: FileRef | None = None) -> str:
    """One file as a prompt holds it: its name (and range), then its text fenced."""
    label = name if ref is None or ref.start is None else f"{name} (lines {ref.start}-{ref.end})"
    fence = fence_for(text)
    language = language_of(name)
    body = text if text.endswith("\n") or not text else text + "\n"
    return f"{label}\n{fence}{_FENCE_LABEL.get(language, language)}\n{body}{fence}"


def with_files(blocks: list[str], prompt: str) -> str:
    """The user message that carries the files: their blocks, then the prompt."""
    return "\n\n".join([*blocks, prompt]) if blocks else prompt


# -- @path mentions ---------------------------------------------------------------------------------------
# An @ at the start or after a space or bracket, then path characters and an optional line range; not
# followed by "(" (a decorator call) and not inside `code`.
_MENTION = re.compile(r"(?:^|(?<=[\s(\[{]))@(?P<ref>[\w./~+-]++(?::\d+(?:-\d+)?)?)(?![\w(])")
_CODE = re.compile(r"```.*?(?:```|\Z)|`[^`\n]*`", re.DOTALL)


def mentions(prompt: str, root: Path) -> list[str]:
    """The ``@path`` mentions of a prompt, in order, without repeats. An ``@word`` is a file when it
    exists, holds a ``/`` or ends in a known extension; ``@property`` and ``@dataclass`` stay prose."""
    prose = _CODE.sub(lambda m: " " * len(m.group(0)), prompt)
    found: list[str] = []
    for match in _MENTION.finditer(prose):
        ref = match["ref"].rstrip(".")  # a sentence's full stop is not part of the name
        path = _RANGE.sub(r"\g<path>", ref)
        named = "/" in path or os.path.splitext(path)[1].lower() in LANGUAGES
        if (named or (root / path).exists()) and ref not in found:
            found.append(ref)
    return found


def complete_path(partial: str, root: Path, *, limit: int = 200) -> list[str]:
    """Completions of ``partial`` (a path relative to ``root``, the working directory) among the
    entries under ``root``: directories end in ``/``; hidden entries only when asked for with a dot."""
    head, _, stem = partial.rpartition("/")
    base = (root / head) if head else root
    try:
        if not base.resolve().is_relative_to(root.resolve()):
            return []  # only paths under the working directory are offered
        entries = sorted(os.scandir(base), key=lambda e: e.name)
    except OSError:
        return []
    out = []
    for entry in entries:
        if not entry.name.startswith(stem) or (entry.name.startswith(".") and not stem.startswith(".")):
            continue
        name = f"{head}/{entry.name}" if head else entry.name
        out.append(name + "/" if entry.is_dir() else name)
        if len(out) >= limit:
            break
    return out


def common_prefix(names: list[str]) -> str:
    """The longest prefix every name shares (what Tab inserts when several match)."""
    return os.path.commonprefix(names) if names else ""
