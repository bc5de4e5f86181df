"""The run loops of the two decoders that keep a key/value cache (``fast.py``'s DualCache blocks,
``sliding.py``'s window), as ``Runtime`` methods: how their compiled programs are called for a batch,
streamed a forward at a time with the next call queued ahead, or a block (the sliding decoder: the whole
loop) per call, and how each row's end (a stop token, its last line) is found.

Both count every forward the device runs in ``Runtime.forwards``, a forward queued ahead for a consumer
that stopped reading included.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from model_runtime import fast, processes, sliding
from model_runtime.batch import PlacedBatch
from model_runtime.interface import BatchDone, BatchEvents, BatchStep, CanvasRow, CompileReport
from model_runtime.kernels import Knobs, row_keys
from model_runtime.params import SamplingParams
from model_runtime.sliding import spec_of as sliding_spec

if TYPE_CHECKING:
    from flax import nnx

    from model_runtime.config import DreamConfig
    from model_runtime.programs import ProgramCache
    from model_runtime.tokenizer import DreamTokenizer


class CachedRuns:
    """``Runtime``'s fast and sliding decoder runs and the BatchDone every decoder ends with (the
    attributes below are the Runtime's)."""

    config: DreamConfig
    tokenizer: DreamTokenizer
    state: nnx.State
    forwards: int
    _programs: ProgramCache
    _line_tables: dict[bool, np.ndarray]  # _newline_table's two tables, built on first use

    def _done(
        self,
        batch: PlacedBatch,
        final: np.ndarray,
        params: SamplingParams,
        steps: int,
        t_start: float,
        built: CompileReport,
    ) -> BatchDone:
        """The batch's BatchDone: the answers in ``final`` after ``steps`` forwards, timed from
        ``t_start``; ``built`` is what getting the programs cost."""
        return batch.done_event(
            final,
            self.tokenizer,
            pad_id=self.config.pad_token_id,
            steps=steps,
            elapsed=time.perf_counter() - t_start,
            compile_s=built.seconds,
            compiled=built.compiled,
            hits=built.cache_hits,
            decoder=params.decoder,
            max_lines=params.max_lines,
        )

    # -- the fast decoder ------------------------------------------------------------------------
    def fast_calls(self, rows: Sequence[CanvasRow], params: SamplingParams) -> fast.FastCalls:
        """The fast decoder's compiled programs for ``rows`` bound to their inputs, as ``run`` calls them
        (for benchmarks that time a refresh or a block on its own). InputError as ``run`` would."""
        from model_runtime.errors import InputError

        if params.decoder != "fast":
            raise InputError("fast_calls: the sampling parameters must name the fast decoder")
        return self._fast_calls(list(rows), params, self._checked_shape(rows, params))

    def _checked_shape(self, rows: Sequence[CanvasRow], params: SamplingParams) -> tuple[int, int]:
        raise NotImplementedError  # Runtime's

    def _fast_calls(
        self, rows: list[CanvasRow], params: SamplingParams, shape: tuple[int, int]
    ) -> fast.FastCalls:
        lo, hi, size, fspec = fast.layout(rows, params, shape)
        (refresh, block), compile_s, compiled, hits = self._programs.fast(shape, fspec)
        batch = PlacedBatch.of(rows, shape, self.config.pad_token_id)
        return fast.FastCalls(
            refresh_program=refresh,
            block_program=block,
            state=self.state,
            batch=batch,
            attn=jnp.asarray(batch.attn),
            keys=row_keys([r.seed_for(params) for r in rows], shape[0]),
            sampling=Knobs.of(params).sampling(),
            threshold=jnp.float32(params.threshold),
            factor=jnp.float32(params.factor or 1.0),
            lo=lo,
            hi=hi,
            size=size,
            compiled=CompileReport(compile_s, compiled, hits),
        )

    def _run_fast(
        self, rows: list[CanvasRow], params: SamplingParams, shape: tuple[int, int], stream: bool
    ) -> BatchEvents:
        """The fast decoder, early stop at end-of-text (and, with ``max_lines``, at the end of the row's
        last line). Streaming, one BatchStep per forward (the refresh, then each forward of the block
        loop, resumed one forward at a time); without it each block is one call.

        Every event's ``step`` counts forwards, so the last one, the BatchDone's ``steps`` and a history
        of the events agree; ``steps`` on an event is the bound (one forward per position of the region).
        """
        calls = self._fast_calls(rows, params, shape)
        batch, lo, hi, size = calls.batch, calls.lo, calls.hi, calls.size
        x = jnp.asarray(batch.x)
        stops = [set(self.tokenizer.stop_ids(chat=r.chat)) for r in rows]
        newlines = self._newline_table(params)
        run = _FastRun(calls, self.config.mask_token_id)
        t_start = time.perf_counter()
        try:
            for b, start in enumerate(calls.starts):
                t0 = time.perf_counter()
                x, caches = calls.refresh(x, b)
                run.forwards += 1
                if stream:
                    x, cur = yield from run.stream_block(x, caches, b, t0)
                else:
                    x, _, iters = calls.block(x, caches, b, 0, size)
                    cur = np.array(processes.host(x))  # one host sync per block: the end-of-text check
                    run.forwards += int(processes.host(iters))
                # Every block so far is decoded whole: a row has ended once a stop token or its last line
                # lies in them.
                decoded = cur[: len(rows), lo : start + size]
                ended = [any(t in stop for t in row) for row, stop in zip(decoded, stops, strict=True)]
                if params.max_lines:
                    lines = newlines[decoded].sum(axis=1) >= params.max_lines
                    ended = [e or bool(m) for e, m in zip(ended, lines, strict=True)]
                done = all(ended)
                if done and b < len(calls.starts) - 1:
                    # Every row has ended its text: the rest of the canvas would be padding. Fill it, stop.
                    rest = cur[:, start + size : hi]
                    rest[rest == run.mask_id] = self.config.pad_token_id
                run.prev = cur
                if done:
                    break
            yield self._done(batch, run.prev, params, run.forwards, t_start, calls.compiled)
        finally:
            self.forwards += run.settle()

    def _stop_table(self, rows: Sequence[CanvasRow], batch: int) -> np.ndarray:
        """``[batch, V]``: the tokens that end each row's text."""
        table = np.zeros((batch, self.config.vocab_size), bool)
        for j, r in enumerate(rows):
            table[j, list(self.tokenizer.stop_ids(chat=r.chat))] = True
        return table

    def _newline_table(self, params: SamplingParams) -> np.ndarray:
        """``[V]``: newlines per token id where lines are counted (``max_lines``), else zeros. Built once
        per kind and kept (read-only): every editor's one-line request needs it."""
        counted = bool(params.max_lines)
        if counted not in self._line_tables:
            table = np.zeros(self.config.vocab_size, np.int32)
            if counted:
                counts = self.tokenizer.newlines()[: self.config.vocab_size]
                table[: len(counts)] = counts
            table.flags.writeable = False
            self._line_tables[counted] = table
        return self._line_tables[counted]

    # -- the sliding decoder ---------------------------------------------------------------------
    def _sliding_inputs(
        self, rows: list[CanvasRow], params: SamplingParams, batch: PlacedBatch, fill: np.ndarray
    ) -> sliding.SlidingInputs:
        knobs = Knobs.of(params)
        return sliding.SlidingInputs(
            attn=jnp.asarray(batch.attn),
            fill=jnp.asarray(fill),
            stops=jnp.asarray(self._stop_table(rows, batch.shape[0])),
            newlines=jnp.asarray(self._newline_table(params)),
            max_lines=jnp.int32(params.max_lines or 0),
            key=row_keys([r.seed_for(params) for r in rows], batch.shape[0]),
            temperature=knobs.temperature,
            top_p=knobs.top_p,
            top_k=knobs.top_k,
            threshold=jnp.float32(params.threshold),
            factor=jnp.float32(params.factor or 1.0),
            refresh_every=jnp.int32(params.refresh_every),
        )

    def _run_sliding(
        self, rows: list[CanvasRow], params: SamplingParams, shape: tuple[int, int], stream: bool
    ) -> BatchEvents:
        """The sliding decoder. With ``stream`` one BatchStep per forward: each call runs one forward, and
        the next call is dispatched before this one's canvas is read, so the device never waits for the
        host; a consumer that stops reading (a cancelled job) stops it within two forwards. Without
        ``stream`` the whole loop is one call and one host sync."""
        batch = PlacedBatch.of(rows, shape, self.config.pad_token_id)
        (prefill, steps), compile_s, compiled, hits = self._programs.sliding(shape, sliding_spec(params))
        mask_id, pad_id = self.config.mask_token_id, self.config.pad_token_id
        fill = np.zeros(shape, bool)
        for j, r in enumerate(rows):
            lo, hi = batch.offsets[j] + r.region[0], batch.offsets[j] + r.region[1]
            fill[j, lo:hi] = batch.x[j, lo:hi] == mask_id
        inputs = self._sliding_inputs(rows, params, batch, fill)
        # Every forward commits at least one position of every unfinished row.
        bound = int(fill.sum(axis=1).max(initial=0))
        bound_ = jnp.int32(max(bound, 1))
        t_start = time.perf_counter()
        front, cache = prefill(self.state, jnp.asarray(batch.x), inputs)
        latest = front  # the last call dispatched: its count of forwards is what the device ran
        try:
            prev = batch.x
            if not stream:
                front, cache = steps(self.state, front, cache, inputs, bound_, bound_)
                latest = front
            else:
                t0 = t_start
                while True:
                    # Queue the next forward first (a no-op once every row is finished), then read this
                    # one: the device never waits for the host's event.
                    nxt = steps(self.state, front, cache, inputs, jnp.int32(1), bound_)
                    latest = nxt[0]
                    cur = processes.host(front.x)
                    done = bool(np.all(processes.host(front.finished)))
                    forwards = int(processes.host(front.forwards))
                    yield batch.step_event(prev, cur, forwards - 1, bound, time.perf_counter() - t0, mask_id)
                    t0 = time.perf_counter()
                    prev = cur
                    if done or forwards >= bound:
                        break
                    front, cache = nxt
            final = np.array(processes.host(front.x))
            forwards = int(processes.host(front.forwards))
            # A row that stopped early (end of text, end of its last line) leaves masks behind: padding.
            final[fill & (final == mask_id)] = pad_id
            yield self._done(
                batch, final, params, forwards, t_start, CompileReport(compile_s, compiled, hits)
            )
        finally:
            self.forwards += int(processes.host(latest.forwards))


