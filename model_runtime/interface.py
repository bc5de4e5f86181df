"""The runtime's interface, free of JAX: what it is, the events it yields, and the protocol.

Three things serve requests through this interface: ``model_runtime.Runtime`` (the model on its devices),
``assistant.server.fake_runtime.FakeRuntime`` (no model, for tests and ``--model fake:``) and
``model_runtime.distributed.Leader`` (process 0 of a multi-host daemon). The scheduler and the HTTP layer
are typed against :class:`RuntimeProtocol` only; ``tests/model_runtime/test_interface.py`` and the type
checker in ``.ci/run`` hold all three to it. The protocol is narrow on purpose: a frozen
:class:`RuntimeInfo` for everything fixed once the model is loaded (name, device, context, buckets,
defaults), the row builder (``model_runtime.rows.CanvasBuilder``, one class for all three), and the few
calls that touch the device. A new status field is one field of ``RuntimeInfo``, set where a runtime is
built; the leader passes the value on whole.

Events come in one vocabulary across the layers, each named for its unit: the runtime yields
:class:`BatchStep` and :class:`BatchDone` for a batch of rows, the scheduler turns them into ``JobStep``,
``JobDone`` and ``JobError`` for one request (``assistant.server.scheduler``), and clients read ``Step`` and
``Done`` off the wire (``assistant.client``). A request the runtime cannot run raises
``model_runtime.errors.InputError`` before the first event; there is no error event.

Clients import this module without paying for JAX, so it must stay plain Python.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Generator, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol, runtime_checkable

from model_runtime.params import SamplingParams
from model_runtime.rows import CanvasBuilder, CanvasRow, TokenizerProtocol

__all__ = [
    "BatchDone",
    "BatchEvent",
    "BatchEvents",
    "BatchStep",
    "CanvasRow",
    "CompileReport",
    "GenerationStats",
    "RuntimeInfo",
    "RuntimeProtocol",
    "TokenizerProtocol",
]


@dataclass(frozen=True)
class RuntimeInfo:
    """What a loaded runtime is: fixed from the end of its load, read by the daemon for its status
    report, its limits (context, vocabulary, buckets) and a request's defaults (decoder, chat knobs)."""

    model_name: str
    device: str  # where it runs, for status reports (``gpu:NVIDIA H100 x1``)
    dtype: str
    max_context: int  # the longest row (prompt, canvas and suffix) it runs, in tokens
    vocab_size: int
    buckets: tuple[tuple[int, int], ...]  # the (batch, length) shapes it compiles; a batch must fit one
    default_decoder: str = "reference"  # what a request that names none gets (the model's recommendation)
    # The sampling knobs a chat with this model starts from (its generation_config.json); read-only.
    chat_defaults: Mapping[str, Any] = field(default_factory=dict)
    # The sampling knobs a request whose answer is one line (``max_lines`` 1) gets when it names no
    # decoder (its generation_config.json's ``diffu_one_line``; empty: the default decoder); read-only.
    one_line_defaults: Mapping[str, Any] = field(default_factory=dict)
    # The same for a request with a ``block_scope`` (``diffu_block``: an editor's block suggestions).
    block_defaults: Mapping[str, Any] = field(default_factory=dict)
    # The decoder and its knobs a chat takes (``diffu_chat``; the chat layers them over chat_defaults).
    chat_decoder: Mapping[str, Any] = field(default_factory=dict)
    # The longest row (prompt and canvas) the model recommends for an editor's suggestion when its user sets
    # no prompt budget (``diffu_editor_context``); None: the model's context.
    editor_context: int | None = None
    supports_holes: bool = False  # whether ``<|mask|>`` in a raw prompt is the mask token
    quantize_mode: str | None = None  # ``int8``/``int4`` when the weights are quantized
    mesh: Mapping[str, object] | None = None  # the device mesh for status reports; None without one
    # Whether ``compile`` may run on another thread while ``run`` runs: the daemon then warms up on a
    # thread of its own, beside the requests.
    concurrent_compile: bool = False
    # The process's native threads before it first compiled (``compile_cache.backend_threads``; empty:
    # unknown): the daemon tells XLA's compile threads, started later, by them.
    backend_threads: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        # Shared by every request of the daemon: a caller must not change the model's defaults for all.
        object.__setattr__(self, "chat_defaults", MappingProxyType(dict(self.chat_defaults)))
        for name in ("one_line_defaults", "block_defaults", "chat_decoder"):
            object.__setattr__(self, name, MappingProxyType(dict(getattr(self, name))))
        object.__setattr__(self, "buckets", tuple((int(b), int(n)) for b, n in self.buckets))

    @property
    def largest_batch(self) -> int:
        """The most rows one batch may hold."""
        return max((b for b, _ in self.buckets), default=1)


