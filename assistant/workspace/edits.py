"""Changing a user's file the safe way: shown first as a unified diff, written atomically only if the file
still holds what the diff was made from, and undone byte for byte (ARCHITECTURE.md rule 14).

A :class:`Change` is proposed from the file's bytes as they are now (its :class:`Snapshot`) and the text it
should hold. :func:`write` writes it through a temporary file in the same directory renamed over the file
(a crash leaves the old file or the new one, never half of each), with the file's mode kept; it refuses
when the file changed since the snapshot. :class:`UndoStack` puts back the bytes from before each write,
the last first, and refuses when the file changed since diffu wrote it (a later edit of the user's would be
lost) unless told to.
"""

from __future__ import annotations

import difflib
import os
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from assistant.workspace.files import FileProblem


class StaleChange(FileProblem):
    """The file changed on disk since its change was proposed (or written): nothing was written."""


@dataclass(frozen=True)
class Snapshot:
    """A file's bytes at one moment; ``data`` None: there was no such file."""

    path: Path
    data: bytes | None

    @classmethod
    def take(cls, path: Path) -> Snapshot:
        try:
            return cls(path, path.read_bytes())
        except FileNotFoundError:
            return cls(path, None)
        except OSError as exc:
            raise FileProblem(f"{path}: cannot read it ({exc.strerror or exc})") from None

    def still(self) -> bool:
        """Whether the file holds the same bytes now (or is still absent)."""
        return Snapshot.take(self.path).data == self.data


@dataclass(frozen=True)
class Change:
    """The text a file should hold, against what it holds now. ``name`` is the path as the user sees it."""

    name: str
    before: Snapshot
    after: bytes

    @property
    def path(self) -> Path:
        return self.before.path

    @property
    def creates(self) -> bool:
        return self.before.data is None

    @property
    def empty(self) -> bool:
        """Whether the change would leave the file as it is."""
        return self.before.data == self.after

    def diff(self) -> str:
        """The unified diff (``a/NAME`` -> ``b/NAME``; a new file from ``/dev/null``)."""
        old = _lines(self.before.data or b"")
        new = _lines(self.after)
        source = "/dev/null" if self.creates else f"a/{self.name}"
        out = []
        for line in difflib.unified_diff(old, new, source, f"b/{self.name}"):
            # difflib leaves a last line without its newline as it is; say so, as diff(1) does.
            out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
        return "".join(out)

    def counts(self) -> tuple[int, int]:
        """Lines added and removed."""
        added = removed = 0
        for line in self.diff().splitlines():
            if line.startswith("+") and not line.startswith("+++"):
                added += 1
            elif line.startswith("-") and not line.startswith("---"):
                removed += 1
        return added, removed


def _lines(data: bytes) -> list[str]:
    return data.decode("utf-8", errors="replace").splitlines(keepends=True)


def target(path: Path, name: str) -> Path:
    """The file a change to ``path`` writes: the path resolved (a symbolic link stays a link and its
    target changes), refused when it is a directory or its directory does not exist."""
    resolved = Path(os.path.realpath(path))
    if resolved.is_dir():
        raise FileProblem(f"{name}: is a directory")
    if not resolved.parent.is_dir():
        raise FileProblem(f"{name}: its directory {resolved.parent} does not exist")
    return resolved


def propose(path: Path, name: str, text: str, before: Snapshot | None = None) -> Change:
    """The change that makes the file at ``path`` hold ``text`` (UTF-8), against ``before`` (the bytes
    the text was made from; default: the file's bytes now). Take the snapshot before reading the text
    it is made from: a change made from older bytes than its snapshot could overwrite an edit."""
    resolved = target(path, name)
    return Change(name, before if before is not None else Snapshot.take(resolved), text.encode("utf-8"))


def write(change: Change) -> None:
    """Write ``change`` atomically, unless the file changed since it was proposed (StaleChange)."""
    if not change.before.still():
        raise StaleChange(
            f"{change.name} changed on disk since its diff was shown; nothing written (run it again)"
        )
    write_atomic(change.path, change.after)


def write_atomic(path: Path, data: bytes) -> None:
    """``data`` into ``path`` through a temporary file in its directory and a rename; an existing file's
    permission bits are kept, a new file gets the usual ones (0666 less the umask)."""
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".diffu", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@dataclass(frozen=True)
class Applied:
    """A written change: the bytes from before (None: diffu created the file) and those it wrote."""

    name: str
    path: Path
    before: bytes | None
    after: bytes


@dataclass
class UndoStack:
    """The changes written this session, the last on top."""

    applied: list[Applied] = field(default_factory=list)

    def push(self, change: Change) -> None:
        self.applied.append(Applied(change.name, change.path, change.before.data, change.after))

    def __len__(self) -> int:
        return len(self.applied)

    def undo(self, *, force: bool = False) -> Applied:
        """Put back the bytes from before the last change (delete a file it created). Refuses, keeping
        the change on the stack, when the file changed since it was written, unless ``force``."""
        if not self.applied:
            raise FileProblem("nothing to undo: no change was applied in this session")
        last = self.applied[-1]
        if not force and Snapshot.take(last.path).data != last.after:
            raise StaleChange(
                f"{last.name} changed since diffu wrote it; /undo --force puts back the bytes from before "
                "anyway (and loses the later edit)"
            )
        if last.before is None:
            last.path.unlink(missing_ok=True)
        else:
            write_atomic(last.path, last.before)
        self.applied.pop()
        return last
