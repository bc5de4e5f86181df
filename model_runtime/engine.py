"""Loading a checkpoint and running the denoising loop: ``load(...)`` and ``Runtime.run(...)``.

The step is one jitted pure function of (graphdef, state, canvas, ...). Shapes are bucketed: a batch is
left-padded to a (batch, length) bucket, which leaves every real row's result unchanged (pads are masked
out as keys and do not shift real positions, dream-reference.md 2.2), so another prompt length inside a
bucket reuses the compiled program. Programs are compiled ahead of time per bucket and sampler switch,
timed, and also stored in JAX's persistent compilation cache.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from model_runtime import compile_cache, distributed, fast, quant, sharding
from model_runtime.checkpoint import (
    check_names,
    list_tensors,
    read_tensors,
    refuse_pickle_only,
    resolve_model_dir,
)
from model_runtime.config import DreamConfig, load_config
from model_runtime.errors import InputError, ModelError
from model_runtime.model import DreamModel, shift_logits
from model_runtime.params import DECODERS, DoneEvent, GenerationStats, SamplingParams, StepEvent
from model_runtime.sampling import (
    SamplerSpec,
    commit_by_confidence,
    commit_origin,
    sample_tokens,
    transfer_counts,
    transfer_ratios,
)
from model_runtime.tokenizer import DreamTokenizer, load_tokenizer

# Canvas lengths: fine steps where canvases are common (a 64-token step costs at most ~25% extra
# compute at 256), coarser above. Padding to a bucket never changes a result, only the cost.
DEFAULT_LENGTH_BUCKETS = (64, 128, 192, 256, 320, 384, 448, 512, 640, 768, 896, 1024, 1280, 1536, 1792, 2048)
DEFAULT_BATCH_BUCKETS = (1, 2, 4, 8, 16)
# Dream's README: "the context length (input+output) of Dream currently is 2048"; max_position_embeddings
# (131072) is inherited from Qwen2.5 and untested, so we cap at 2048 unless told otherwise.
DEFAULT_MAX_CONTEXT = 2048

Hook = Callable[[jax.Array | None, jax.Array, jax.Array | None], jax.Array]
Progress = Callable[[str, float], None]


@dataclass(frozen=True)
class CanvasRow:
    """One row of a batch: its token ids (prompt and masks, no padding) and the region to report.

    For plain generation the region is the ``max_new_tokens`` masks appended after the prompt; for
    infill it is the masks between prefix and suffix. ``chat`` picks the stop tokens of the answer.
    """

    ids: tuple[int, ...]
    region: tuple[int, int]
    chat: bool = False


def default_dtype() -> str:
    return "float32" if jax.default_backend() == "cpu" else "bfloat16"


def _dtype(name: str | None) -> jnp.dtype:
    name = name or default_dtype()
    table = {
        "float32": jnp.float32,
        "fp32": jnp.float32,
        "bfloat16": jnp.bfloat16,
        "bf16": jnp.bfloat16,
        "float16": jnp.float16,
        "fp16": jnp.float16,
    }
    if name not in table:
        raise InputError(f"dtype: expected one of float32, bfloat16, float16; got {name!r}")
    return table[name]


def _pick(buckets: Sequence[int], n: int) -> int | None:
    return next((b for b in sorted(buckets) if b >= n), None)


class Runtime:
    """A loaded model: config, tokenizer, parameters on the device, and compiled step programs."""

    def __init__(
        self,
        cfg: DreamConfig,
        tokenizer: DreamTokenizer,
        graphdef: nnx.GraphDef,
        state: nnx.State,
        *,
        model_name: str,
        model_dir: Path,
        dtype: jnp.dtype,
        max_context: int | None = None,
        length_buckets: Sequence[int] = DEFAULT_LENGTH_BUCKETS,
        batch_buckets: Sequence[int] = DEFAULT_BATCH_BUCKETS,
        mesh: Mesh | None = None,
        default_decoder: str = "reference",
        quantize: quant.QuantSpec | None = None,
    ) -> None:
        self.config = cfg
        self.quantize = quantize
        # The decoder a request gets when it names none: the model's recorded choice (generation_config.json
        # ``diffu_decoder``, see recommended_decoder), else the reference decoder.
        self.default_decoder = default_decoder
        self.mesh = mesh
        self.tokenizer = tokenizer
        self.graphdef = graphdef
        self.state = state
        self.model_name = model_name
        self.model_dir = model_dir
        self.dtype = jnp.dtype(dtype).name
        self.max_context = min(max_context or DEFAULT_MAX_CONTEXT, cfg.max_position_embeddings)
        lengths = sorted({b for b in length_buckets if b <= self.max_context} | {self.max_context})
        self.length_buckets = tuple(lengths)
        dp = int(mesh.shape["dp"]) if mesh is not None else 1
        # With data parallelism every batch bucket is a multiple of dp, so each replica gets whole rows.
        self.batch_buckets = tuple(sorted({-(-b // dp) * dp for b in batch_buckets}))
        devices = list(mesh.devices.flat) if mesh is not None else jax.devices()[:1]
        self.device = f"{devices[0].platform}:{devices[0].device_kind} x{len(devices)}"
        # Canvas arrays [B, L]: rows over dp (replicated without a mesh: one device).
        self._rows = (
            None if mesh is None else NamedSharding(mesh, PartitionSpec("dp" if dp > 1 else None, None))
        )
        self._replicated = None if mesh is None else NamedSharding(mesh, PartitionSpec())
        self._programs: dict[tuple, jax.stages.Compiled] = {}
        static = ("graphdef", "spec", "mask_id", "logits_hook", "tokens_hook", "window")
        # The canvas comes out with the sharding it goes in with, so a step's output feeds the next step.
        rows_out = {} if self._rows is None else {"out_shardings": self._rows}
        self._jitted = {
            # One denoising step per call: for streaming, where every canvas goes to the host anyway.
            "step": jax.jit(_denoise_step, static_argnames=static, donate_argnames=("x",), **rows_out),
            # The whole loop in one program (lax.fori_loop): no dispatch or host sync between steps.
            "all": jax.jit(_denoise_all, static_argnames=static, donate_argnames=("x",), **rows_out),
            # The fast decoder's two fixed-shape programs.
            "refresh": jax.jit(
                fast.refresh, static_argnames=("graphdef", "spec", "mask_id"), donate_argnames=("x",)
            ),
            "block": jax.jit(
                fast.block_loop,
                static_argnames=("graphdef", "spec", "mask_id"),
                donate_argnames=("x",),
            ),
        }

    @property
    def mesh_info(self) -> dict[str, object]:
        """The device mesh (dp x tp, devices, processes), for status reports."""
        return sharding.describe(self.mesh)

    # -- building rows --------------------------------------------------------------------------
    @property
    def buckets(self) -> list[tuple[int, int]]:
        return [(b, n) for b in self.batch_buckets for n in self.length_buckets]

    def encode_chat(self, messages: Sequence[dict[str, str]]) -> list[int]:
        try:
            return self.tokenizer.encode_chat(messages)
        except ValueError as exc:
            raise InputError(str(exc)) from None

    def make_row(self, prompt_ids: Sequence[int], max_new_tokens: int, *, chat: bool) -> CanvasRow:
        ids = tuple(int(i) for i in prompt_ids) + (self.tokenizer.mask_id,) * max_new_tokens
        return CanvasRow(ids, (len(prompt_ids), len(ids)), chat)

    def make_infill_row(self, prefix: str, suffix: str, canvas_tokens: int) -> CanvasRow:
        """``prefix + <|mask|> * canvas_tokens + suffix``: the model fills the middle (spec 3.4)."""
        if canvas_tokens < 1:
            raise InputError(f"canvas_tokens: must be >= 1, got {canvas_tokens}")
        pre, suf = self.tokenizer.encode(prefix), self.tokenizer.encode(suffix)
        ids = tuple(pre) + (self.tokenizer.mask_id,) * canvas_tokens + tuple(suf)
        return CanvasRow(ids, (len(pre), len(pre) + canvas_tokens), chat=False)

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        *,
        chat: bool,
        stream: bool = True,
        **hooks: Hook | None,
    ) -> Iterator[StepEvent | DoneEvent]:
        """Left-padded batch generation: one StepEvent per step, then a DoneEvent."""
        rows = [self.make_row(p, params.max_new_tokens, chat=chat) for p in prompts]
        return self.run(rows, params, stream=stream, **hooks)

    def infill(
        self, prefix: str, suffix: str, canvas_tokens: int, params: SamplingParams
    ) -> Iterator[StepEvent | DoneEvent]:
        return self.run([self.make_infill_row(prefix, suffix, canvas_tokens)], params)

    # -- compiling ------------------------------------------------------------------------------
    def bucket_for(self, batch: int, length: int) -> tuple[int, int]:
        if length > self.max_context:
            raise InputError(
                f"the prompt and canvas need {length} tokens, more than the context of "
                f"{self.max_context} tokens; shorten the prompt or lower max_new_tokens"
            )
        b = _pick(self.batch_buckets, batch)
        if b is None:
            raise InputError(
                f"a batch of {batch} rows is larger than the largest batch bucket {self.batch_buckets[-1]}"
            )
        return b, _pick(self.length_buckets, length)

    def _abstract(self, shape: tuple[int, ...], dtype: jnp.dtype) -> jax.ShapeDtypeStruct:
        """An abstract argument; on a mesh, ``[B, L]`` canvases are split over dp, the rest replicated."""
        if self.mesh is None:
            return jax.ShapeDtypeStruct(shape, dtype)
        return jax.ShapeDtypeStruct(
            shape, dtype, sharding=self._rows if len(shape) == 2 else self._replicated
        )

    def _signature(self, shape: tuple[int, int]) -> tuple:
        """Abstract canvas, attention mask, f32/i32/bool scalars and a PRNG key for bucket ``shape``."""
        canvas = (self._abstract(shape, jnp.int32), self._abstract(shape, jnp.bool_))
        rng = jax.eval_shape(lambda: jax.random.key(0))
        if self.mesh is not None:
            rng = jax.ShapeDtypeStruct(rng.shape, rng.dtype, sharding=self._replicated)
        scalar = {t: self._abstract((), t) for t in (jnp.float32, jnp.int32, jnp.bool_)}
        return canvas, rng, scalar

    def _program(
        self,
        kind: str,
        shape: tuple[int, int],
        spec: SamplerSpec,
        logits_hook: Hook | None = None,
        tokens_hook: Hook | None = None,
        n_ratios: int = 0,
        window: int = 0,
    ) -> tuple[Callable, float, int, int]:
        """A compiled program for a bucket: ``kind`` "step" (one step) or "all" (the whole loop, with the
        schedule padded to ``n_ratios`` entries). Returns (program, compile seconds, fresh compiles,
        persistent-cache hits); the last three are zero when the program was already in memory."""
        key = (kind, shape, spec, logits_hook, tokens_hook, n_ratios, window)
        program = self._programs.get(key)
        if program is not None:
            return program, 0.0, 0, 0
        canvas, rng, scalar = self._signature(shape)
        f32, i32 = scalar[jnp.float32], scalar[jnp.int32]
        knobs = (f32, f32, f32)  # temperature, top_p, alg_temp
        # Positional, in the functions' order: the compiled program is called the same way.
        if kind == "step":
            args = (*canvas, f32, scalar[jnp.bool_], rng, i32, *knobs)  # ratio, is_last, key, step index
        else:
            args = (*canvas, self._abstract((n_ratios,), jnp.float32), i32, rng, *knobs)  # ratios, steps, key
        statics = dict(
            mask_id=self.config.mask_token_id, logits_hook=logits_hook, tokens_hook=tokens_hook, window=window
        )
        return self._compile(key, kind, args, spec, statics)

    def _compile(self, key: tuple, kind: str, args: tuple, spec: object, statics: dict) -> tuple:
        """Lower and compile ``self._jitted[kind]`` for abstract ``args``, timed and counted."""
        requests0, hits0 = compile_cache.counters()
        t0 = time.perf_counter()
        lowered = self._jitted[kind].lower(self.state, *args, graphdef=self.graphdef, spec=spec, **statics)
        compiled = lowered.compile()
        seconds = time.perf_counter() - t0
        requests1, hits1 = compile_cache.counters()
        program = compiled if self.mesh is None else _Placed(compiled)
        self._programs[key] = program
        hits = hits1 - hits0
        return program, seconds, (requests1 - requests0) - hits, hits

    def _fast_programs(self, shape: tuple[int, int], fspec: fast.FastSpec) -> tuple[list, float, int, int]:
        """The fast decoder's (refresh, block) programs for a bucket, plus compile seconds/counts."""
        b, n = shape
        canvas, rng, scalar = self._signature(shape)
        f32, i32 = scalar[jnp.float32], scalar[jnp.int32]
        cfg = self.config
        statics = dict(mask_id=cfg.mask_token_id)
        out, seconds, compiled, hits = [], 0.0, 0, 0
        for kind in ("refresh", "block"):
            key = (kind, shape, fspec)
            if key in self._programs:
                out.append(self._programs[key])
                continue
            if kind == "refresh":
                args = (*canvas, i32, rng, f32, f32)
            else:
                # The block program takes the caches exactly as the refresh program lays them out.
                kv_shape = (b, cfg.num_key_value_heads, n, cfg.head_dim)
                layouts = _output_shardings(out[0])
                caches = [
                    tuple(
                        jax.ShapeDtypeStruct(kv_shape, jnp.dtype(self.dtype), sharding=lay) for lay in layer
                    )
                    for layer in (layouts[1] if layouts else [(None, None)] * cfg.num_hidden_layers)
                ]
                args = (*canvas, caches, i32, rng, f32, f32, f32, f32)
            program, s, c, h = self._compile(key, kind, args, fspec, statics)
            out.append(program)
            seconds, compiled, hits = seconds + s, compiled + c, hits + h
        return out, seconds, compiled, hits

    def warmup(
        self,
        params: SamplingParams,
        progress: Callable[[int, int, str], None] | None = None,
        shapes: Sequence[tuple[int, int]] | None = None,
        *,
        stream: bool = True,
    ) -> float:
        """Compile every bucket (or ``shapes``) for ``params``'s sampler switches; returns the seconds.

        ``stream`` picks the per-step program (what the daemon's streaming routes use) or the fused one.
        """
        spec = SamplerSpec.from_params(params)
        shapes = list(shapes or self.buckets)
        total = 0.0
        for i, shape in enumerate(shapes):
            if progress:
                progress(i, len(shapes), f"compiling batch {shape[0]} x {shape[1]} tokens")
            # The programs plain generation of params.max_new_tokens tokens uses (see _window).
            window = self.window_for(params.max_new_tokens, shape[1])
            if stream:
                total += self._program("step", tuple(shape), spec, window=window)[1]
            else:
                n_ratios = _ratio_bucket(params.steps)
                total += self._program("all", tuple(shape), spec, n_ratios=n_ratios, window=window)[1]
        if progress:
            progress(len(shapes), len(shapes), "compiled")
        return total

    # -- running --------------------------------------------------------------------------------
    def step_canvas(
        self, x: np.ndarray, attn: np.ndarray | None, step: int, params: SamplingParams
    ) -> np.ndarray:
        """Apply denoising step ``step`` of ``params.steps`` to an arbitrary ``[B, L]`` canvas.

        The same compiled program ``run`` uses, at the canvas's exact shape; for parity checks that feed
        a reference's canvas in and compare what each side commits.
        """
        x = np.asarray(x, np.int32)
        attn = np.ones(x.shape, bool) if attn is None else np.asarray(attn, bool)
        program = self._program("step", x.shape, SamplerSpec.from_params(params))[0]
        ratio = transfer_ratios(params.steps, params.eps)[step]
        out = program(
            self.state,
            jnp.asarray(x),
            jnp.asarray(attn),
            jnp.float32(ratio),
            jnp.bool_(step == params.steps - 1),
            jax.random.fold_in(jax.random.key(params.seed), step),
            jnp.int32(step),
            *_knobs(params),
        )
        return distributed.host(out)

    def run(
        self,
        rows: Sequence[CanvasRow],
        params: SamplingParams,
        *,
        stream: bool = True,
        logits_hook: Hook | None = None,
        tokens_hook: Hook | None = None,
    ) -> Iterator[StepEvent | DoneEvent]:
        """Denoise a batch of rows. Validates before returning the iterator, so bad input raises here.

        With ``stream`` (default) every step yields a StepEvent; without it the whole loop runs as one
        compiled program and only the DoneEvent comes back (same result, no per-step host sync).
        """
        if not rows:
            raise InputError("no rows to generate")
        longest = max(len(r.ids) for r in rows)
        shape = self.bucket_for(len(rows), longest)
        for r in rows:
            if r.region[1] <= r.region[0]:
                raise InputError("a row has an empty generation region")
        if params.decoder == "fast":
            layouts = {(len(r.ids) - r.region[0], len(r.ids) - r.region[1]) for r in rows}
            if len(layouts) > 1:
                raise InputError(
                    "the fast decoder needs every row's region in the same columns (same "
                    "length and the same number of tokens after it); run them separately"
                )
            if logits_hook is not None or tokens_hook is not None:
                raise InputError("hooks are supported by the reference decoder only")
            return self._run_fast(list(rows), params, shape, stream)
        return self._run(list(rows), params, shape, stream, logits_hook, tokens_hook)

    def _window(self, rows: list[CanvasRow], n: int) -> int:
        """For plain generation (masks only in an appended region), the length bucket holding the region.

        Infill rows (masks between prefix and suffix) or masks inside a prompt use the whole canvas
        (0): their extent varies request by request, and every distinct window is another program.
        """
        mask_id = self.config.mask_token_id
        if any(r.region[1] != len(r.ids) or mask_id in r.ids[: r.region[0]] for r in rows):
            return 0
        return self.window_for(max(r.region[1] - r.region[0] for r in rows), n)

    def window_for(self, new_tokens: int, n: int) -> int:
        """The logits window plain generation of ``new_tokens`` uses on an ``n``-token canvas (0: all)."""
        window = _pick(self.length_buckets, new_tokens)
        return 0 if window is None or window >= n else window

    def _canvas(
        self, rows: list[CanvasRow], shape: tuple[int, int]
    ) -> tuple[np.ndarray, np.ndarray, list[int]]:
        """Right-align every row in the bucket (left padding): canvas ids, padding mask, row offsets.

        Spare batch rows are all padding, with no masks, so they commit nothing.
        """
        b, n = shape
        x = np.full((b, n), self.config.pad_token_id, np.int32)
        attn = np.zeros((b, n), bool)
        offsets = []
        for i, r in enumerate(rows):
            off = n - len(r.ids)
            x[i, off:] = r.ids
            attn[i, off:] = True
            offsets.append(off)
        return x, attn, offsets

    def _step_event(self, rows, offsets, prev, cur, step: int, steps: int, seconds: float) -> StepEvent:
        mask_id = self.config.mask_token_id
        canvas, unmasked, left = [], [], []
        for j, r in enumerate(rows):
            lo, hi = offsets[j] + r.region[0], offsets[j] + r.region[1]
            region = cur[j, lo:hi]
            canvas.append(region.tolist())
            unmasked.append(np.flatnonzero((prev[j, lo:hi] == mask_id) & (region != mask_id)).tolist())
            left.append(int(np.sum(cur[j, offsets[j] :] == mask_id)))
        return StepEvent(
            step=step,
            steps=steps,
            canvas=canvas,
            unmasked=unmasked,
            seconds=seconds,
            masks_left=left,
            content=[cur[j, offsets[j] :].tolist() for j in range(len(rows))],
        )

    def _done(
        self,
        rows,
        offsets,
        final,
        shape,
        *,
        steps: int,
        elapsed: float,
        compile_s: float,
        compiled: int,
        hits: int,
        decoder: str = "reference",
    ) -> DoneEvent:
        pad_id = self.config.pad_token_id
        longest = max(len(r.ids) for r in rows)
        sequences, generated, texts = [], [], []
        for j, r in enumerate(rows):
            content = final[j, offsets[j] :].tolist()
            sequences.append([pad_id] * (longest - len(content)) + content)
            region = content[r.region[0] : r.region[1]]
            generated.append(region)
            texts.append(self.tokenizer.postprocess(region, chat=r.chat))
        new_tokens = sum(r.region[1] - r.region[0] for r in rows)
        stats = GenerationStats(
            steps=steps,
            new_tokens=new_tokens,
            batch_size=len(rows),
            compile_seconds=compile_s,
            generate_seconds=elapsed,
            tokens_per_second=new_tokens / elapsed if elapsed > 0 else 0.0,
            compiled_programs=compiled,
            cache_hits=hits,
            bucket=shape,
            decoder=decoder,
        )
        return DoneEvent(
            texts=texts,
            sequences=sequences,
            generated=generated,
            prompt_lengths=[r.region[0] for r in rows],
            stats=stats,
        )

    def _run(
        self,
        rows: list[CanvasRow],
        params: SamplingParams,
        shape: tuple[int, int],
        stream: bool,
        logits_hook: Hook | None,
        tokens_hook: Hook | None,
    ) -> Iterator[StepEvent | DoneEvent]:
        spec = SamplerSpec.from_params(params)
        n_ratios = 0 if stream else _ratio_bucket(params.steps)
        window = 0 if logits_hook or tokens_hook else self._window(rows, shape[1])
        program, compile_s, compiled, hits = self._program(
            "step" if stream else "all", shape, spec, logits_hook, tokens_hook, n_ratios, window
        )
        x_host, attn_host, offsets = self._canvas(rows, shape)
        x, attn = jnp.asarray(x_host), jnp.asarray(attn_host)
        if tokens_hook is not None:
            x = tokens_hook(None, x, None)  # the reference calls the tokens hook once before the loop
        ratios = transfer_ratios(params.steps, params.eps)
        base_key = jax.random.key(params.seed)
        knobs = _knobs(params)
        t_start = time.perf_counter()
        if not stream:
            padded = np.ones(n_ratios, np.float32)
            padded[: params.steps] = ratios
            prev = distributed.host(
                program(self.state, x, attn, jnp.asarray(padded), jnp.int32(params.steps), base_key, *knobs)
            )
        else:
            prev = distributed.host(x)
            for i in range(params.steps):
                t0 = time.perf_counter()
                x = program(
                    self.state,
                    x,
                    attn,
                    jnp.float32(ratios[i]),
                    jnp.bool_(i == params.steps - 1),
                    jax.random.fold_in(base_key, i),
                    jnp.int32(i),
                    *knobs,
                )
                cur = distributed.host(x)  # the one host transfer per step that streaming needs
                yield self._step_event(rows, offsets, prev, cur, i, params.steps, time.perf_counter() - t0)
                prev = cur
        yield self._done(
            rows,
            offsets,
            prev,
            shape,
            steps=params.steps,
            elapsed=time.perf_counter() - t_start,
            compile_s=compile_s,
            compiled=compiled,
            hits=hits,
        )

    def _run_fast(
        self, rows: list[CanvasRow], params: SamplingParams, shape: tuple[int, int], stream: bool
    ) -> Iterator[StepEvent | DoneEvent]:
        """The fast decoder (model_runtime.fast): one StepEvent per block, early stop at end-of-text."""
        n = shape[1]
        x_host, attn_host, offsets = self._canvas(rows, shape)
        lo = offsets[0] + rows[0].region[0]  # every row's region sits in the same columns (checked in run)
        hi = offsets[0] + rows[0].region[1]
        size = max(1, min(params.block_length, hi - lo, n - 1))
        fspec = fast.FastSpec(
            sampler=dataclasses.replace(
                SamplerSpec.from_params(params), alg="maskgit_plus", use_alg_temp=False
            ),
            block_length=size,
            use_factor=params.factor is not None,
        )
        (refresh, block), compile_s, compiled, hits = self._fast_programs(shape, fspec)
        x, attn = jnp.asarray(x_host), jnp.asarray(attn_host)
        temperature, top_p, _ = _knobs(params)
        threshold, factor = jnp.float32(params.threshold), jnp.float32(params.factor or 1.0)
        base_key = jax.random.key(params.seed)
        starts = list(range(lo, hi, size))
        stops = [set(self.tokenizer.stop_ids(chat=r.chat)) for r in rows]
        mask_id = self.config.mask_token_id
        forwards = 0
        prev = x_host
        t_start = time.perf_counter()
        for b, start in enumerate(starts):
            t0 = time.perf_counter()
            key = jax.random.fold_in(base_key, b)
            x, caches = refresh(
                self.state, x, attn, jnp.int32(start), jax.random.fold_in(key, 0), temperature, top_p
            )
            window = min(start, hi - size)  # the last block may be short: slide the window back, not past hi
            x, iters = block(
                self.state,
                x,
                attn,
                caches,
                jnp.int32(window),
                jax.random.fold_in(key, 1),
                temperature,
                top_p,
                threshold,
                factor,
            )
            cur = np.array(distributed.host(x))  # one host sync per block: the event, the end-of-text check
            forwards += 1 + int(distributed.host(iters))
            done = all(any(t in stop for t in cur[j, lo : start + size]) for j, stop in enumerate(stops))
            if done and b < len(starts) - 1:
                # Every row has ended its text: the rest of the canvas would be padding. Fill it and stop.
                rest = cur[:, start + size : hi]
                rest[rest == mask_id] = self.config.pad_token_id
            if stream:
                yield self._step_event(rows, offsets, prev, cur, b, len(starts), time.perf_counter() - t0)
            prev = cur
            if done:
                break
        yield self._done(
            rows,
            offsets,
            prev,
            shape,
            steps=forwards,
            elapsed=time.perf_counter() - t_start,
            compile_s=compile_s,
            compiled=compiled,
            hits=hits,
            decoder="fast",
        )