class _FastRun:
    """One fast-decoder run's moving parts: the forwards counted, the last canvas on the host, and a
    call queued ahead whose forward is not counted yet (with its ``done`` argument): if the consumer
    stops reading, the device still runs it, and ``settle`` counts it if it did run one."""

    def __init__(self, calls: fast.FastCalls, mask_id: int) -> None:
        self.calls, self.mask_id = calls, mask_id
        self.forwards = 0
        self.prev: np.ndarray = calls.batch.x
        self.pending: tuple[Any, int] | None = None

    def stream_block(
        self, x: jax.Array, caches: Any, b: int, t0: float
    ) -> Generator[BatchStep, None, tuple[jax.Array, np.ndarray]]:
        """Block ``b`` after its refresh, a BatchStep per forward (the refresh's first): the block loop
        resumed one forward at a time (the same program, the same keys), each call queued before the
        previous forward's canvas is read, so the device never waits for the host's event and a consumer
        that stops reading stops it within two forwards. The loop's own condition, "a mask left in the
        block", is checked on the host copy; the call queued after the block's last forward finds none
        and changes nothing. Returns (x, the block's last canvas on the host)."""
        calls, mask_id = self.calls, self.mask_id
        where, bound = (b, len(calls.starts)), calls.hi - calls.lo
        window, size = calls.window(b), calls.size
        queued = calls.block(x, caches, b, 0, 1)
        self.pending = (queued, 0)
        cur = processes.host(x)
        yield calls.batch.step_event(
            self.prev, cur, self.forwards - 1, bound, time.perf_counter() - t0, mask_id, where
        )
        self.prev = cur
        for i in range(1, size + 1):
            t0 = time.perf_counter()
            x, caches, _ = queued
            self.pending = None
            if not np.any(cur[:, window : window + size] == mask_id):
                break  # the queued call found the block full and ran nothing
            queued = calls.block(x, caches, b, i, 1)
            self.pending = (queued, i)
            self.forwards += 1
            cur = processes.host(x)
            yield calls.batch.step_event(
                self.prev, cur, self.forwards - 1, bound, time.perf_counter() - t0, mask_id, where
            )
            self.prev = cur
        return x, np.array(cur)

    def settle(self) -> int:
        """The forwards run, a queued call's included if it ran one."""
        if self.pending is not None:
            (_, _, ran), done_before = self.pending
            self.forwards += int(processes.host(ran)) > done_before
            self.pending = None
        return self.forwards
