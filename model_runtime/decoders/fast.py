"""The fast decoder: Fast-dLLM's DualCache blocks with confidence-threshold parallel unmasking. Its
kernels (the refresh and the block loop) are in ``model_runtime/fast.py``; this module holds where it works
in a bucket, its programs, its run loop (streamed a forward at a time with the next call queued ahead, or
a block per call) and its early stop after each block.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from model_runtime.batch import PlacedBatch
from model_runtime.decoders.base import (
    Device,
    HostLimits,
    Layout,
    ProgramKey,
    finish,
    region_mask,
)
from model_runtime.errors import InputError
from model_runtime.interface import BatchEvents, BatchStep, CanvasRow, CompileReport
from model_runtime.params import SamplingParams, decoder_knobs, fast_block_size
from model_runtime.specs import FastSpec, SamplerSpec
from model_runtime.strategies import EARLY_STOPS, EarlyStop, commit_rule, finished

if TYPE_CHECKING:
    from model_runtime.fast import FastCalls
    from model_runtime.kernels import Hook
    from model_runtime.programs import Program


@dataclass(frozen=True)
class Fast:
    name: str = "fast"
    fills_prompt_holes: bool = False  # it unmasks the canvas after the prompt only, block by block
    aligned_rows: bool = True
    accepts_hooks: bool = False
    full_forwards: bool = False
    # Checked on the host after each block (the whole block is decoded by then).
    stops: tuple[EarlyStop, ...] = field(default=EARLY_STOPS)

    @property
    def knobs(self) -> frozenset[str]:
        return decoder_knobs(self.name)

    def label(self, params: SamplingParams) -> str:
        rule = f"factor {params.factor}" if params.factor is not None else f"threshold {params.threshold}"
        return f"fast, block {params.block_length}, {rule}"

    def min_length(self, params: SamplingParams) -> int:
        return 1

    def check(self, rows: Sequence[CanvasRow]) -> None:
        layouts = {(len(r.ids) - r.region[0], len(r.ids) - r.region[1]) for r in rows}
        if len(layouts) > 1:
            raise InputError(
                "the fast decoder needs every row's region in the same columns (same "
                "length and the same number of tokens after it); run them separately"
            )

    def layout(
        self, rows: Sequence[CanvasRow], params: SamplingParams, shape: tuple[int, int]
    ) -> tuple[tuple[int, int, int], FastSpec]:
        """Where it works in the bucket: the region's columns [lo, hi) and the block size, and the programs'
        static switches. Every row's region sits in the same columns (``check``)."""
        n = shape[1]
        r = rows[0]
        lo = n - len(r.ids) + r.region[0]  # rows are left-padded: a row starts at n - len(ids)
        hi = n - len(r.ids) + r.region[1]
        size = fast_block_size(params.block_length, hi - lo, n - 1)
        spec = FastSpec(
            sampler=SamplerSpec.proposals(params),
            block_length=size,
            rule=commit_rule("threshold", params.factor),
        )
        return (lo, hi, size), spec

    # -- programs ----------------------------------------------------------------------------------
    def keys(
        self,
        layout: Layout,
        rows: Sequence[CanvasRow],
        params: SamplingParams,
        shape: tuple[int, int],
        stream: bool,
    ) -> list[ProgramKey]:
        return self._keys(shape, self.layout(rows, params, shape)[1])

    @staticmethod
    def _keys(shape: tuple[int, int], spec: FastSpec) -> list[ProgramKey]:
        return [(kind, shape, spec) for kind in ("refresh", "block")]

    def _programs(
        self, device: Device, shape: tuple[int, int], spec: FastSpec
    ) -> tuple[list[Program], CompileReport]:
        from model_runtime import fast

        cache = device.programs
        return cache.programs(
            self._keys(shape, spec),
            cache.family(self.name, fast.jitted),
            lambda kind, built: fast.abstract_args(cache, kind, shape, built),
            spec,
        )

    def compile(
        self,
        device: Device,
        rows: Sequence[CanvasRow],
        params: SamplingParams,
        shape: tuple[int, int],
        stream: bool,
    ) -> CompileReport:
        return self._programs(device, shape, self.layout(rows, params, shape)[1])[1]

    def calls(
        self, device: Device, rows: Sequence[CanvasRow], params: SamplingParams, shape: tuple[int, int]
    ) -> FastCalls:
        """Its compiled programs for ``rows`` bound to their inputs, as ``run`` calls them (the benchmarks
        time a refresh or a block on its own with them)."""
        from model_runtime import fast

        region, spec = self.layout(rows, params, shape)
        programs, report = self._programs(device, shape, spec)
        batch = PlacedBatch.of(rows, shape, device.config.pad_token_id)
        return fast.FastCalls.bind(programs, device.state, batch, params, region, report)

    # -- running -----------------------------------------------------------------------------------
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
        """Block by block, early stop at the end of every row's text (``stops``). Streaming, one BatchStep
        per forward (the refresh, then each forward of the block loop, resumed one forward at a time);
        without it each block is one call.

        Every event's ``step`` counts forwards, so the last one, the BatchDone's ``steps`` and a history
        of the events agree; ``steps`` on an event is the bound (one forward per position of the region).
        """
        calls = self.calls(device, rows, params, shape)
        batch, size = calls.batch, calls.size
        limits = HostLimits.of(device, rows, params, shape[0])
        fill = region_mask(batch, device.mask_id)
        x = calls.canvas()
        run = _FastRun(calls, device)
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
                    cur = np.array(device.host(x))  # one host sync per block: the end-of-text check
                    run.forwards += int(device.host(iters))
                # Every block so far is decoded whole: a row has ended once its text so far ends it.
                _, ended = finished(self.stops, np, cur, fill, limits, device.mask_id)
                done = bool(np.all(ended[: len(rows)]))
                if done and b < len(calls.starts) - 1:
                    # Every row has ended its text: the rest of the canvas would be padding. Fill it, stop.
                    rest = cur[:, start + size : calls.hi]
                    rest[rest == device.mask_id] = device.config.pad_token_id
                run.prev = cur
                if done:
                    break
            yield finish(device, batch, run.prev, params, run.forwards, t_start, calls.compiled)
        finally:
            device.count(run.settle())

    def cost(self, parts: Mapping[str, float], block: int, tpf: float) -> float:
        """A block of ``block`` tokens takes ``block / tpf`` forwards, one of them the refresh (a full
        forward keeping K/V), the others block steps over the cache."""
        forwards = max(block / tpf, 1.0)
        return (parts["refresh_ms"] + (forwards - 1.0) * parts["block_step_ms"]) / 1e3 / block