@dataclass(frozen=True)
class BatchStep:
    """One denoising step of a batch: one forward of the model, whatever the decoder.

    ``canvas`` holds, per row, the generated region's token ids after this step (masks included);
    ``unmasked`` the positions (relative to the generated region) committed in this step; ``seconds`` this
    step's own wall time (not the time since the generation started).
    """

    step: int
    steps: int
    canvas: list[list[int]]
    unmasked: list[list[int]]
    seconds: float
    masks_left: list[int] = field(default_factory=list)
    # Each row's whole content after this step (prompt and region, without padding), for full histories.
    content: list[list[int]] = field(default_factory=list)
    # The fast decoder works block by block: the block this step is in and how many there are (0: the
    # reference decoder, which has no blocks). Its ``steps`` is then a bound (one forward per position),
    # not a count: a block ends as soon as none of its positions is masked.
    block: int = 0
    blocks: int = 0


@dataclass(frozen=True)
class GenerationStats:
    steps: int
    new_tokens: int
    batch_size: int
    compile_seconds: float
    generate_seconds: float
    tokens_per_second: float
    compiled_programs: int = 0
    cache_hits: int = 0
    bucket: tuple[int, int] = (0, 0)
    decoder: str = "reference"

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["bucket"] = list(self.bucket)
        return d


@dataclass(frozen=True)
class BatchDone:
    """The end of a batch's generation: the decoded answers and the raw canvases.

    ``sequences`` are the full canvases as the reference returns them (left pads, prompt, generated
    region); ``generated`` only the generated region per row; ``texts`` the post-processed strings;
    ``answer_tokens`` how many of each row's generated tokens its answer is (up to its first stop token,
    or through the end of its last line for a request with ``max_lines``; empty: not counted).
    """

    texts: list[str]
    sequences: list[list[int]]
    generated: list[list[int]]
    prompt_lengths: list[int]
    stats: GenerationStats
    answer_tokens: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class CompileReport:
    """What getting a generation's programs ready cost: seconds, programs XLA compiled, and programs
    loaded from the persistent compilation cache (all zero when every program was in memory)."""

    seconds: float = 0.0
    compiled: int = 0
    cache_hits: int = 0


BatchEvent = BatchStep | BatchDone
BatchEvents = Generator[BatchEvent, None, None]
"""What ``run`` returns: closing it early stops the device work before the next step."""


@runtime_checkable
class RuntimeProtocol(Protocol):
    """A loaded model as the daemon serves it: what it is, its row builder, compile, denoise batches."""

    @property
    def info(self) -> RuntimeInfo: ...

    @property
    def rows(self) -> CanvasBuilder:
        """Builds its canvas rows (plain, infill, infill with files, holes) and holds its tokenizer."""
        ...

    @property
    def forwards(self) -> int:
        """Forwards of the model run since start, by every decoder (the daemon's counters report it)."""
        ...

    def program_cache(self) -> dict[str, int | None] | None:
        """The compiled-program cache now: its bound, contents and memory ceiling for status reports;
        None for a runtime that compiles nothing."""
        ...

    def program_keys(self, rows: Sequence[CanvasRow], params: SamplingParams) -> frozenset[Hashable]:
        """The keys of the programs ``run(rows, params)`` uses (the decoder's, over the rows' bucket): two
        requests that share one wait for the same compile.

        Bad input raises ``InputError``, as ``run`` would.
        """
        ...

    def compiled(self, rows: Sequence[CanvasRow], params: SamplingParams) -> bool:
        """Whether ``run(rows, params)`` would start without compiling (its programs are in memory).

        Bad input raises ``InputError``, as ``run`` would.
        """
        ...

    def compile(self, rows: Sequence[CanvasRow], params: SamplingParams) -> CompileReport:
        """Compile (or load from the persistent cache) the programs ``run(rows, params)`` uses, without
        running them; a no-op costing nothing when they are in memory. Only the rows' shape matters.

        Bad input raises ``InputError``, as ``run`` would.
        """
        ...

    def run(
        self,
        rows: Sequence[CanvasRow],
        params: SamplingParams,
        *,
        stream: bool = True,
    ) -> BatchEvents:
        """Denoise ``rows`` as one batch: a BatchStep per step (without ``stream``, none), then one
        BatchDone. A step is one forward of the model, whatever the decoder.

        Bad input raises ``InputError`` here, before the iterator is returned; closing the iterator early
        stops the device work before the next step. Programs not yet compiled are compiled first, inside
        the iterator (``compile`` does it ahead of time).
        """
        ...
