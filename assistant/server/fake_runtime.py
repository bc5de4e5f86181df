"""A JAX-free stand-in for ``model_runtime.Runtime``: the same ``RuntimeProtocol``, rows and events.

It drives daemon, client, TUI and LSP tests without a model: ``diffu serve --model fake:`` serves it, and
``FakeRuntime(...)`` can be used in-process. Its "model" is deterministic: the answer for a row depends
only on the row's prompt (and ``seed`` when ``temperature > 0``), never on the other rows of its batch,
so batched and one-at-a-time runs give the same text, as the real runtime promises for greedy decoding.

Tokens are characters: id = code point + ``FIRST_CHAR_ID``, and ids below it are special tokens.
Denoising unmasks the canvas over ``steps`` steps in a fixed pseudo-random order (the reference's
``origin``-style schedule: ``ceil(masks_left / steps_left)`` positions per step), and each step costs
``step_delay`` seconds whatever the batch size, the way a step of a small batch costs about the same as
one row on an accelerator. Its "programs" are compiled as the real runtime's are, one per bucket and
sampler switches, each costing ``warmup_delay`` seconds the first time (``compile``, or ``run`` on demand).
Loading takes ``load_delay`` seconds, then waits for the file ``load_gate`` where that is given: a test
opens the gate once its client has seen the loading stage, so the stage is seen on however busy a machine.
"""

from __future__ import annotations

import hashlib
import math
import random
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from model_runtime import decoders
from model_runtime import generation_config as gc
from model_runtime.errors import InputError, ModelError
from model_runtime.inflight import InFlight
from model_runtime.interface import (
    BatchDone,
    BatchEvents,
    BatchStep,
    CanvasRow,
    CompileReport,
    GenerationStats,
    RuntimeInfo,
    RuntimeProtocol,
)
from model_runtime.model_ref import is_fake_spec
from model_runtime.params import SamplingParams
from model_runtime.rows import CanvasBuilder

PAD_ID, EOS_ID, MASK_ID, IM_START_ID, IM_END_ID = 0, 1, 2, 3, 4
FIRST_CHAR_ID = 16
_SPECIAL = {
    PAD_ID: "<|endoftext|>",
    EOS_ID: "<|eos|>",
    MASK_ID: "<|mask|>",
    IM_START_ID: "<|im_start|>",
    IM_END_ID: "<|im_end|>",
}
_WORDS = (
    "def",
    "return",
    "x",
    "y",
    "value",
    "items",
    "for",
    "in",
    "if",
    "None",
    "result",
    "print",
    "self",
    "list",
    "total",
    "+",
    "=",
    "(",
    ")",
    ":",
    "0",
    "1",
)


class FakeTokenizer:
    """Character-level tokenizer with the special ids the runtime exposes."""

    mask_id = MASK_ID
    eos_id = EOS_ID
    pad_id = PAD_ID

    def encode(self, text: str) -> list[int]:
        return [ord(c) + FIRST_CHAR_ID for c in text]

    def encode_text(self, text: str) -> list[int]:
        return self.encode(text)  # characters only: no string becomes a control token here

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(chr(i - FIRST_CHAR_ID) if i >= FIRST_CHAR_ID else _SPECIAL.get(i, "") for i in ids)

    def token_strings(self, ids: Sequence[int]) -> list[str]:
        return [chr(i - FIRST_CHAR_ID) if i >= FIRST_CHAR_ID else _SPECIAL.get(i, "<?>") for i in ids]

    def stop_ids(self, *, chat: bool) -> tuple[int, ...]:
        return (EOS_ID, PAD_ID, IM_END_ID) if chat else (EOS_ID, PAD_ID)

    def encode_chat(self, messages: Sequence[dict[str, str]]) -> list[int]:
        """A ChatML-like template: each message between turn markers, then the assistant's turn."""
        ids = []
        for msg in messages:
            ids += [IM_START_ID, *self.encode(f"{msg['role']}\n{msg['content']}"), IM_END_ID]
        return ids + [IM_START_ID, *self.encode("assistant\n")]


