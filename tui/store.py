"""Conversations, denoising histories, saved settings and prompt history in one SQLite file.

The file lives in the platformdirs data directory (``~/.local/share/diffu/chat.sqlite3`` on Linux;
``DIFFU_DATA_DIR`` overrides the directory, as the other ``DIFFU_*_DIR`` variables do for theirs).
Histories are stored zlib-compressed: consecutive canvases differ in a few tokens, so a 256-step history
of a 256-token answer shrinks from about 100 KB of JSON to a few KB.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
import uuid
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import platformdirs

from assistant import paths
from assistant.client import Step
from assistant.errors import UsageError
from tui.render import Trace

SCHEMA_VERSION = 1
PROMPT_HISTORY = 500  # prompts kept for up/down recall
TITLE_CHARS = 60

_SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id TEXT PRIMARY KEY,
    title TEXT NOT NULL,
    created REAL NOT NULL,
    updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    conversation_id TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    finish_reason TEXT,
    stats TEXT,
    trace BLOB,
    created REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages(conversation_id, id);
CREATE TABLE IF NOT EXISTS settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS prompts (id INTEGER PRIMARY KEY AUTOINCREMENT, text TEXT NOT NULL);
"""


class StoreError(UsageError):
    """The chat database cannot be opened or is not ours."""


def data_dir() -> Path:
    """Where ``diffu chat`` keeps its database."""
    override = os.environ.get("DIFFU_DATA_DIR")
    return Path(override).expanduser() if override else Path(platformdirs.user_data_dir(paths.APP_NAME))


def default_db_path() -> Path:
    return data_dir() / "chat.sqlite3"


@dataclass(frozen=True)
class ConversationInfo:
    id: str
    title: str
    created: float
    updated: float
    messages: int


@dataclass
class StoredMessage:
    """One turn. Assistant turns carry how they ended, their stats and (lazily loaded) denoising history."""

    id: int
    role: str
    content: str
    finish_reason: str | None = None
    stats: dict[str, Any] = field(default_factory=dict)
    has_trace: bool = False


def encode_trace(trace: Trace) -> bytes:
    frames = [[s.step, s.steps, s.masks, s.canvas, s.unmasked, s.masked, s.seconds] for s in trace.frames]
    request_id = trace.frames[0].id if trace.frames else ""
    raw = json.dumps({"total": trace.total, "id": request_id, "frames": frames}, separators=(",", ":"))
    return zlib.compress(raw.encode(), 6)


def decode_trace(blob: bytes) -> Trace:
    data = json.loads(zlib.decompress(blob))
    frames = [
        Step(
            id=data.get("id", ""),
            step=f[0],
            steps=f[1],
            masks=f[2],
            canvas=f[3],
            unmasked=f[4],
            masked=f[5],
            seconds=f[6],
        )
        for f in data["frames"]
    ]
    return Trace(total=data["total"], frames=frames)


class ChatStore:
    """The chat database. All calls are short and run on the caller's thread (the app's event loop)."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or default_db_path()
        try:
            paths.ensure_private_dir(self.path.parent)  # conversations are private, like the token
            self._db = sqlite3.connect(self.path)
            self._db.execute("PRAGMA foreign_keys = ON")
            version = self._db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"{self.path} was written by a newer diffu (schema {version}); "
                    "upgrade diffu or move the file away"
                )
            self._db.executescript(_SCHEMA)
            self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            self._db.commit()
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"cannot open the chat database {self.path}: {exc}") from None
        os.chmod(self.path, 0o600)

    def close(self) -> None:
        self._db.close()

    # -- conversations ---------------------------------------------------------------------------------
    def new_conversation(self, title: str) -> str:
        conversation_id = uuid.uuid4().hex[:16]
        now = time.time()
        with self._db:
            self._db.execute(
                "INSERT INTO conversations VALUES (?, ?, ?, ?)",
                (conversation_id, make_title(title), now, now),
            )
        return conversation_id

    def conversations(self, limit: int = 200) -> list[ConversationInfo]:
        """The most recently updated first."""
        rows = self._db.execute(
            "SELECT c.id, c.title, c.created, c.updated, COUNT(m.id) FROM conversations c "
            "LEFT JOIN messages m ON m.conversation_id = c.id GROUP BY c.id ORDER BY c.updated DESC, c.rowid "
            "DESC LIMIT ?",
            (limit,),
        ).fetchall()
        return [ConversationInfo(*row) for row in rows]

    def conversation(self, conversation_id: str) -> ConversationInfo | None:
        return next((c for c in self.conversations(limit=-1) if c.id == conversation_id), None)

    def delete_conversation(self, conversation_id: str) -> None:
        with self._db:
            self._db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))

    # -- messages --------------------------------------------------------------------------------------
    def add_message(
        self,
        conversation_id: str,
        role: str,
        content: str,
        *,
        finish_reason: str | None = None,
        stats: dict[str, Any] | None = None,
        trace: Trace | None = None,
    ) -> int:
        now = time.time()
        blob = encode_trace(trace) if trace is not None and trace.frames else None
        with self._db:
            cursor = self._db.execute(
                "INSERT INTO messages (conversation_id, role, content, finish_reason, stats, trace, created) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (conversation_id, role, content, finish_reason, json.dumps(stats or {}), blob, now),
            )
            self._db.execute("UPDATE conversations SET updated = ? WHERE id = ?", (now, conversation_id))
        assert cursor.lastrowid is not None
        return cursor.lastrowid

    def messages(self, conversation_id: str) -> list[StoredMessage]:
        rows = self._db.execute(
            "SELECT id, role, content, finish_reason, stats, trace IS NOT NULL FROM messages "
            "WHERE conversation_id = ? ORDER BY id",
            (conversation_id,),
        ).fetchall()
        return [
            StoredMessage(
                id=r[0],
                role=r[1],
                content=r[2],
                finish_reason=r[3],
                stats=json.loads(r[4] or "{}"),
                has_trace=bool(r[5]),
            )
            for r in rows
        ]

    def trace(self, message_id: int) -> Trace | None:
        row = self._db.execute("SELECT trace FROM messages WHERE id = ?", (message_id,)).fetchone()
        return decode_trace(row[0]) if row and row[0] is not None else None

    # -- settings and prompt history -------------------------------------------------------------------
    def saved_settings(self) -> dict[str, Any]:
        row = self._db.execute("SELECT value FROM settings WHERE key = 'chat'").fetchone()
        return json.loads(row[0]) if row else {}

    def save_settings(self, values: dict[str, Any]) -> None:
        with self._db:
            self._db.execute("INSERT OR REPLACE INTO settings VALUES ('chat', ?)", (json.dumps(values),))

    def clear_settings(self) -> None:
        with self._db:
            self._db.execute("DELETE FROM settings WHERE key = 'chat'")

    def add_prompt(self, text: str) -> None:
        with self._db:
            self._db.execute("INSERT INTO prompts (text) VALUES (?)", (text,))
            self._db.execute(
                "DELETE FROM prompts WHERE id <= (SELECT MAX(id) FROM prompts) - ?", (PROMPT_HISTORY,)
            )

    def prompts(self) -> list[str]:
        """Prompt history, oldest first."""
        return [r[0] for r in self._db.execute("SELECT text FROM prompts ORDER BY id")]


def make_title(text: str) -> str:
    """A conversation's title: its first prompt on one line, shortened."""
    line = " ".join(text.split())
    return line if len(line) <= TITLE_CHARS else line[: TITLE_CHARS - 1] + "…"
