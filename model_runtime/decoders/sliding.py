"""The sliding decoder: a window of queries that follows each row's first mask over the DualCache, its
commit rule and early stops run on the device (one ``lax.while_loop``). Its kernels are in
``model_runtime/sliding.py``; this module holds its spec, programs and run loop.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from model_runtime.batch import PlacedBatch
from model_runtime.decoders.base import Device, HostLimits, Layout, ProgramKey, finish, region_mask, row_seeds
from model_runtime.interface import BatchEvents, CanvasRow, CompileReport
from model_runtime.params import SamplingParams, decoder_knobs
from model_runtime.specs import SlidingSpec

if TYPE_CHECKING:
    from model_runtime.kernels import Hook
    from model_runtime.programs import Program


@dataclass(frozen=True)
class Sliding:
    name: str = "sliding"
    fills_prompt_holes: bool = False  # its window follows the masks of the region after the prompt
    aligned_rows: bool = False  # each row has its own window
    accepts_hooks: bool = False
    full_forwards: bool = False

    @property
    def knobs(self) -> frozenset[str]:
        return decoder_knobs(self.name)

    def label(self, params: SamplingParams) -> str:
        rule = f"factor {params.factor}" if params.factor is not None else f"threshold {params.threshold}"
        extra = "" if params.commit_rule == "threshold" else f", {params.commit_rule}"
        extra += f", refresh every {params.refresh_every}" if params.refresh_every else ""
        return f"sliding, window {params.window}, {rule}{extra}"

    def min_length(self, params: SamplingParams) -> int:
        # The window must fit the canvas; a larger bucket keeps it whole (the window's size is the
        # request's, whichever rows share the batch).
        return params.window + 1

    def check(self, rows: Sequence[CanvasRow]) -> None:
        return None

    # -- programs ----------------------------------------------------------------------------------
    def keys(
        self,
        layout: Layout,
        rows: Sequence[CanvasRow],
        params: SamplingParams,
        shape: tuple[int, int],
        stream: bool,
    ) -> list[ProgramKey]:
        return self._keys(shape, SlidingSpec.of(params))

    @staticmethod
    def _keys(shape: tuple[int, int], spec: SlidingSpec) -> list[ProgramKey]:
        return [(kind, shape, spec) for kind in ("prefill", "steps")]

    def _programs(
        self, device: Device, shape: tuple[int, int], spec: SlidingSpec
    ) -> tuple[list[Program], CompileReport]:
        from model_runtime import sliding

        cache = device.programs
        return cache.programs(
            self._keys(shape, spec),
            cache.family(self.name, sliding.jitted),
            lambda kind, built: sliding.abstract_args(cache, kind, shape, spec, built),
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
        return self._programs(device, shape, SlidingSpec.of(params))[1]

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
        """With ``stream`` one BatchStep per forward: each call runs one forward, and the next call is
        dispatched before this one's canvas is read, so the device never waits for the host; a consumer
        that stops reading (a cancelled job) stops it within two forwards. Without ``stream`` the whole
        loop is one call and one host sync."""
        from model_runtime import sliding

        batch = PlacedBatch.of(rows, shape, device.config.pad_token_id)
        programs, built = self._programs(device, shape, SlidingSpec.of(params))
        mask_id, pad_id = device.mask_id, device.config.pad_token_id
        fill = region_mask(batch, mask_id)
        limits = HostLimits.of(device, rows, params, shape[0])
        calls = sliding.SlidingCalls.bind(
            programs, device.state, batch.x, batch.attn, fill, limits, row_seeds(rows, params), params
        )
        t_start = time.perf_counter()
        front, cache = calls.prefill()
        latest = front  # the last call dispatched: its count of forwards is what the device ran
        try:
            prev = batch.x
            if not stream:
                front, cache = calls.steps(front, cache)
                latest = front
            else:
                t0 = t_start
                while True:
                    # Queue the next forward first (a no-op once every row is finished), then read this
                    # one: the device never waits for the host's event.
                    nxt = calls.steps(front, cache, 1)
                    latest = nxt[0]
                    cur = device.host(front.x)
                    done = bool(np.all(device.host(front.finished)))
                    forwards = int(device.host(front.forwards))
                    yield batch.step_event(
                        prev, cur, forwards - 1, calls.bound, time.perf_counter() - t0, mask_id
                    )
                    t0 = time.perf_counter()
                    prev = cur
                    if done or forwards >= calls.bound:
                        break
                    front, cache = nxt
            final = np.array(device.host(front.x))
            forwards = int(device.host(front.forwards))
            # A row that stopped early (end of text, end of its last line) leaves masks behind: padding.
            final[fill & (final == mask_id)] = pad_id
            yield finish(device, batch, final, params, forwards, t_start, built)
        finally:
            device.count(int(device.host(latest.forwards)))

    def cost(self, parts: Mapping[str, float], block: int, tpf: float) -> float:
        """Each forward after its first asks queries for its window (8) over the cache, at most what a
        block step of the fast decoder costs (``block_step_ms``); its one full forward is counted once per
        ``block`` tokens, an upper bound for a region longer than a block."""
        return (parts["refresh_ms"] / block + parts["block_step_ms"] / tpf) / 1e3


SLIDING = Sliding()
