"""The runtime's interface, free of JAX: the rows it denoises, the events it yields, and the protocol.

Three things serve requests through this interface: ``model_runtime.Runtime`` (the model on its devices),
``assistant.server.fake_runtime.FakeRuntime`` (no model, for tests and ``--model fake:``) and
``model_runtime.distributed.Leader`` (process 0 of a multi-host daemon). The scheduler and the HTTP layer
are typed against :class:`RuntimeProtocol` only; ``tests/model_runtime/test_interface.py`` and the type
checker in ``.ci/run`` hold all three to it.

Events come in one vocabulary across the layers, each named for its unit: the runtime yields
:class:`BatchStep` and :class:`BatchDone` for a batch of rows, the scheduler turns them into ``JobStep``,
``JobDone`` and ``JobError`` for one request (``assistant.server.scheduler``), and clients read ``Step`` and
``Done`` off the wire (``assistant.client``). A request the runtime cannot run raises
``model_runtime.errors.InputError`` before the first event; there is no error event.

Clients import this module without paying for JAX, so it must stay plain Python.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from model_runtime.params import SamplingParams


@dataclass(frozen=True)
class CanvasRow:
    """One row of a batch: its token ids (prompt and masks, no padding) and the region to report.

    For plain generation the region is the ``max_new_tokens`` masks appended after the prompt; for
    infill it is the masks between prefix and suffix; for a prompt with ``<|mask|>`` holes it spans the
    first hole to the last. ``chat`` picks the stop tokens of the answer. ``seed`` is the row's own PRNG
    seed (its request's), so rows with different seeds share a batch and each draws as it would alone;
    None takes the batch's ``params.seed``.
    """

    ids: tuple[int, ...]
    region: tuple[int, int]
    chat: bool = False
    seed: int | None = None

    def seed_for(self, params: SamplingParams) -> int:
        """The seed this row samples with in a batch run with ``params``."""
        return params.seed if self.seed is None else self.seed

    @property
    def canvas_tokens(self) -> int:
        """Positions in the reported region."""
        return self.region[1] - self.region[0]


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
    region); ``generated`` only the generated region per row; ``texts`` the post-processed strings.
    """

    texts: list[str]
    sequences: list[list[int]]
    generated: list[list[int]]
    prompt_lengths: list[int]
    stats: GenerationStats


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
class TokenizerProtocol(Protocol):
    """What serving needs of a tokenizer: text to ids and back, and the special ids."""

    @property
    def mask_id(self) -> int: ...

    @property
    def eos_id(self) -> int: ...

    @property
    def pad_id(self) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def encode_text(self, text: str) -> list[int]:
        """Ids of text people wrote: control-token strings in it stay text, never control tokens."""
        ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def token_strings(self, ids: Sequence[int]) -> list[str]:
        """One printable piece per id (step events render canvases from them)."""
        ...

    def stop_ids(self, *, chat: bool) -> tuple[int, ...]:
        """The ids an answer is cut at."""
        ...


@runtime_checkable
class RuntimeProtocol(Protocol):
    """A loaded model as the daemon serves it: build rows, compile, denoise batches into events."""

    @property
    def model_name(self) -> str: ...

    @property
    def device(self) -> str:
        """Where it runs, for status reports (``gpu:NVIDIA H100 x1``)."""
        ...

    @property
    def dtype(self) -> str: ...

    @property
    def quantize_mode(self) -> str | None:
        """``int8``/``int4`` when the weights are quantized, else None."""
        ...

    @property
    def mesh_info(self) -> dict[str, object] | None:
        """The device mesh for status reports; None without one."""
        ...

    @property
    def program_cache(self) -> dict[str, int | None] | None:
        """The compiled-program cache's bound, contents and memory ceiling for status reports; None for a
        runtime that compiles nothing."""
        ...

    @property
    def max_context(self) -> int:
        """The longest row (prompt, canvas and suffix) it runs, in tokens."""
        ...

    @property
    def vocab_size(self) -> int: ...

    @property
    def default_decoder(self) -> str:
        """The decoder a request that names none gets (the model's recommendation)."""
        ...

    @property
    def chat_defaults(self) -> dict[str, Any]:
        """The sampling knobs a chat with this model starts from (its generation_config.json)."""
        ...

    @property
    def supports_holes(self) -> bool:
        """Whether ``<|mask|>`` in a raw prompt is the mask token (so its holes can be filled)."""
        ...

    @property
    def tokenizer(self) -> TokenizerProtocol: ...

    @property
    def buckets(self) -> list[tuple[int, int]]:
        """The (batch, length) shapes it compiles; a batch must fit one."""
        ...

    def encode_chat(self, messages: Sequence[dict[str, str]]) -> list[int]: ...

    def encode_prompt(self, text: str, *, holes: bool = False) -> list[int]: ...

    def make_row(self, prompt_ids: Sequence[int], max_new_tokens: int, *, chat: bool) -> CanvasRow: ...

    def make_infill_row(self, prefix: str, suffix: str, canvas_tokens: int) -> CanvasRow: ...

    def make_holes_row(self, prompt_ids: Sequence[int]) -> tuple[CanvasRow, int]: ...

    def make_repo_infill_row(
        self, prefix: str, suffix: str, canvas_tokens: int, files: Sequence[tuple[str, str]]
    ) -> tuple[CanvasRow, bool]: ...

    def hole_fills(self, row: CanvasRow, region_ids: Sequence[int]) -> list[str]: ...

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
        every_forward: bool = True,
    ) -> BatchEvents:
        """Denoise ``rows`` as one batch: a BatchStep per step (without ``stream``, none), then one
        BatchDone. A step is one forward of the model; with ``every_forward`` off the fast decoder runs
        each block's forwards as one program and reports once per block (the reference decoder has one
        forward per step either way).

        Bad input raises ``InputError`` here, before the iterator is returned; closing the iterator early
        stops the device work before the next step. Programs not yet compiled are compiled first, inside
        the iterator (``compile`` does it ahead of time).
        """
        ...
