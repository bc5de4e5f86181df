"""Recently edited and viewed ranges of documents: context beyond the file being completed.

llama.vim keeps a ring buffer of chunks gathered where the user works (yank, buffer enter and leave,
save, completion) and sends them as ``input_extra``; Tabby adds snippets of recently changed files. The
server sees edits (``didChange``) and where suggestions are asked for (the viewed cursor), so it keeps
the same kind of ring: a chunk of lines around each, newest last, one chunk per place (a chunk that
mostly overlaps a newer one of the same document is replaced by it). A chunk is a snapshot of the text
when it was noted.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

CHUNK_LINES = 32  # lines per chunk, centred on the edit or cursor
CAPACITY = 16  # chunks kept (llama.vim: 16 chunks of 64 lines)


@dataclass(frozen=True)
class Chunk:
    """Lines ``[start, start + len)`` of a document as they were when noted."""

    uri: str
    name: str
    start: int
    text: str


class RecentChunks:
    """The ring: ``note`` where the user edits or looks, ``chunks`` to read them back newest first."""

    def __init__(self, capacity: int = CAPACITY, lines: int = CHUNK_LINES) -> None:
        self.capacity = capacity
        self.lines = lines
        self._chunks: OrderedDict[tuple[str, int], Chunk] = OrderedDict()

    def __len__(self) -> int:
        return len(self._chunks)

    def note(self, uri: str, name: str, text: str, line: int) -> None:
        """Keep the chunk of ``text`` around ``line`` (0-based) as the newest."""
        lines = text.splitlines(keepends=True)
        if not lines:
            return
        start = max(0, min(line - self.lines // 2, len(lines) - self.lines))
        chunk = Chunk(uri, name, start, "".join(lines[start : start + self.lines]))
        if not chunk.text.strip():
            return
        for key, old in list(self._chunks.items()):
            # The same place again (more than half the lines shared): the newer snapshot replaces it.
            if old.uri == uri and abs(old.start - start) < self.lines // 2:
                del self._chunks[key]
        self._chunks[(uri, start)] = chunk
        while len(self._chunks) > self.capacity:
            self._chunks.popitem(last=False)

    def chunks(self, *, exclude: str | None = None) -> list[Chunk]:
        """Every chunk, newest first, without those of ``exclude`` (the document being completed)."""
        return [c for c in reversed(self._chunks.values()) if c.uri != exclude]
