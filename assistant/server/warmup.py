"""What the daemon compiles before it says ready and while it already serves: the warm-up plan, and the
queue of programs to warm.

A new daemon takes requests as soon as its weights are loaded, and compiles first what every client of
its sends with its defaults, so that after the daemon's first answer no client's first request waits for
a compile (issue #44); ``/health`` says ok only once these are compiled and have run once:

1. the chat (``diffu chat`` with its built-in settings, :data:`CHAT_REQUEST`, under the model's chat
   settings, its chat decoder included; ``tests/tui/test_parts.py`` holds the two together): one row,
   for a first question of up to :data:`FIRST_PROMPT_TOKENS` with its template, then, where the model
   sets ``retry_block``, the chat's second decode of a first answer whose code does not parse, then a
   second turn of up to :data:`TALK_PROMPT_TOKENS` (the length buckets that hold them with the answer);
   two rows at once (two chats), on the smallest of them;
2. ``diffu generate`` on a raw prompt (the model's settings, its recommended decoder);
3. the editors (``diffu lsp`` with its built-in settings, :data:`EDITOR`, which ``lsp.settings`` and
   ``lsp.suggest`` hold the same: a test keeps them together): each suggestion kind (the cursor line,
   an empty line, a block) with a prompt of the whole context budget, automatic, and invoked with its
   sampled candidates (``candidates - 1`` rows).

Then, in the background: the chat's longer turns, the editors' shorter prompts (small files) and (off
CPU) the chat on the larger batch buckets. Clients that know their shapes (``diffu lsp`` on connecting)
ask ``POST /v1/diffu/warm``; their programs go ahead of everything but the first ones. Where the runtime
allows it (``concurrent_compile``) the warm-up compiles on threads of its own, at a lower CPU priority
once the first ones are in, so a request never waits for a warm-up compile it does not need. Plain
Python: the runtime builds rows and compiles; this module decides what and in which order.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from assistant.config import Config
from assistant.wire import TALK_PROMPT_TOKENS, chat_prompts, prompt_budget
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
# A raw prompt of diffu generate: a function's signature and docstring.
GENERATE_PROMPT_TOKENS = 64


@dataclass(frozen=True)
class EditorDefaults:
    """What ``diffu lsp`` sends with its built-in settings (``lsp.settings.Settings``, ``lsp.suggest``; the
    lsp package cannot be imported here: a test keeps the two in step)."""

    # The prompt's budget (the file around the cursor and other files' snippets), within the row the model
    # recommends for editors (``RuntimeInfo.editor_context``, which ``diffu lsp`` learns from /v1/models).
    context_tokens: int = 1024
    # Each suggestion kind: its canvas and what ends its answer (max_lines 1; a block_scope, traced).
    kinds: tuple[tuple[str, int, dict[str, Any]], ...] = (
        ("the cursor line", 24, {"max_lines": 1}),
        ("an empty line", 32, {"block_scope": 0}),
        ("a block", 64, {"block_scope": 1}),
    )
    temperature: float = 0.0
    candidates: int = 3  # invoked: the greedy answer and candidates - 1 sampled ones, batched
    candidate_temperature: float = 0.8


EDITOR = EditorDefaults()
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
    client: str = ""  # whom it is for, in the status (the warm-up's own shapes)

    def describe(self) -> str:
        kind = "infill" if self.infill else "generation"
        rows = f"{self.batch} rows of " if self.batch > 1 else ""
        said = f"{kind}, {rows}{self.prompt_tokens} + {self.max_new_tokens} tokens"
        return f"{self.client}: {said}" if self.client else said


@dataclass(frozen=True)
class WarmTask:
    """Programs to compile: those ``run(rows, params)`` uses. ``label`` says what they are for."""

    rows: tuple[CanvasRow, ...]
    params: SamplingParams
    label: str
    ready: bool = False  # one of the clients' first programs: /health says ready once all of them are in


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
    first, talk = chat_prompts(lengths, chat_new)
    chats = [Shape(p, chat_new, sampling=chat, client="the chat") for p in first + talk]
    ready = chats[:1]
    if first and retry:
        # Right after the first question's: a first answer whose code does not parse is decoded again at
        # once (a newcomer's `diffu chat --once "def add(a, b):"` waited 18 s for this compile).
        ready.append(_retry(first[0], chat, chat_new, retry))
    ready += chats[1:]
    if first:
        ready.append(Shape(first[0], chat_new, batch=2, sampling=chat, client="two chats at once"))
    model = {k: v for k, v in rt.info.chat_defaults.items() if k != RETRY_KEY}
    gen_new = int(model.pop("max_new_tokens", chat_new))
    ready.append(Shape(GENERATE_PROMPT_TOKENS, gen_new, sampling=model, client="diffu generate --raw"))
    row = min(rt.info.max_context, rt.info.editor_context or rt.info.max_context)
    ready += editor_shapes(row)
    later: list[Shape] = []
    for n in lengths:
        if n - chat_new > TALK_PROMPT_TOKENS:
            later.append(Shape(n - chat_new, chat_new, sampling=chat, client="the chat, a long conversation"))
    for p in first[1:] + talk:
        if retry:
            later.append(_retry(p, chat, chat_new, retry))
    budget = min(EDITOR.context_tokens, row)
    for n in lengths:
        if n < budget:  # a file shorter than the budget: a prompt that fills a shorter bucket
            later += editor_shapes(n, client="the editors, a short file")
    if accelerator:  # batched buckets: a CPU serves few requests at once, and every bucket is a compile
        for b in sorted({b for b, _ in rt.info.buckets})[1:]:
            later += [Shape(p, chat_new, batch=b, sampling=chat, client="the chat") for p in first + talk]
    return ready, later


def _retry(prompt: int, chat: dict[str, Any], chat_new: int, block: int) -> Shape:
    """The chat's second decode of an answer whose code does not parse, after a ``prompt``."""
    again = chat | retry_request(chat_new, chat.get("steps"), block)
    canvas = again.pop("max_new_tokens")
    if again["steps"] is None:
        del again["steps"]  # a request without steps takes one per token
    return Shape(prompt, canvas, sampling=again, client="the chat's second decode")


