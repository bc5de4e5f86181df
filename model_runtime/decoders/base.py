"""What a decoder is (:class:`Decoder`), what a runtime lends it to run (:class:`Device`), and the pieces
every decoder's run shares.

A decoder is a value: one module per decoder under ``model_runtime/decoders/`` holds its spec (the static
switches of its programs, from the sampling parameters), its program keys, how its programs are built,
its run loop, its cost model and its label; ``model_runtime.decoders.get(name)`` finds it. The modules
import no JAX at the top: clients (the chat's settings, the fake runtime, the evaluation's planning) read
a decoder's traits and keys without it, and the device half of a decoder (its kernels, in
``model_runtime/fast.py``, ``sliding.py``, ``kernels.py``) is imported when a runtime first compiles or
runs it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from model_runtime.batch import PlacedBatch
from model_runtime.interface import BatchDone, BatchEvents, CanvasRow, CompileReport
from model_runtime.params import SamplingParams

if TYPE_CHECKING:
    from model_runtime.config import DreamConfig
    from model_runtime.kernels import Hook
    from model_runtime.programs import ProgramCache
    from model_runtime.tokenizer import DreamTokenizer

ProgramKey = tuple[Any, ...]  # (kind, (batch, length) bucket, the decoder's static spec, ...)


class Layout(Protocol):
    """What a request's program keys depend on besides the request: the runtime's mask token and the
    logits window its length buckets give (the fake runtime answers these too)."""

    @property
    def mask_id(self) -> int: ...

    def window_for(self, new_tokens: int, n: int) -> int:
        """The logits window plain generation of ``new_tokens`` uses on an ``n``-token canvas (0: all)."""
        ...


class Device(Layout, Protocol):
    """What a loaded runtime lends a decoder's run: the model on its device, its program cache, its
    tokenizer, and its count of forwards."""

    config: DreamConfig
    tokenizer: DreamTokenizer
    state: Any  # the parameters (an ``nnx.State``) on the device
    programs: ProgramCache

    def host(self, x: Any) -> np.ndarray:
        """A device array's value on this host (on a mesh, gathered)."""
        ...

    def count(self, forwards: int) -> None:
        """Add ``forwards`` the device ran (one queued ahead for a consumer that stopped reading too)."""
        ...

    def newline_table(self, counted: bool) -> np.ndarray:
        """``[V]``: newlines per token id where lines are counted (``max_lines``), else zeros; read-only."""
        ...

    def line_table(self) -> np.ndarray:
        """``[lines.ROWS, V]``: where each token puts line breaks, indentation and code; read-only."""
        ...


class Decoder(Protocol):
    """One decoder: its traits, its programs and its run. ``shape`` is the rows' (batch, length) bucket,
    checked by the runtime with :meth:`min_length` and :meth:`check`."""

    @property
    def name(self) -> str:
        """What ``SamplingParams.decoder`` calls it."""
        ...

    @property
    def knobs(self) -> frozenset[str]:
        """The sampling options only some decoders read that this one reads (``params.decoder_knobs``:
        each option declares which decoders read it)."""
        ...

    @property
    def fills_prompt_holes(self) -> bool:
        """Whether it unmasks masks anywhere in a raw prompt, not only in a canvas after it."""
        ...

    @property
    def aligned_rows(self) -> bool:
        """Whether every row of a batch must have its region in the same columns."""
        ...

    @property
    def accepts_hooks(self) -> bool:
        """Whether it runs the logits and tokens hooks of the parity tests."""
        ...

    @property
    def full_forwards(self) -> bool:
        """Whether every forward runs the model over the whole canvas (its FLOPs are a full forward's)."""
        ...

    def label(self, params: SamplingParams) -> str:
        """The setting's name in tables: the decoder and what sets it apart."""
        ...

    def min_length(self, params: SamplingParams) -> int:
        """The shortest canvas bucket a run of ``params`` needs, whatever its rows."""
        ...

    def check(self, rows: Sequence[CanvasRow]) -> None:
        """InputError for rows this decoder cannot run together."""
        ...

    def keys(
        self,
        layout: Layout,
        rows: Sequence[CanvasRow],
        params: SamplingParams,
        shape: tuple[int, int],
        stream: bool,
    ) -> list[ProgramKey]:
        """The keys of the programs ``run`` uses: a runtime holding them all starts without compiling."""
        ...

    def compile(
        self,
        device: Device,
        rows: Sequence[CanvasRow],
        params: SamplingParams,
        shape: tuple[int, int],
        stream: bool,
    ) -> CompileReport:
        """Build (or find) the programs ``run`` uses for rows of this shape; what it cost."""
        ...

    def run(
        self,
        device: Device,
        rows: Sequence[CanvasRow],
        params: SamplingParams,
        shape: tuple[int, int],
        *,
        stream: bool,
        hooks: tuple[Hook | None, Hook | None] = (None, None),
    ) -> BatchEvents:
        """Denoise ``rows``: a BatchStep per forward when streaming, then the BatchDone."""
        ...

    def cost(self, parts: Mapping[str, float], block: int, tpf: float) -> float:
        """Seconds per generated token its forwards cost (``parts``: ``forward_ms``, ``refresh_ms``,
        ``block_step_ms``) at ``tpf`` tokens per forward, ``block`` tokens per full forward."""
        ...


