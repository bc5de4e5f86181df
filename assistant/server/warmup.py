"""What the daemon compiles while it already serves: the warm-up plan, and the queue of programs to warm.

A new daemon takes requests as soon as its weights are loaded, and compiles, in this order, the programs
that requests are most likely to need:

1. the chat's first prompts (the daemon says "ready" on ``/health`` only once these are compiled, so the
   first prompt a chat sends the moment it shows ready waits for no compile): ``diffu chat`` with its
   built-in settings (:data:`CHAT_REQUEST`, the same fields the chat sends; ``tests/tui/test_parts.py``
   holds the two together) under the model's chat defaults, on the model's default decoder, one row,
   for a question of up to :data:`FIRST_PROMPT_TOKENS` with its template (the one or two smallest length
   buckets that hold it and the answer); and, where the model sets ``retry_block``, the chat's second
   decode of an answer whose code does not parse (the same question on the rounded-up canvas, fast
   decoder, those blocks) on the smallest of them;
2. the chat's next turns: the length buckets of prompts up to :data:`TALK_PROMPT_TOKENS` (a first
   question, its answer and a second question), each with its second decode;
3. the editor's: an infill of the daemon's ``infill_tokens`` with the request defaults, the smallest bucket
   first, between the chat's longer buckets; then (off CPU) the chat's on the batch buckets above one row.

Clients that know their shapes (``diffu lsp`` on connecting) ask ``POST /v1/diffu/warm``; their programs
go ahead of everything but the chat's first ones. Where the runtime allows it (``concurrent_compile``) the
warm-up compiles on a thread of its own, at a lower CPU priority once the chat's first programs are in,
so a request never waits for a warm-up compile it does not need: it waits only for its own program (and
if the warm-up thread is compiling exactly that one, for that compile to end). Plain Python: the runtime
builds rows and compiles; this module decides what and in which order.
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
# A first chat question with its template (DiffuCoder's system prompt and turn markers take 27 tokens of
# the bundled model's vocabulary). "Write a function that returns the sum of a list." is 39 tokens, a
# two-sentence request 55 to 60: the daemon's smallest bucket (256) holds a 192-token answer after up to
# 64 of them, the next (384) after up to 192, a request of about 150 words.
FIRST_PROMPT_TOKENS = 192
# A second turn: the first question, the chat's answer (192 tokens at most with the bundled model) and
# the second question.
TALK_PROMPT_TOKENS = 320
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
    ready: bool = False  # one of the chat's first programs: /health says ready once all of them are in


def shape_rows(rt: RuntimeProtocol, shape: Shape) -> tuple[CanvasRow, ...]:
    """Made-up rows of ``shape``: the context (split around the hole for an infill) and the masks. Only
    the shape reaches a compiled program, never the tokens."""
    filler, mask = rt.rows.tokenizer.pad_id, rt.rows.tokenizer.mask_id
    n = shape.prompt_tokens
    suffix = min(n, max(1, n // 4)) if shape.infill else 0
    prefix = n - suffix
    ids = (filler,) * prefix + (mask,) * shape.max_new_tokens + (filler,) * suffix
    row = CanvasRow(ids, (prefix, prefix + shape.max_new_tokens), chat=not shape.infill)
    return (row,) * shape.batch


def default_plan(
    rt: RuntimeProtocol, config: Config, *, accelerator: bool
) -> tuple[list[Shape], list[Shape]]:
    """The generic warm-up, most likely first (see the module's docstring): the shapes the daemon must
    have compiled before it says ready, then the rest."""
    chat = {**CHAT_REQUEST, **chat_defaults(rt)}
    chat_new = int(chat.pop("max_new_tokens"))
    retry = rt.info.chat_defaults.get(RETRY_KEY) or 0
    lengths = sorted({n for _, n in rt.info.buckets})
    # Each length bucket above the answer holds the prompts up to its length less the answer.
    chat_rows = [n for n in lengths if n > chat_new]

    def turn(n: int) -> list[Shape]:
        """The chat's shapes in bucket ``n``: the answer, then its second decode where the model has one."""
        prompt = n - chat_new
        shapes = [Shape(prompt, chat_new, sampling=chat)]
        if retry:
            again = chat | retry_request(chat_new, chat.get("steps"), retry)
            canvas = again.pop("max_new_tokens")
            if again["steps"] is None:
                del again["steps"]  # a request without steps takes one per token
            shapes.append(Shape(prompt, canvas, sampling=again))
        return shapes

    first = [n for n in chat_rows if n - chat_new <= FIRST_PROMPT_TOKENS] or chat_rows[:1]
    talk = [n for n in chat_rows if n not in first and n - chat_new <= TALK_PROMPT_TOKENS]
    longer = [n for n in chat_rows if n not in first and n not in talk]
    ready: list[Shape] = []
    later: list[Shape] = []
    for i, n in enumerate(first):
        shapes = turn(n)
        # The smallest bucket's second decode is needed as soon as its first answer's code fails to parse.
        ready += shapes if i == 0 else shapes[:1]
        later += [] if i == 0 else shapes[1:]
    for n in talk:
        later += turn(n)
    editor = [
        Shape(n - config.infill_tokens, config.infill_tokens, infill=True)
        for n in lengths
        if n > config.infill_tokens
    ]
    for i in range(max(len(editor), len(longer))):
        later += editor[i : i + 1] + (turn(longer[i]) if i < len(longer) else [])
    if accelerator:  # batched buckets: a CPU serves few requests at once, and every bucket is a compile
        for b in sorted({b for b, _ in rt.info.buckets})[1:]:
            later += [Shape(n - chat_new, chat_new, batch=b, sampling=chat) for n in first + talk]
    return ready, later


def chat_defaults(rt: RuntimeProtocol) -> dict[str, Any]:
    """The model's own chat defaults (its generation_config.json) as request fields: the decoder and the
    chat's retry aside."""
    return {k: v for k, v in rt.info.chat_defaults.items() if k not in ("decoder", RETRY_KEY)}


@dataclass
class WarmQueue:
    """Programs waiting to be compiled in order, and how the current warm-up goes (k of n, estimate).

    The chat's first programs (``WarmTask.ready``) stay at the front; ``ready_left`` counts those not
    compiled yet (queued or being compiled). Not thread-safe: the scheduler holds its lock around every
    call.
    """

    limit: int = MAX_WARM_TASKS
    tasks: deque[WarmTask] = field(default_factory=deque)
    done: int = 0
    total: int = 0
    ready_left: int = 0
    ready_total: int = 0
    seconds: list[float] = field(default_factory=list)  # what each real compile (or cache read) took

    def add(self, tasks: Iterable[WarmTask], *, first: bool = False) -> int:
        """Queue ``tasks`` (``first``: ahead of those waiting but the chat's first programs, in their
        order); returns how many fit."""
        new = list(tasks)[: max(0, self.limit - len(self.tasks))]
        if not self.tasks and not self.ready_left:
            self.done = self.total = 0  # a new warm-up: "k of n" counts from here
        if first:
            at = next((i for i, t in enumerate(self.tasks) if not t.ready), len(self.tasks))
            for i, task in enumerate(new):
                self.tasks.insert(at + i, task)
        else:
            self.tasks.extend(new)
        self.total += len(new)
        ready = sum(t.ready for t in new)
        self.ready_left += ready
        self.ready_total += ready
        return len(new)

    def pop(self) -> WarmTask | None:
        return self.tasks.popleft() if self.tasks else None

    def finished(self, task: WarmTask, seconds: float | None) -> None:
        """``task`` done; ``seconds`` when it compiled (None: it was compiled already, or failed)."""
        self.done += 1
        self.ready_left -= task.ready
        if seconds is not None:
            self.seconds.append(seconds)

    def drop(self) -> None:
        """Forget every queued task (the daemon stops)."""
        self.ready_left -= sum(t.ready for t in self.tasks)
        self.tasks.clear()

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