class _Placed:
    """A compiled program on a mesh: arguments are moved to the shardings it was compiled for (a no-op
    when they already are), so host arrays and single-device scalars can be passed as they are."""

    def __init__(self, compiled: jax.stages.Compiled) -> None:
        self.compiled = compiled
        self.shardings = compiled.input_shardings[0][1:]  # [0] positional args; state (first) is placed

    def __call__(self, state: nnx.State, *args: object) -> object:
        moved = [jax.tree.map(_put, a, s) for a, s in zip(args, self.shardings, strict=True)]
        return self.compiled(state, *moved)


def _put(value: object, target: NamedSharding) -> jax.Array:
    """``value`` with sharding ``target``. With several processes every process holds the same host value
    and contributes its own shards; arrays that already span the processes (program outputs) stay."""
    if target is None or isinstance(value, jax.Array) and not value.is_fully_addressable:
        return value  # an input the compiled program does not use (None), or one already in place
    if not distributed.multi():
        return jax.device_put(value, target)
    if isinstance(value, jax.Array) and jax.dtypes.issubdtype(value.dtype, jax.dtypes.prng_key):
        data = np.asarray(jax.random.key_data(value))
        whole = NamedSharding(target.mesh, PartitionSpec())
        placed = jax.make_array_from_callback(data.shape, whole, lambda index: data[index])
        return jax.random.wrap_key_data(placed, impl=jax.random.key_impl(value))
    host = np.asarray(value)
    return jax.make_array_from_callback(host.shape, target, lambda index: host[index])


