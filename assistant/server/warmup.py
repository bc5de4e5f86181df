"""What the daemon compiles while it already serves: the warm-up plan, and the queue of programs to warm.

A new daemon answers as soon as its weights are loaded. Its device thread then compiles, whenever no
request is waiting, the programs that requests are most likely to need, in this order:

1. the chat's: ``diffu chat`` with its built-in settings (:data:`CHAT_REQUEST`, the same fields the chat
   sends; ``tests/tui/test_parts.py`` holds the two together) under the model's chat defaults, on the
   model's default decoder, one row, the smallest length bucket that holds a short question and its
   answer; then, where the model sets ``retry_block``, the chat's second decode of an answer whose
   code does not parse (the same question on the rounded-up canvas, fast decoder, those blocks);
2. the editor's: an infill of the daemon's ``infill_tokens`` with the request defaults, the smallest
   bucket first;
3. the same two on the longer buckets, then (off CPU) on the batch buckets above one row.

Clients that know their shapes (``diffu lsp`` on connecting) ask ``POST /v1/diffu/warm``; their programs
go ahead of this plan. A request whose program is not compiled does not wait for the plan: it waits for
its own program only (and for the one the device thread is compiling, which cannot be interrupted).
Plain Python: the runtime builds rows and compiles; this module decides what and in which order.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from assistant.config import Config
from model_runtime.generation_config import RETRY_KEY, retry_request
from model_runtime.interface import CanvasRow, RuntimeProtocol
from model_runtime.params import SamplingParams

# The fields ``diffu chat`` sends with its built-in settings (tui.settings.ChatSettings.request_params,
# decoder "model": none, so the daemon picks its model's). The TUI cannot be imported here (dependencies
# point tui -> assistant), so a test checks the two agree.
CHAT_REQUEST: dict[str, Any] = {
    "max_new_tokens": 256,
    "temperature": 0.4,
    "top_p": 0.95,
    "alg": "entropy",
    "block_length": 32,
    "threshold": 0.9,
}
# A first chat question with its template (DiffuCoder's system prompt and turn markers): what the
# chat's first program must hold besides the answer.
CHAT_PROMPT_TOKENS = 64
MAX_WARM_TASKS = 64  # shapes queued at most; a warm request beyond it is refused (503)


@dataclass(frozen=True)
class Shape:
    """A request's shape as a client describes it to ``POST /v1/diffu/warm``: ``prompt_tokens`` of
    context, ``max_new_tokens`` to generate, an infill (context on both sides) or not, ``batch`` rows,
    and the request's sampling fields (those of ``/v1/diffu/generate``; unset ones get the defaults a
    request gets)."""

    prompt_tokens: int
    max_new_tokens: int
    infill: bool = False
    batch: int = 1
    sampling: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        kind = "infill" if self.infill else "generation"
        rows = f"{self.batch} rows of " if self.batch > 1 else ""
        return f"{kind}, {rows}{self.prompt_tokens} + {self.max_new_tokens} tokens"


@dataclass(frozen=True)
class WarmTask:
    """Programs to compile: those ``run(rows, params)`` uses. ``label`` says what they are for."""

    rows: tuple[CanvasRow, ...]
    params: SamplingParams
    label: str


def shape_rows(rt: RuntimeProtocol, shape: Shape) -> tuple[CanvasRow, ...]:
    """Made-up rows of ``shape``: the context (split around the hole for an infill) and the masks. Only
    the shape reaches a compiled program, never the tokens."""
    filler, mask = rt.tokenizer.pad_id, rt.tokenizer.mask_id
    n = shape.prompt_tokens
    suffix = min(n, max(1, n // 4)) if shape.infill else 0
    prefix = n - suffix
    ids = (filler,) * prefix + (mask,) * shape.max_new_tokens + (filler,) * suffix
    row = CanvasRow(ids, (prefix, prefix + shape.max_new_tokens), chat=not shape.infill)
    return (row,) * shape.batch


def default_plan(rt: RuntimeProtocol, config: Config, *, accelerator: bool) -> list[Shape]:
    """The generic warm-up, most likely first (see the module's docstring)."""
    chat = {**CHAT_REQUEST, **chat_defaults(rt)}
    chat_new = int(chat.pop("max_new_tokens"))
    lengths = sorted({n for _, n in rt.buckets})
    batches = sorted({b for b, _ in rt.buckets})
    # The chat's first bucket holds a first question and its answer; the longer ones, longer talks.
    first = chat_new + CHAT_PROMPT_TOKENS
    fits = [n for n in lengths if n >= first]
    chat_rows = [first, *fits[1:]] if fits else []
    editor_rows = [n for n in lengths if n > config.infill_tokens]
    plan: list[Shape] = []
    retry = rt.chat_defaults.get(RETRY_KEY) or 0
    for i in range(max(len(chat_rows), len(editor_rows))):
        if i < len(chat_rows):
            plan.append(Shape(chat_rows[i] - chat_new, chat_new, sampling=chat))
        if i == 0 and chat_rows and retry:
            again = chat | retry_request(chat_new, chat.get("steps"), retry)
            canvas = again.pop("max_new_tokens")
            if again["steps"] is None:
                del again["steps"]  # a request without steps takes one per token
            plan.append(Shape(chat_rows[0] - chat_new, canvas, sampling=again))
        if i < len(editor_rows):
            plan.append(Shape(editor_rows[i] - config.infill_tokens, config.infill_tokens, infill=True))
    if accelerator:  # batched buckets: a CPU serves few requests at once, and every bucket is a compile
        for b in batches[1:]:
            plan += [Shape(n - chat_new, chat_new, batch=b, sampling=chat) for n in chat_rows]
    return plan


def chat_defaults(rt: RuntimeProtocol) -> dict[str, Any]:
    """The model's own chat defaults (its generation_config.json) as request fields: the decoder and the
    chat's retry aside."""
    return {k: v for k, v in rt.chat_defaults.items() if k not in ("decoder", RETRY_KEY)}


@dataclass
class WarmQueue:
    """Programs waiting to be compiled in order, and how the current warm-up goes (k of n, estimate).

    Not thread-safe: the scheduler holds its lock around every call.
    """

    limit: int = MAX_WARM_TASKS
    tasks: deque[WarmTask] = field(default_factory=deque)
    done: int = 0
    total: int = 0
    seconds: list[float] = field(default_factory=list)  # what each real compile (or cache read) took

    def add(self, tasks: Iterable[WarmTask], *, first: bool = False) -> int:
        """Queue ``tasks`` (``first``: ahead of those waiting, in their order); returns how many fit."""
        new = list(tasks)[: max(0, self.limit - len(self.tasks))]
        if not self.tasks:
            self.done = self.total = 0  # a new warm-up: "k of n" counts from here
        if first:
            self.tasks.extendleft(reversed(new))
        else:
            self.tasks.extend(new)
        self.total += len(new)
        return len(new)

    def pop(self) -> WarmTask | None:
        return self.tasks.popleft() if self.tasks else None

    def finished(self, seconds: float | None) -> None:
        """One task done; ``seconds`` when it compiled (None: it was compiled already, or failed)."""
        self.done += 1
        if seconds is not None:
            self.seconds.append(seconds)

    def estimate(self, extra: int = 0) -> float | None:
        """Seconds until the queue (plus ``extra`` tasks) is compiled, once one compile has been timed."""
        if not self.seconds:
            return None
        return round(statistics.fmean(self.seconds[-8:]) * (len(self.tasks) + extra), 1)

    def counts(self, *, busy: bool) -> dict[str, Any]:
        """``warmed`` of ``shapes`` and ``eta_seconds`` for the status (``busy``: one is compiling)."""
        return {"warmed": self.done, "shapes": self.total, "eta_seconds": self.estimate(1 if busy else 0)}

    def one(self) -> float | None:
        """The estimated seconds of one compile (None before the first)."""
        return self.estimate(extra=1 - len(self.tasks)) if self.seconds else None
