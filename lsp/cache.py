"""An LRU of recent suggestions keyed on the text around the cursor, with forwarding.

A bidirectional model cannot reuse a prefix KV cache the way autoregressive servers do, so this cache is
what makes repeated and continued requests cheap. Keys are the last ``TAIL`` characters before the cursor
and the first ``TAIL`` after it (plus a fingerprint of the settings that shape the answer), so a long file
costs no more than a short one.

Forwarding: after a suggestion ``T`` for (before, after), typing its first ``k`` characters gives
(before + T[:k], after); that lookup answers ``T[k:]`` without asking the model (Tabby and Continue do the
same).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass

TAIL = 4096


@dataclass(frozen=True)
class Entry:
    before: str
    after: str
    fingerprint: str
    text: str
    created: float


class SuggestionCache:
    """``get``/``put`` by the text around the cursor; ``capacity`` entries, each valid ``ttl`` seconds."""

    def __init__(self, capacity: int = 100, ttl: float = 300.0) -> None:
        self.capacity = capacity
        self.ttl = ttl
        self._entries: OrderedDict[tuple[str, str, str], Entry] = OrderedDict()
        self.hits = 0
        self.forward_hits = 0

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()

    def put(self, before: str, after: str, fingerprint: str, text: str) -> None:
        key = (before[-TAIL:], after[:TAIL], fingerprint)
        self._entries[key] = Entry(key[0], key[1], fingerprint, text, time.monotonic())
        self._entries.move_to_end(key)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def get(self, before: str, after: str, fingerprint: str) -> str | None:
        """The cached suggestion for this cursor, or the rest of one the user has started typing."""
        tail, head = before[-TAIL:], after[:TAIL]
        now = time.monotonic()
        key = (tail, head, fingerprint)
        entry = self._entries.get(key)
        if entry is not None and now - entry.created <= self.ttl:
            self._entries.move_to_end(key)
            self.hits += 1
            return entry.text
        # Newest first: the suggestion being typed out is usually the last one stored.
        for key, entry in reversed(self._entries.items()):
            if entry.after != head or entry.fingerprint != fingerprint or now - entry.created > self.ttl:
                continue
            rest = _forward(entry, tail)
            if rest:
                self._entries.move_to_end(key)
                self.forward_hits += 1
                return rest
        return None


def _forward(entry: Entry, tail: str) -> str | None:
    """``entry.text[k:]`` if ``tail`` is ``entry.before`` followed by the first ``k`` characters typed."""
    text = entry.text
    for k in range(1, len(text)):
        typed = text[:k]
        if not tail.endswith(typed):
            continue
        # (before + typed)[-TAIL:] is what the cursor's tail is after typing ``typed``.
        if (entry.before + typed)[-TAIL:] == tail:
            return text[k:]
    return None