def _output_shardings(program: object) -> object:
    """How a program on a mesh lays out its results (None off a mesh: one device, nothing to match)."""
    return program.compiled.output_shardings if isinstance(program, _Placed) else None


def _knobs(params: SamplingParams) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The traced sampling values: changing them never recompiles."""
    return (
        jnp.float32(params.temperature),
        jnp.float32(params.effective_top_p),
        jnp.float32(params.alg_temp or 1.0),
    )


def _ratio_bucket(steps: int) -> int:
    """Length of the schedule array the fused program takes: a power of two, so steps share programs."""
    return max(64, 1 << (steps - 1).bit_length())


def _denoise_step(
    state: nnx.State,
    x: jax.Array,
    attn: jax.Array,
    ratio: jax.Array,
    is_last: jax.Array,
    key: jax.Array,
    step_index: jax.Array,
    temperature: jax.Array,
    top_p: jax.Array,
    alg_temp: jax.Array,
    *,
    graphdef: nnx.GraphDef,
    spec: SamplerSpec,
    mask_id: int,
    logits_hook: Hook | None,
    tokens_hook: Hook | None,
    window: int = 0,
) -> jax.Array:
    """One step of ``_sample`` (dream-reference.md 2.4) on a ``[B, L]`` canvas; returns the new canvas.

    ``window`` (static; 0 = the whole canvas) limits the sampler to the last ``window`` positions when
    the caller knows every mask lies there (plain generation: the appended region). The reference computes
    logits for the whole canvas and then only uses masked positions; we compute them for masked positions
    only (``_sample_masked``). Neither changes a result, only the cost: ``lm_head`` and top-k over the
    vocabulary are a large part of a step.
    """
    model = nnx.merge(graphdef, state)
    n = x.shape[1]
    w = window if window and window < n else n
    canvas = x
    head, x = (x[:, : n - w], x[:, n - w :]) if w < n else (None, x)
    mask_index = x == mask_id  # masks inside the prompt are denoised too (infill)
    k_sample, k_commit = jax.random.split(key)
    if logits_hook is None and tokens_hook is None:
        trunk = model.trunk(canvas, attn)
        confidence, x0 = _sample_masked(model, trunk, n - w, mask_index, k_sample, spec, temperature, top_p)
        logits = None
    else:
        hidden, _ = model.hidden(canvas, attn)
        # The shift: position p is predicted by the output at p - 1 (position 0 by itself, never a mask).
        hidden = hidden[:, n - w - 1 : n - 1] if w < n else shift_logits(hidden)
        logits = model.head(hidden)  # [B, W, V]: the hooks see every position's logits
        if logits_hook is not None:
            logits = logits_hook(step_index, x, logits)
        confidence, x0 = sample_tokens(logits, k_sample, spec, temperature, top_p)
    if spec.alg == "origin":
        new = commit_origin(x, mask_index, x0, ratio, k_commit)
    else:
        counts = transfer_counts(jnp.sum(mask_index, axis=-1), ratio, is_last)
        new = commit_by_confidence(x, mask_index, x0, confidence, counts, k_commit, spec, alg_temp)
    if tokens_hook is not None:
        new = tokens_hook(step_index, new, logits)
    return new if head is None else jnp.concatenate([head, new], axis=1)


# Row counts the sampler may gather: the smallest that holds a step's masks is used (see _sample_masked).
_ROW_BUCKETS = (8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536)


def row_sizes(window: int) -> list[int]:
    """The row counts ``_sample_masked`` may gather over a ``window``-position region, smallest first."""
    return [m for m in _ROW_BUCKETS if m < window] + [window]


def gathered_rows(masks: int, window: int) -> int:
    """Rows a reference step gathers when its fullest row holds ``masks`` masks (for FLOP counts)."""
    return next(m for m in row_sizes(window) if m >= masks)


def _sample_masked(
    model: DreamModel,
    trunk: tuple[jax.Array, jax.Array, jax.Array],
    offset: int,
    mask_index: jax.Array,
    key: jax.Array,
    spec: SamplerSpec,
    temperature: jax.Array,
    top_p: jax.Array,
) -> tuple[jax.Array, jax.Array]:
    """``sample_tokens`` of the still-masked positions only: (confidence, proposal) over ``[B, W]``.

    ``trunk`` is ``model.trunk`` of the canvas, whose last ``W`` positions (from ``offset``) are sampled.
    A step's masks are gathered (in position order) into the smallest row bucket that holds every row's,
    and the last layer's queries and MLP, ``lm_head`` and the sampler run on those rows only; early steps
    use all ``W`` rows, late ones a few. Other positions get confidence -inf, which the commit ignores as
    the reference's ``logits[mask_index]`` gather does.
    """
    b, w = mask_index.shape
    sizes = row_sizes(w)
    # Masked positions first, in position order (stable), so rows keep the reference's tie order.
    order = jnp.argsort(~mask_index, axis=-1, stable=True)
    batch = jnp.arange(b)[:, None]

    def branch(m: int) -> Callable[..., tuple[jax.Array, jax.Array]]:
        def run(order: jax.Array, *trunk: jax.Array) -> tuple[jax.Array, jax.Array]:
            idx = order[:, :m]
            # The shift: position p is predicted by the output at p - 1 (position 0 by itself).
            hidden = model.finish(*trunk, jnp.maximum(idx + offset - 1, 0))  # [B, m, D]
            confidence, x0 = sample_tokens(model.head(hidden), key, spec, temperature, top_p)
            full_conf = jnp.full((b, w), -jnp.inf, confidence.dtype).at[batch, idx].set(confidence)
            return full_conf, jnp.zeros((b, w), jnp.int32).at[batch, idx].set(x0)

        return run

    most = jnp.max(jnp.sum(mask_index, axis=-1))
    pick = jnp.searchsorted(jnp.asarray(sizes, jnp.int32), most.astype(jnp.int32))  # first size >= most
    return jax.lax.switch(pick, [branch(m) for m in sizes], order, *trunk)


def _denoise_all(
    state: nnx.State,
    x: jax.Array,
    attn: jax.Array,
    ratios: jax.Array,
    steps: jax.Array,
    key: jax.Array,
    temperature: jax.Array,
    top_p: jax.Array,
    alg_temp: jax.Array,
    *,
    graphdef: nnx.GraphDef,
    spec: SamplerSpec,
    mask_id: int,
    logits_hook: Hook | None,
    tokens_hook: Hook | None,
    window: int = 0,
) -> jax.Array:
    """All ``steps`` steps in one program; per-step keys as the streaming path, so results agree."""

    def body(i: jax.Array, x: jax.Array) -> jax.Array:
        return _denoise_step(
            state,
            x,
            attn,
            ratios[i],
            i == steps - 1,
            jax.random.fold_in(key, i),
            i,
            temperature,
            top_p,
            alg_temp,
            graphdef=graphdef,
            spec=spec,
            mask_id=mask_id,
            logits_hook=logits_hook,
            tokens_hook=tokens_hook,
            window=window,
        )

    return jax.lax.fori_loop(0, steps, body, x)


def recommended_decoder(model_dir: Path) -> str:
    """The decoder a model directory recommends: ``diffu_decoder`` in its ``generation_config.json``.

    Published checkpoints carry no such key and get the reference decoder. A model trained by ``diffu
    train`` gets it only where ``scripts/decoder_quality.py --record`` measured the fast decoder writing
    better code on the model's held-out files (the bundled demo model does).
    """
    path = Path(model_dir) / "generation_config.json"
    if not path.is_file():
        return "reference"
    try:
        value = json.loads(path.read_text(encoding="utf-8")).get("diffu_decoder", "reference")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as exc:
        raise ModelError(f"generation_config.json: cannot read it as a JSON object ({exc})") from None
    if value not in DECODERS:
        raise ModelError(
            f"generation_config.json: diffu_decoder must be one of {', '.join(DECODERS)}, got {value!r}"
        )
    return value


def load(
    model: str | os.PathLike | None = None,
    *,
    dtype: str | None = None,
    max_context: int | None = None,
    length_buckets: Sequence[int] = DEFAULT_LENGTH_BUCKETS,
    batch_buckets: Sequence[int] = DEFAULT_BATCH_BUCKETS,
    progress: Progress | None = None,
    cache_dir: str | os.PathLike | None = None,
    tp: int = 1,
    dp: int | None = None,
    quantize: str | quant.QuantSpec | None = None,
) -> Runtime:
    """Load a DiffuCoder/Dream checkpoint (directory or hub id) onto the default device, or with ``tp``
    (tensor parallel) / ``dp`` (data parallel) onto a device mesh.

    Tensors are read from memory-mapped safetensors one at a time, converted to ``dtype`` (float32 on
    CPU, bfloat16 on accelerators by default) and placed; on a mesh each device receives only its shard
    of a sharded weight. ``quantize`` (``"int8"``, ``"int4"`` or a ``quant.QuantSpec``) stores the
    projection matrices and ``lm_head`` as integers with scales, each quantized on the host as it is
    read (see ``quant.py``). No code from the model directory runs.
    """
    qspec = quantize if isinstance(quantize, quant.QuantSpec) else quant.parse(quantize)
    compile_cache.enable(cache_dir)
    mesh = sharding.MeshSpec(tp=tp, dp=dp).build() if tp > 1 or (dp or 1) > 1 else None
    if (
        qspec is not None
        and qspec.mode == "int4"
        and mesh is not None
        and mesh.devices.flat[0].platform == "cpu"
    ):
        # XLA's CPU client keeps sharded int4 arrays unpacked while compiled programs ask for the packed
        # layout, so every call would fail its layout check (jax 0.8, virtual CPU devices).
        raise InputError(
            "quantize int4: XLA's CPU backend cannot run int4 weights sharded over several devices; "
            "use --quantize int8, or one device (tp=1, dp=1)"
        )
    if model is None:
        # No model configured: the small demo model trained by `diffu train` that ships in the package.
        from model_runtime.bundled import bundled_model_dir

        model = bundled_model_dir()
        if not (model / "config.json").is_file():
            raise ModelError(
                "no model given and the bundled demo model is missing from this installation: "
                "pass --model PATH_OR_HUB_ID (a DiffuCoder/Dream checkpoint directory)"
            )
    report = progress or (lambda stage, frac: None)
    model_dir = resolve_model_dir(model, progress=lambda msg: report(msg, 0.0))
    refuse_pickle_only(model_dir)  # the clearest message for such a directory comes first
    report("reading config", 0.0)
    cfg = load_config(model_dir)
    tokenizer = load_tokenizer(
        model_dir, mask_id=cfg.mask_token_id, pad_id=cfg.pad_token_id, eos_id=cfg.eos_token_id
    )
    if tokenizer.vocab_size > cfg.vocab_size:
        raise ModelError(
            f"the tokenizer has {tokenizer.vocab_size} tokens but config.json vocab_size is {cfg.vocab_size}"
        )
    tensors = list_tensors(model_dir)
    targets = check_names(cfg, tensors)
    jdtype = _dtype(dtype)
    if qspec is not None:
        for spec in targets.values():
            if qspec.applies(spec):
                qspec.scale_shape(spec)  # a dimension the int4 group does not divide: refused up front
    # Abstract shapes first (nothing allocated), then each tensor goes straight into its shards.
    abstract = nnx.eval_shape(lambda: DreamModel(cfg, dtype=jdtype, rngs=nnx.Rngs(0), quant=qspec))
    graphdef, state = nnx.split(abstract)
    pure = nnx.to_pure_dict(state)
    total = sum(int(np.prod(t.shape)) for t in tensors.values())
    done = 0
    for name, array in read_tensors(tensors):
        target = targets.get(name)
        if target is None:
            continue  # a recomputed buffer (rotary inv_freq)
        node = pure
        for part in target.path[:-1]:
            node = node[part]
        leaf = str(target.path[-1])
        # Convert this tensor alone: layout change and dtype cast (or quantization) on the host, then
        # onto the device(s).
        if qspec is not None and qspec.applies(target):
            values, scale = quant.quantize(target.convert(array), target, qspec, np.dtype(jdtype))
            placed = {leaf: values, leaf + "_scale": scale}
        else:
            placed = {leaf: np.asarray(target.convert(array), dtype=jdtype)}
        for key, host in placed.items():
            if mesh is None:
                node[key] = jax.device_put(host)
            else:
                node[key] = sharding.place(host, sharding.param_sharding(target, host.shape, mesh))
        del placed
        done += int(np.prod(array.shape))
        report("loading weights", done / total)
    nnx.replace_by_pure_dict(state, pure)
    report("ready", 1.0)
    return Runtime(
        cfg,
        tokenizer,
        graphdef,
        state,
        model_name=str(model),
        model_dir=model_dir,
        dtype=jdtype,
        max_context=max_context,
        length_buckets=length_buckets,
        batch_buckets=batch_buckets,
        mesh=mesh,
        default_decoder=recommended_decoder(model_dir),
        quantize=qspec,
    )