class _FastRun:
    """One run's moving parts: the forwards counted, the last canvas on the host, and a call queued ahead
    whose forward is not counted yet (with its ``done`` argument): if the consumer stops reading, the
    device still runs it, and ``settle`` counts it if it did run one."""

    def __init__(self, calls: FastCalls, device: Device) -> None:
        self.calls, self.device = calls, device
        self.forwards = 0
        self.prev: np.ndarray = calls.batch.x
        self.pending: tuple[Any, int] | None = None

    def stream_block(
        self, x: Any, caches: Any, b: int, t0: float
    ) -> Generator[BatchStep, None, tuple[Any, np.ndarray]]:
        """Block ``b`` after its refresh, a BatchStep per forward (the refresh's first): the block loop
        resumed one forward at a time (the same program, the same keys), each call queued before the
        previous forward's canvas is read, so the device never waits for the host's event and a consumer
        that stops reading stops it within two forwards. The loop's own condition, "a mask left in the
        block", is checked on the host copy; the call queued after the block's last forward finds none
        and changes nothing. Returns (x, the block's last canvas on the host)."""
        calls, host, mask_id = self.calls, self.device.host, self.device.mask_id
        where, bound = (b, len(calls.starts)), calls.hi - calls.lo
        window, size = calls.window(b), calls.size
        queued = calls.block(x, caches, b, 0, 1)
        self.pending = (queued, 0)
        cur = host(x)
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
            cur = host(x)
            yield calls.batch.step_event(
                self.prev, cur, self.forwards - 1, bound, time.perf_counter() - t0, mask_id, where
            )
            self.prev = cur
        return x, np.array(cur)

    def settle(self) -> int:
        """The forwards run, a queued call's included if it ran one."""
        if self.pending is not None:
            (_, _, ran), done_before = self.pending
            self.forwards += int(self.device.host(ran)) > done_before
            self.pending = None
        return self.forwards


FAST = Fast()