def editor_shapes(length: int, *, client: str = "the editors") -> list[Shape]:
    """The editors' suggestions with their built-in settings (:data:`EDITOR`): per kind, automatic (steps
    half the canvas) and invoked (the whole canvas; its sampled candidates apart and together), with a
    prompt of the whole context budget that fits ``length`` tokens with the canvas."""
    shapes = []
    for kind, canvas, ends in EDITOR.kinds:
        budget = prompt_budget(EDITOR.context_tokens, canvas, length)
        if budget <= 0:
            continue
        auto = {"steps": max(1, canvas // 2), "temperature": EDITOR.temperature, **ends}
        shapes.append(Shape(budget, canvas, infill=True, sampling=auto, client=f"{client}, {kind}"))
        if EDITOR.candidates > 1:
            # Its sampled candidates go together, or one by one when they reach the daemon apart.
            sampled = {"steps": canvas, "temperature": EDITOR.candidate_temperature, "seed": 1, **ends}
            invoked = f"{client}, {kind} (invoked: sampled candidates)"
            for rows in sorted({1, EDITOR.candidates - 1}):
                shapes.append(
                    Shape(budget, canvas, infill=True, batch=rows, sampling=sampled, client=invoked)
                )
    return shapes


def chat_defaults(rt: RuntimeProtocol) -> dict[str, Any]:
    """The model's own chat settings (its generation_config.json) as request fields: its chat defaults with
    its chat's decoder over them (as the chat layers them: ``DaemonStatus.chat_settings``), the chat's
    retry aside."""
    merged = {**rt.info.chat_defaults, **rt.info.chat_decoder}
    return {k: v for k, v in merged.items() if k != RETRY_KEY}


@dataclass
class WarmQueue:
    """Programs waiting to be compiled in order, and how the current warm-up goes (k of n, estimate).

    The clients' first programs (``WarmTask.ready``) stay at the front; ``ready_left`` counts those not
    compiled yet (queued or being compiled). ``running`` counts the tasks taken from the queue and not
    finished yet (compiling, or waiting for or having their first run): the warm-up is over only when it
    and the queue are both empty. Not thread-safe: the scheduler holds its lock around every
    call.
    """

    limit: int = MAX_WARM_TASKS
    tasks: deque[WarmTask] = field(default_factory=deque)
    done: int = 0
    total: int = 0
    ready_left: int = 0
    ready_total: int = 0
    running: int = 0
    seconds: list[float] = field(default_factory=list)  # what each real compile (or cache read) took

    def add(self, tasks: Iterable[WarmTask], *, first: bool = False) -> int:
        """Queue ``tasks`` (``first``: ahead of those waiting but the clients' first programs, in their
        order); returns how many fit."""
        new = list(tasks)[: max(0, self.limit - len(self.tasks))]
        if not self.tasks and not self.running:
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
        if not self.tasks:
            return None
        self.running += 1
        return self.tasks.popleft()

    @property
    def over(self) -> bool:
        """Nothing queued and nothing taken that has not finished."""
        return not self.tasks and not self.running

    def finished(self, task: WarmTask, seconds: float | None) -> None:
        """``task`` done; ``seconds`` when it compiled (None: it was compiled already, or failed)."""
        self.done += 1
        self.running -= 1
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
