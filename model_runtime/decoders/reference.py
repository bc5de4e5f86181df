"""The reference decoder: the published ``diffusion_generate`` sampler, one full forward per step, exact
to the reference (docs/reference.md). Its kernels are in ``model_runtime/kernels.py``: one denoising step
per program call (streaming) or every step in one ``fori_loop`` program.

A request that asks for ``max_lines`` (a diffu extension: the published sampler has no such knob) stops
once every row's text has ended (its lines written, or a stop token with everything before it decoded):
the steps it runs are the published ones, so its answer is the same, and the positions after the answer,
never decoded, are padding. Without ``max_lines`` every step runs, as published.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
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
    row_seeds,
)
from model_runtime.interface import BatchEvents, CanvasRow, CompileReport
from model_runtime.params import SamplingParams, decoder_knobs
from model_runtime.specs import SamplerSpec
from model_runtime.strategies import EARLY_STOPS, EarlyStop, finished

if TYPE_CHECKING:
    from model_runtime.kernels import Hook
    from model_runtime.programs import Program


def ratio_bucket(steps: int) -> int:
    """Length of the schedule array the fused program takes: a power of two, so steps share programs."""
    return max(64, 1 << (steps - 1).bit_length())


def logits_window(layout: Layout, rows: Sequence[CanvasRow], n: int) -> int:
    """For plain generation (masks only in an appended region), the length bucket holding the region.

    Infill rows (masks between prefix and suffix) or masks inside a prompt use the whole canvas (0): their
    extent varies request by request, and every distinct window is another program.
    """
    mask_id = layout.mask_id
    if any(r.region[1] != len(r.ids) or mask_id in r.ids[: r.region[0]] for r in rows):
        return 0
    return layout.window_for(max(r.region[1] - r.region[0] for r in rows), n)


@dataclass(frozen=True)
class Reference:
    name: str = "reference"
    fills_prompt_holes: bool = True
    aligned_rows: bool = False
    accepts_hooks: bool = True
    full_forwards: bool = True

    @property
    def knobs(self) -> frozenset[str]:
        return decoder_knobs(self.name)

    def label(self, params: SamplingParams) -> str:
        return "reference"

    def min_length(self, params: SamplingParams) -> int:
        return 1

    def check(self, rows: Sequence[CanvasRow]) -> None:
        return None

    # -- programs ----------------------------------------------------------------------------------
    def key(
        self,
        kind: str,
        shape: tuple[int, int],
        spec: SamplerSpec,
        hooks: tuple[Hook | None, Hook | None] = (None, None),
        n_ratios: int = 0,
        window: int = 0,
        stops: tuple[EarlyStop, ...] = (),
    ) -> ProgramKey:
        """The key of one program: ``kind`` "step" (one step), "all" (every step, the schedule padded to
        ``n_ratios`` entries) or "until" (every step until ``stops`` finish every row), the bucket, the
        sampler's switches, the hooks and the logits ``window``."""
        return (kind, shape, spec, *hooks, n_ratios, window, stops)

    @staticmethod
    def stops(params: SamplingParams, hooks: tuple[Hook | None, Hook | None]) -> tuple[EarlyStop, ...]:
        """The early stops of a run: with ``max_lines`` or a ``block_scope`` (and no parity hooks), the
        text's end; else none (every step runs, as published)."""
        ends = params.max_lines or params.block_scope is not None
        return EARLY_STOPS if ends and hooks == (None, None) else ()

    def _key_of(
        self,
        layout: Layout,
        rows: Sequence[CanvasRow],
        params: SamplingParams,
        shape: tuple[int, int],
        stream: bool,
        hooks: tuple[Hook | None, Hook | None] = (None, None),
    ) -> ProgramKey:
        hooked = hooks != (None, None)
        stops = self.stops(params, hooks)
        return self.key(
            "step" if stream else "until" if stops else "all",
            shape,
            SamplerSpec.from_params(params),
            hooks,
            n_ratios=0 if stream else ratio_bucket(params.steps),
            window=0 if hooked else logits_window(layout, rows, shape[1]),
            # The streamed step checks them on the host: its program is the same with or without.
            stops=() if stream else stops,
        )

    def keys(
        self,
        layout: Layout,
        rows: Sequence[CanvasRow],
        params: SamplingParams,
        shape: tuple[int, int],
        stream: bool,
    ) -> list[ProgramKey]:
        return [self._key_of(layout, rows, params, shape, stream)]

    def program(self, device: Device, key: ProgramKey) -> tuple[Program, CompileReport]:
        """The program under ``key`` (:meth:`key`), held or built."""
        from model_runtime import kernels

        kind, shape, spec, logits_hook, tokens_hook, n_ratios, window, stops = key
        # The cache's row counts, a static: a program traced under other counts is another program.
        statics: dict[str, Any] = {"window": window, "rows": device.programs.row_buckets}
        statics |= (
            {"stops": stops} if kind == "until" else {"logits_hook": logits_hook, "tokens_hook": tokens_hook}
        )
        (program,), report = device.programs.programs(
            [key],
            device.programs.family(self.name, kernels.jitted),
            lambda kind, built: kernels.abstract_args(device.programs, kind, shape, n_ratios),
            spec,
            statics,
        )
        return program, report

    def compile(
        self,
        device: Device,
        rows: Sequence[CanvasRow],
        params: SamplingParams,
        shape: tuple[int, int],
        stream: bool,
    ) -> CompileReport:
        return self.program(device, self._key_of(device, rows, params, shape, stream))[1]

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
        """Every step a full forward; streaming, one program call and one BatchStep per step. With early
        stops (``max_lines``) it ends once every row is finished: checked on the host after each streamed
        step, on the device in the fused loop."""
        from model_runtime import kernels

        key = self._key_of(device, rows, params, shape, stream, hooks)
        program, built = self.program(device, key)
        batch = PlacedBatch.of(rows, shape, device.config.pad_token_id)
        calls = kernels.ReferenceCalls.bind(
            program, device.state, batch.attn, row_seeds(rows, params), params
        )
        x: Any = calls.canvas(batch.x)
        logits_hook, tokens_hook = hooks
        if tokens_hook is not None:
            x = tokens_hook(None, x, None)  # the reference calls the tokens hook once before the loop
        mask_id = device.mask_id
        stops = self.stops(params, hooks)
        fill = region_mask(batch, mask_id)
        limits = HostLimits.of(device, rows, params, shape[0])
        t_start = time.perf_counter()
        steps = params.steps
        if not stream and stops:
            out, ran = calls.until(x, key[5], fill, limits)
            prev, steps = device.host(out), int(device.host(ran))
        elif not stream:
            prev = device.host(calls.loop(x, key[5]))
        else:
            prev = device.host(x)
            for i in range(params.steps):
                t0 = time.perf_counter()
                x = calls.step(x, i)
                cur = device.host(x)  # the one host transfer per step that streaming needs
                yield batch.step_event(prev, cur, i, params.steps, time.perf_counter() - t0, mask_id)
                prev = cur
                if stops and bool(np.all(finished(stops, np, cur, fill, limits, mask_id)[1])):
                    steps = i + 1
                    break
        device.count(steps)
        if stops:
            # What a row never decoded, after the end of its text: padding.
            prev = np.array(prev)
            prev[fill & (prev == mask_id)] = device.config.pad_token_id
        yield finish(device, batch, prev, params, steps, t_start, built)

    def step_canvas(
        self, device: Device, x: np.ndarray, attn: np.ndarray | None, step: int, params: SamplingParams
    ) -> np.ndarray:
        """Denoising step ``step`` of ``params.steps`` on an arbitrary ``[B, L]`` canvas, through the same
        compiled program ``run`` uses at the canvas's exact shape: for parity checks that feed a
        reference's canvas in and compare what each side commits."""
        from model_runtime import kernels

        x = np.asarray(x, np.int32)
        attn = np.ones(x.shape, bool) if attn is None else np.asarray(attn, bool)
        shape = (int(x.shape[0]), int(x.shape[1]))
        program, _ = self.program(device, self.key("step", shape, SamplerSpec.from_params(params)))
        calls = kernels.ReferenceCalls.bind(program, device.state, attn, [params.seed] * shape[0], params)
        return device.host(calls.step(calls.canvas(x), step))

    def cost(self, parts: Mapping[str, float], block: int, tpf: float) -> float:
        """One full forward per step."""
        return parts["forward_ms"] / 1e3 / tpf


REFERENCE = Reference()
