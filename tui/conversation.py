"""The conversation the model sees, kept beside the widgets that show it, and its rows in the chat
database: user turns and the answers that completed, in order.

A plain object (no Textual): the turn runner (:mod:`tui.turns`) adds to it as answers end, and the app
starts, clears and reopens it.
"""

from __future__ import annotations

from tui.store import ChatStore, StoredMessage
from tui.widgets import AnswerView


def completed(finish_reason: str | None, content: str) -> bool:
    """Whether an answer belongs in the conversation the model sees (as ``AnswerView.answered``)."""
    return finish_reason not in (None, "cancelled") and bool(content)


class Conversation:
    """One conversation: its id in the store (None until its first prompt) and its messages."""

    def __init__(self, store: ChatStore) -> None:
        self.store = store
        self.id: str | None = None
        # What the model sees: user turns and completed answers, as chat messages.
        self.messages: list[dict[str, str]] = []

    @property
    def title(self) -> str:
        info = self.store.conversation(self.id) if self.id else None
        return info.title if info else ""

    def clear(self) -> None:
        """A new conversation: the next prompt starts it."""
        self.id = None
        self.messages = []

    def open(self, conversation_id: str) -> list[StoredMessage]:
        """Continue a saved conversation; returns its stored messages, to show."""
        self.id = conversation_id
        stored = self.store.messages(conversation_id)
        self.messages = [
            {"role": m.role, "content": m.content}
            for m in stored
            if m.role == "user" or completed(m.finish_reason, m.content)
        ]
        return stored

    def add_prompt(self, text: str) -> None:
        """A user turn (its first starts the conversation in the store)."""
        if self.id is None:
            self.id = self.store.new_conversation(text)
        self.store.add_message(self.id, "user", text)
        self.messages.append({"role": "user", "content": text})

    def add_answer(self, answer: AnswerView) -> None:
        """Save an answer that ended (recorded); one that completed joins what the model sees."""
        if self.id is not None:
            answer.message_id = self.store.add_message(
                self.id,
                "assistant",
                answer.content,
                finish_reason=answer.finish_reason,
                stats=answer.stats,
                trace=answer.trace,
            )
        if completed(answer.finish_reason, answer.content):
            self.messages.append({"role": "assistant", "content": answer.content})