def finish(
    device: Device,
    batch: PlacedBatch,
    final: np.ndarray,
    params: SamplingParams,
    forwards: int,
    t_start: float,
    built: CompileReport,
) -> BatchDone:
    """The run's BatchDone: the answers in ``final`` after ``forwards`` forwards, timed from ``t_start``;
    ``built`` is what getting the programs cost."""
    return batch.done_event(
        final,
        device.tokenizer,
        pad_id=device.config.pad_token_id,
        steps=forwards,
        elapsed=time.perf_counter() - t_start,
        compile_s=built.seconds,
        compiled=built.compiled,
        hits=built.cache_hits,
        decoder=params.decoder,
        max_lines=params.max_lines,
    )


def stop_table(device: Device, rows: Sequence[CanvasRow], batch: int) -> np.ndarray:
    """``[batch, V]``: the tokens that end each row's text (spare rows: none)."""
    table = np.zeros((batch, device.config.vocab_size), bool)
    for j, r in enumerate(rows):
        table[j, list(device.tokenizer.stop_ids(chat=r.chat))] = True
    return table


@dataclass(frozen=True)
class HostLimits:
    """What a run's early stops read (``strategies.StopTables``), on the host; ``kernels.Limits`` puts
    them on the device."""

    stops: np.ndarray  # [B, V] bool: tokens that end each row's text
    newlines: np.ndarray  # [V] i32: newlines per token (zeros when lines are not counted)
    max_lines: int  # 0: no limit
    lines: np.ndarray  # [lines.ROWS, V] i32: line breaks, indentation and code per token
    scope: np.ndarray  # [B] i32: each row's scope in columns (-1: none)

    @classmethod
    def of(cls, device: Device, rows: Sequence[CanvasRow], params: SamplingParams, batch: int) -> HostLimits:
        """The limits of a run of ``rows`` (in a bucket of ``batch`` rows) under ``params``."""
        scope = np.full(batch, -1, np.int32)
        if params.block_scope is not None:
            scope[: len(rows)] = params.block_scope
        return cls(
            stop_table(device, rows, batch),
            device.newline_table(bool(params.max_lines)),
            params.max_lines or 0,
            device.line_table(),
            scope,
        )


def region_mask(batch: PlacedBatch, mask_id: int) -> np.ndarray:
    """``[B, L]`` bool: the masks of each row's region in the bucket, the positions its run decodes."""
    fill = np.zeros(batch.shape, bool)
    for j, r in enumerate(batch.rows):
        lo, hi = batch.offsets[j] + r.region[0], batch.offsets[j] + r.region[1]
        fill[j, lo:hi] = batch.x[j, lo:hi] == mask_id
    return fill


def row_seeds(rows: Sequence[CanvasRow], params: SamplingParams) -> list[int]:
    """Each row's seed: a row draws from its own, alone or in any batch."""
    return [r.seed_for(params) for r in rows]
