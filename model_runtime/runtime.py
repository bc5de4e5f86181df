"""The loaded model: ``Runtime.run(rows, params)`` denoises a batch of canvas rows into events.

Shapes are bucketed: a batch is left-padded to a (batch, length) bucket (``batch.py``), which leaves
every real row's result unchanged, so another prompt length inside a bucket reuses the compiled program
(``programs.py``). Each denoising step is one jitted pure function (``kernels.py``); the fast decoder's
programs are in ``fast.py``. ``loader.load`` builds a Runtime from a checkpoint.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from model_runtime import fast, processes, quant, sharding
from model_runtime.batch import PlacedBatch
from model_runtime.cached_runs import CachedRuns
from model_runtime.config import DreamConfig
from model_runtime.errors import InputError
from model_runtime.interface import (
    BatchEvents,
    CanvasRow,
    CompileReport,
    RuntimeInfo,
    RuntimeProtocol,
)
from model_runtime.kernels import Hook, Knobs, LoopInputs, StepInputs, ratio_bucket, row_keys, step_keys
from model_runtime.params import DEFAULT_MAX_PROGRAMS, SamplingParams
from model_runtime.programs import ProgramCache, ReferenceProgram
from model_runtime.rows import CanvasBuilder
from model_runtime.sampling import SamplerSpec, transfer_ratios
from model_runtime.sliding import spec_of as sliding_spec
from model_runtime.tokenizer import DreamTokenizer

# Canvas lengths: fine steps where canvases are common (a 64-token step costs at most ~25% extra
# compute at 256), coarser above. Padding to a bucket never changes a result, only the cost.
DEFAULT_LENGTH_BUCKETS = (64, 128, 192, 256, 320, 384, 448, 512, 640, 768, 896, 1024, 1280, 1536, 1792, 2048)
DEFAULT_BATCH_BUCKETS = (1, 2, 4, 8, 16)
# Dream's README: "the context length (input+output) of Dream currently is 2048"; max_position_embeddings
# (131072) is inherited from Qwen2.5 and untested, so we cap at 2048 unless told otherwise.
DEFAULT_MAX_CONTEXT = 2048


def _pick(buckets: Sequence[int], n: int) -> int | None:
    return next((b for b in sorted(buckets) if b >= n), None)


class Runtime(CachedRuns):
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
        chat_defaults: dict[str, Any] | None = None,
        one_line_defaults: dict[str, Any] | None = None,
        max_programs: int = DEFAULT_MAX_PROGRAMS,
    ) -> None:
        self.config = cfg
        self.quantize = quantize
        self.mesh = mesh
        self.tokenizer: DreamTokenizer = tokenizer
        self.graphdef = graphdef
        self.state = state
        self.model_dir = model_dir
        dtype_name = jnp.dtype(dtype).name
        context = min(max_context or DEFAULT_MAX_CONTEXT, cfg.max_position_embeddings)
        self.length_buckets = tuple(sorted({b for b in length_buckets if b <= context} | {context}))
        dp = int(mesh.shape["dp"]) if mesh is not None else 1
        # With data parallelism every batch bucket is a multiple of dp, so each replica gets whole rows.
        self.batch_buckets = tuple(sorted({-(-b // dp) * dp for b in batch_buckets}))
        devices = list(mesh.devices.flat) if mesh is not None else jax.devices()[:1]
        self.info = RuntimeInfo(
            model_name=model_name,
            device=f"{devices[0].platform}:{devices[0].device_kind} x{len(devices)}",
            dtype=dtype_name,
            max_context=context,
            vocab_size=cfg.vocab_size,
            buckets=tuple((b, n) for b in self.batch_buckets for n in self.length_buckets),
            # The decoder a request gets when it names none: the model's recorded choice
            # (generation_config.json ``diffu_decoder``, see generation_config.py), else the reference one.
            default_decoder=default_decoder,
            # The sampling knobs a chat with this model starts from (generation_config.chat_defaults).
            chat_defaults=dict(chat_defaults or {}),
            # What a one-line request that names no decoder gets (generation_config.one_line_defaults).
            one_line_defaults=dict(one_line_defaults or {}),
            # DiffuCoder's tokenizer reads "<|mask|>" in a raw prompt as the mask token: holes can be filled.
            supports_holes=True,
            quantize_mode=quantize.mode if quantize is not None else None,
            mesh=sharding.describe(mesh),
            # JAX lowers and XLA compiles on any thread, beside a program running on another (the program
            # cache builds each program once however many threads ask). Measured on CPU, where a compile
            # is host work; an accelerator's compile also runs kernels on it (GPU autotuning), so there it
            # stays on the device thread until measured there.
            concurrent_compile=devices[0].platform == "cpu",
        )
        self.rows = CanvasBuilder(tokenizer, context)
        self._programs = ProgramCache(cfg, graphdef, state, dtype_name, mesh, max_programs)
        # Forwards of the model run since start, every decoder's (a queued forward that ran after its
        # consumer stopped reading included): the daemon's counters report it.
        self.forwards = 0
        self._line_tables = {}

    def program_cache(self) -> dict[str, int | None]:
        """The compiled-program cache's bound and contents, for status reports."""
        return self._programs.info()

    # -- library use: prompts in, events out ------------------------------------------------------
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        *,
        chat: bool,
        stream: bool = True,
        logits_hook: Hook | None = None,
        tokens_hook: Hook | None = None,
    ) -> BatchEvents:
        """Left-padded batch generation: one BatchStep per step, then a BatchDone."""
        rows = [self.rows.make_row(p, params.max_new_tokens, chat=chat) for p in prompts]
        return self.run(rows, params, stream=stream, logits_hook=logits_hook, tokens_hook=tokens_hook)

    def infill(self, prefix: str, suffix: str, canvas_tokens: int, params: SamplingParams) -> BatchEvents:
        return self.run([self.rows.make_infill_row(prefix, suffix, canvas_tokens)], params)

    # -- compiling ------------------------------------------------------------------------------
    def bucket_for(self, batch: int, length: int) -> tuple[int, int]:
        context = self.info.max_context
        if length > context:
            raise InputError(
                f"the prompt and canvas need {length} tokens, more than the context of "
                f"{context} tokens; shorten the prompt or lower max_new_tokens",
                details={"row_tokens": length, "context_length": context},
            )
        b = _pick(self.batch_buckets, batch)
        if b is None:
            raise InputError(
                f"a batch of {batch} rows is larger than the largest batch bucket {self.batch_buckets[-1]}"
            )
        n = _pick(self.length_buckets, length)
        assert n is not None  # the largest length bucket is max_context
        return b, n

    def compiled(self, rows: Sequence[CanvasRow], params: SamplingParams, *, stream: bool = True) -> bool:
        """Whether ``run(rows, params, stream=stream)`` would start without compiling."""
        return all(key in self._programs for key in self._program_keys(rows, params, stream))

    def compile(
        self, rows: Sequence[CanvasRow], params: SamplingParams, *, stream: bool = True
    ) -> CompileReport:
        """Compile (or load from the persistent cache) what ``run(rows, params, stream=stream)`` uses.

        Only the rows' shape counts (their bucket, where their region lies), not their tokens: the daemon
        warms programs up with made-up rows of the shapes its clients send.
        """
        shape = self._checked_shape(rows, params)
        if params.decoder == "fast":
            _, _, _, fspec = fast.layout(rows, params, shape)
            _, seconds, compiled, hits = self._programs.fast(shape, fspec)
            return CompileReport(seconds, compiled, hits)
        if params.decoder == "sliding":
            _, seconds, compiled, hits = self._programs.sliding(shape, sliding_spec(params))
            return CompileReport(seconds, compiled, hits)
        built = self._programs.reference(*self._reference_args(rows, params, shape, stream))
        return CompileReport(built.seconds, built.compiled, built.hits)

    def _program_keys(self, rows: Sequence[CanvasRow], params: SamplingParams, stream: bool) -> list[tuple]:
        shape = self._checked_shape(rows, params)
        if params.decoder == "fast":
            return self._programs.fast_keys(shape, fast.layout(rows, params, shape)[3])
        if params.decoder == "sliding":
            return self._programs.sliding_keys(shape, sliding_spec(params))
        return [self._programs.reference_key(*self._reference_args(rows, params, shape, stream))]

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
        shape = (int(x.shape[0]), int(x.shape[1]))
        program = self._programs.reference("step", shape, SamplerSpec.from_params(params)).program
        inputs = StepInputs(
            attn=jnp.asarray(attn),
            ratio=jnp.float32(transfer_ratios(params.steps, params.eps)[step]),
            is_last=jnp.bool_(step == params.steps - 1),
            key=step_keys(row_keys([params.seed] * shape[0], shape[0]), step),
            index=jnp.int32(step),
            knobs=Knobs.of(params),
        )
        return processes.host(program(self.state, jnp.asarray(x), inputs))

    def run(
        self,
        rows: Sequence[CanvasRow],
        params: SamplingParams,
        *,
        stream: bool = True,
        logits_hook: Hook | None = None,
        tokens_hook: Hook | None = None,
    ) -> BatchEvents:
        """Denoise a batch of rows. Validates before returning the iterator, so bad input raises here.

        With ``stream`` (default) every step (one forward, whatever the decoder) yields a BatchStep, so a
        consumer that stops reading (a cancelled job) stops the device work within two forwards; without
        it the whole loop runs as one compiled program (the fast decoder: one per block) and only the
        BatchDone comes back (same result, no per-step host sync).
        """
        shape = self._checked_shape(rows, params)
        if params.decoder != "reference" and (logits_hook is not None or tokens_hook is not None):
            raise InputError("hooks are supported by the reference decoder only")
        if params.decoder == "fast":
            return self._run_fast(list(rows), params, shape, stream)
        if params.decoder == "sliding":
            return self._run_sliding(list(rows), params, shape, stream)
        return self._run(list(rows), params, shape, stream, logits_hook, tokens_hook)

    def _checked_shape(self, rows: Sequence[CanvasRow], params: SamplingParams) -> tuple[int, int]:
        """The (batch, length) bucket of ``rows``; InputError for rows ``run`` cannot take."""
        if not rows:
            raise InputError("no rows to generate")
        longest = max(len(r.ids) for r in rows)
        if params.decoder == "sliding":
            # The window must fit the canvas; a larger bucket keeps it whole (the window's size is the
            # request's, whichever rows share the batch).
            longest = max(longest, sliding_spec(params).window + 1)
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
        return shape

    def _reference_args(
        self,
        rows: Sequence[CanvasRow],
        params: SamplingParams,
        shape: tuple[int, int],
        stream: bool,
        logits_hook: Hook | None = None,
        tokens_hook: Hook | None = None,
    ) -> ReferenceProgram:
        """The program a reference-decoder run of ``rows`` uses."""
        return ReferenceProgram(
            kind="step" if stream else "all",
            shape=shape,
            spec=SamplerSpec.from_params(params),
            logits_hook=logits_hook,
            tokens_hook=tokens_hook,
            n_ratios=0 if stream else ratio_bucket(params.steps),
            window=0 if logits_hook or tokens_hook else self._window(list(rows), shape[1]),
        )

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

    def _run(
        self,
        rows: list[CanvasRow],
        params: SamplingParams,
        shape: tuple[int, int],
        stream: bool,
        logits_hook: Hook | None,
        tokens_hook: Hook | None,
    ) -> BatchEvents:
        which = self._reference_args(rows, params, shape, stream, logits_hook, tokens_hook)
        program, compile_s, compiled, hits = self._programs.reference(*which)
        n_ratios = which.n_ratios
        batch = PlacedBatch.of(rows, shape, self.config.pad_token_id)
        x, attn = jnp.asarray(batch.x), jnp.asarray(batch.attn)
        if tokens_hook is not None:
            x = tokens_hook(None, x, None)  # the reference calls the tokens hook once before the loop
        ratios = transfer_ratios(params.steps, params.eps)
        keys = row_keys([r.seed_for(params) for r in rows], shape[0])  # [B]: a row draws from its own seed
        knobs = Knobs.of(params)
        mask_id = self.config.mask_token_id
        t_start = time.perf_counter()
        if not stream:
            padded = np.ones(n_ratios, np.float32)
            padded[: params.steps] = ratios
            loop = LoopInputs(attn, jnp.asarray(padded), jnp.int32(params.steps), keys, knobs)
            prev = processes.host(program(self.state, x, loop))
            self.forwards += params.steps
        else:
            prev = processes.host(x)
            for i in range(params.steps):
                t0 = time.perf_counter()
                inputs = StepInputs(
                    attn=attn,
                    ratio=jnp.float32(ratios[i]),
                    is_last=jnp.bool_(i == params.steps - 1),
                    key=step_keys(keys, i),
                    index=jnp.int32(i),
                    knobs=knobs,
                )
                x = program(self.state, x, inputs)
                cur = processes.host(x)  # the one host transfer per step that streaming needs
                self.forwards += 1
                yield batch.step_event(prev, cur, i, params.steps, time.perf_counter() - t0, mask_id)
                prev = cur
        yield self._done(batch, prev, params, params.steps, t_start, CompileReport(compile_s, compiled, hits))


if TYPE_CHECKING:
    # The type checker in .ci/run holds this class to the interface the daemon serves.
    _conforms: type[RuntimeProtocol] = Runtime