@dataclass
class FakeRuntime:
    """The fake runtime. Options come from ``fake:key=value,...`` model specs (see :func:`load_fake`)."""

    step_delay: float = 0.0
    load_delay: float = 0.0
    warmup_delay: float = 0.0
    max_context: int = 512
    model_name: str = "fake"
    length_buckets: tuple[int, ...] = (128, 512)
    batch_buckets: tuple[int, ...] = (1, 4, 16)
    default_decoder: str = "reference"
    chat_defaults: dict[str, Any] = field(default_factory=dict)  # a real model's: generation_config.json
    one_line_defaults: dict[str, Any] = field(default_factory=dict)
    block_defaults: dict[str, Any] = field(default_factory=dict)
    chat_decoder: dict[str, Any] = field(default_factory=dict)
    editor_context: int | None = None
    # A model directory whose generation_config.json the fake takes all of the above from (the decoder it
    # recommends, its chat's, its one-line and block knobs): a daemon that decides as that model's does.
    generation: str = ""

    def __post_init__(self) -> None:
        if self.max_context < 2:
            raise ModelError(f"max_context: must be >= 2, got {self.max_context}")
        if self.generation:
            self.default_decoder = gc.recommended_decoder(self.generation)
            self.chat_defaults = gc.chat_defaults(self.generation)
            self.one_line_defaults = gc.one_line_defaults(self.generation)
            self.block_defaults = gc.block_defaults(self.generation)
            self.chat_decoder = gc.chat_decoder(self.generation)
            self.editor_context = gc.editor_context(self.generation)
        self.tokenizer = FakeTokenizer()
        self.runs: list[int] = []  # batch size of every run, for tests that check batching
        # What it did, in order: ("compile", keys) when a compile starts, ("compiled", keys) when it ends,
        # ("run", rows) when a batch's first step runs: tests check what overlapped by order, not by time.
        self.log: list[tuple[str, Any]] = []
        self.forwards = 0  # fake steps run (each stands for one forward)
        self.programs: set[tuple[Any, ...]] = set()  # what the real runtime would have compiled
        self._inflight: InFlight[CompileReport] = InFlight()
        lengths = sorted({n for n in self.length_buckets if n <= self.max_context} | {self.max_context})
        self._lengths = tuple(lengths)
        self.info = RuntimeInfo(
            model_name=self.model_name,
            device="cpu (fake runtime, no JAX)",
            dtype="float32",
            max_context=self.max_context,
            vocab_size=0x110000 + FIRST_CHAR_ID,  # every code point
            buckets=tuple((b, n) for b in sorted(set(self.batch_buckets)) for n in lengths),
            default_decoder=self.default_decoder,
            chat_defaults=self.chat_defaults,
            one_line_defaults=self.one_line_defaults,
            block_defaults=self.block_defaults,
            chat_decoder=self.chat_decoder,
            editor_context=self.editor_context,
            # Its tokenizer reads "<|mask|>" as plain characters, so a raw prompt has no holes to fill.
            supports_holes=False,
            concurrent_compile=True,  # its "compiles" (sleeps) build each program once, as the real ones do
        )
        self.rows = CanvasBuilder(self.tokenizer, self.max_context)

    def program_cache(self) -> None:
        """None: it compiles nothing a status report would count."""
        return None

    # -- programs --------------------------------------------------------------------------------------
    def _bucket(self, rows: Sequence[CanvasRow]) -> tuple[int, int]:
        longest = max(len(r.ids) for r in rows)
        return min(
            ((b, n) for b, n in self.info.buckets if b >= len(rows) and n >= longest),
            default=(len(rows), longest),
        )

    @property
    def mask_id(self) -> int:
        return MASK_ID

    def window_for(self, new_tokens: int, n: int) -> int:
        """The real runtime's logits window, over these length buckets (a program key holds it)."""
        window = min((b for b in self._lengths if b >= new_tokens), default=None)
        return 0 if window is None or window >= n else window

    def _programs(self, rows: Sequence[CanvasRow], params: SamplingParams, stream: bool) -> tuple[Any, ...]:
        """The keys of the programs the real runtime would build for this request: the decoder's own
        (``decoders.Decoder.keys``) over this runtime's buckets."""
        self._check(rows)
        return tuple(decoders.get(params.decoder).keys(self, rows, params, self._bucket(rows), stream))

    def program_keys(self, rows: Sequence[CanvasRow], params: SamplingParams) -> frozenset[Hashable]:
        return frozenset(self._programs(rows, params, True))

    def compiled(self, rows: Sequence[CanvasRow], params: SamplingParams, *, stream: bool = True) -> bool:
        return all(k in self.programs for k in self._programs(rows, params, stream))

    def compile(
        self, rows: Sequence[CanvasRow], params: SamplingParams, *, stream: bool = True
    ) -> CompileReport:
        keys = self._programs(rows, params, stream)

        def build() -> CompileReport:
            t0 = time.perf_counter()
            self.log.append(("compile", keys))
            time.sleep(self.warmup_delay)  # stands for compiling one request's programs
            self.programs.update(keys)
            self.log.append(("compiled", keys))
            return CompileReport(time.perf_counter() - t0, compiled=1)

        def held() -> CompileReport | None:
            return CompileReport() if all(k in self.programs for k in keys) else None

        report, waited = self._inflight.get(keys, held, build)
        # Waiting for another thread's compile of it costs time but compiles nothing here, as in programs.py.
        return report if waited is None else CompileReport(waited + report.seconds, report.compiled)

    # -- generation ------------------------------------------------------------------------------------
    def answer(self, row: CanvasRow, params: SamplingParams) -> list[int]:
        """The ids the fake model converges to for ``row``: words, then a stop token if they run short."""
        context = row.ids[: row.region[0]] + row.ids[row.region[1] :]
        digest = hashlib.sha256(repr(context).encode()).digest()
        seed = int.from_bytes(digest[:8], "little") + (row.seed_for(params) if params.temperature > 0 else 0)
        rng = random.Random(seed)
        # Answers end early (with a stop token) about half the time, like a model that says less.
        n_chars = row.canvas_tokens if rng.random() < 0.5 else max(1, row.canvas_tokens * 2 // 3)
        text = ""
        while len(text) < n_chars:
            text += rng.choice(_WORDS) + " "
        ids = self.tokenizer.encode(text[:n_chars])
        stop = IM_END_ID if row.chat else EOS_ID
        return ids + [stop] * (row.canvas_tokens - len(ids))

    def run(
        self,
        rows: Sequence[CanvasRow],
        params: SamplingParams,
        *,
        stream: bool = True,
    ) -> BatchEvents:
        """Every fake step stands for one forward."""
        self._check(rows)
        return self._run(rows, params, stream)

    def _check(self, rows: Sequence[CanvasRow]) -> None:
        if not rows:
            raise InputError("rows: at least one row is needed")
        if len(rows) > self.info.largest_batch:
            raise InputError(f"a batch of {len(rows)} rows is larger than the largest batch bucket")
        for i, row in enumerate(rows):
            if len(row.ids) > self.max_context:
                raise InputError(f"row {i}: {len(row.ids)} tokens exceed the context of {self.max_context}")

    def _run(self, rows: Sequence[CanvasRow], params: SamplingParams, stream: bool) -> BatchEvents:
        built = self.compile(rows, params, stream=stream)  # on demand, as the real runtime compiles in run
        self.runs.append(len(rows))
        self.log.append(("run", len(rows)))
        t0 = time.perf_counter()
        targets = [self.answer(r, params) for r in rows]
        canvases = [[MASK_ID] * r.canvas_tokens for r in rows]
        orders = []
        for r, t in zip(rows, targets, strict=True):
            order = list(range(r.canvas_tokens))
            random.Random(len(t) * 7919 + sum(t)).shuffle(order)
            orders.append(order)
        steps = params.steps
        for step in range(steps):
            t_step = time.perf_counter()
            time.sleep(self.step_delay)  # stands for one forward pass of the whole batch
            self.forwards += 1
            unmasked = []
            for canvas, target, order in zip(canvases, targets, orders, strict=True):
                left = [p for p in order if canvas[p] == MASK_ID]
                k = math.ceil(len(left) / (steps - step)) if left else 0
                chosen = sorted(left[:k])
                for p in chosen:
                    canvas[p] = target[p]
                unmasked.append(chosen)
            if not stream:
                continue  # the whole loop at once, as the real runtime's fused program
            yield BatchStep(
                step=step,
                steps=steps,
                canvas=[list(c) for c in canvases],
                unmasked=unmasked,
                seconds=time.perf_counter() - t_step,  # this step's own time, as the real runtime
                masks_left=[c.count(MASK_ID) for c in canvases],
            )
        texts, new_tokens = [], 0
        for row, canvas in zip(rows, canvases, strict=True):
            stops = self.tokenizer.stop_ids(chat=row.chat)
            cut = next((i for i, t in enumerate(canvas) if t in stops), len(canvas))
            texts.append(self.tokenizer.decode(canvas[:cut]))
            new_tokens += cut
        seconds = time.perf_counter() - t0
        stats = GenerationStats(
            steps=steps,
            new_tokens=new_tokens,
            batch_size=len(rows),
            compile_seconds=built.seconds,
            compiled_programs=built.compiled,
            generate_seconds=seconds,
            tokens_per_second=new_tokens / max(seconds, 1e-9),
            bucket=self._bucket(rows),
        )
        sequences = [
            [*r.ids[: r.region[0]], *c, *r.ids[r.region[1] :]] for r, c in zip(rows, canvases, strict=True)
        ]
        yield BatchDone(
            texts=texts,
            sequences=sequences,
            generated=canvases,
            prompt_lengths=[r.region[0] for r in rows],
            stats=stats,
        )

    def generate(self, prompts: list[list[int]], params: SamplingParams, *, chat: bool) -> BatchEvents:
        return self.run([self.rows.make_row(p, params.max_new_tokens, chat=chat) for p in prompts], params)

    def infill(self, prefix: str, suffix: str, canvas_tokens: int, params: SamplingParams) -> BatchEvents:
        return self.run([self.rows.make_infill_row(prefix, suffix, canvas_tokens)], params)


_FAKE_FIELDS: dict[str, Callable[[str], Any]] = {
    "step_delay": float,
    "load_delay": float,
    "warmup_delay": float,
    "max_context": int,
    "editor_context": int,
    "generation": str,
    "load_gate": str,
}

GATE_TIMEOUT = 120.0  # seconds a load waits for its gate file before it fails


def parse_fake_spec(spec: str) -> dict[str, Any]:
    """Options of a ``fake:step_delay=0.01,max_context=256`` model spec (``generation=DIR``: a model
    directory's generation_config.json); a bad one raises ModelError."""
    options: dict[str, Any] = {}
    body = spec.split(":", 1)[1] if ":" in spec else ""
    for item in filter(None, (part.strip() for part in body.split(","))):
        key, sep, value = item.partition("=")
        if not sep or key not in _FAKE_FIELDS:
            raise ModelError(
                f"fake model option {item!r}: expected key=value with key in {', '.join(_FAKE_FIELDS)}"
            )
        try:
            options[key] = _FAKE_FIELDS[key](value)
        except ValueError:
            raise ModelError(f"fake model option {key}: not a number: {value!r}") from None
    return options


def _wait_for_gate(gate: Path) -> None:
    """Load until ``gate`` exists: a test opens it once it has seen the loading stage, so that stage is
    seen however slowly the machine runs the test's processes."""
    deadline = time.monotonic() + GATE_TIMEOUT
    while not gate.exists():
        if time.monotonic() > deadline:
            raise ModelError(f"fake model option load_gate: {gate} did not appear in {GATE_TIMEOUT:.0f} s")
        time.sleep(0.01)


def load_fake(
    spec: str,
    *,
    progress: Callable[[str, float], None] | None = None,
    max_context: int | None = None,
    length_buckets: Sequence[int] | None = None,
    batch_buckets: Sequence[int] | None = None,
) -> FakeRuntime:
    """Build a :class:`FakeRuntime` from a ``fake:...`` spec, reporting load progress like the real one.

    The keyword arguments mirror ``model_runtime.load``; options in the spec win over them.
    """
    options: dict[str, Any] = {}
    if max_context is not None:
        options["max_context"] = max_context
    if length_buckets:
        options["length_buckets"] = tuple(length_buckets)
    if batch_buckets:
        options["batch_buckets"] = tuple(batch_buckets)
    options.update(parse_fake_spec(spec))
    if progress:
        progress("loading fake weights", 0.0)
    time.sleep(float(options.get("load_delay", 0.0)))  # stands for reading a checkpoint
    gate = options.pop("load_gate", None)
    if gate:
        _wait_for_gate(Path(gate))
    runtime = FakeRuntime(**options)
    if progress:
        progress("loading fake weights", 1.0)
    return runtime


__all__ = ["CanvasRow", "FakeRuntime", "FakeTokenizer", "is_fake_spec", "load_fake"]


if TYPE_CHECKING:
    # The type checker in .ci/run holds this class to the interface the daemon serves.
    _conforms: type[RuntimeProtocol] = FakeRuntime
