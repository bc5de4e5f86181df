"""The loaded model: ``Runtime.run(rows, params)`` denoises a batch of canvas rows into events.

Shapes are bucketed: a batch is left-padded to a (batch, length) bucket (``batch.py``), which leaves
every real row's result unchanged, so another prompt length inside a bucket reuses the compiled program
(``programs.py``). The runtime holds no decoder logic of its own: each request's decoder
(``model_runtime/decoders/``, found by ``params.decoder``) keys, builds and runs its programs on what the
runtime lends it (the model's state, the program cache, the tokenizer; ``decoders.Device``).
``loader.load`` builds a Runtime from a checkpoint.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from model_runtime import compile_cache, decoders, processes, quant, sharding
from model_runtime.config import DreamConfig
from model_runtime.decoders.reference import REFERENCE
from model_runtime.errors import InputError
from model_runtime.interface import (
    BatchEvents,
    CanvasRow,
    CompileReport,
    RuntimeInfo,
    RuntimeProtocol,
)
from model_runtime.kernels import Hook
from model_runtime.lines import line_table
from model_runtime.params import DEFAULT_MAX_PROGRAMS, SamplingParams
from model_runtime.programs import ProgramCache
from model_runtime.rows import CanvasBuilder
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
        chat_defaults: dict[str, Any] | None = None,
        one_line_defaults: dict[str, Any] | None = None,
        block_defaults: dict[str, Any] | None = None,
        chat_decoder: dict[str, Any] | None = None,
        editor_context: int | None = None,
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
            # ... and one with a block_scope (generation_config.block_defaults); a chat's decoder.
            block_defaults=dict(block_defaults or {}),
            chat_decoder=dict(chat_decoder or {}),
            editor_context=editor_context,
            # DiffuCoder's tokenizer reads "<|mask|>" in a raw prompt as the mask token: holes can be filled.
            supports_holes=True,
            quantize_mode=quantize.mode if quantize is not None else None,
            mesh=sharding.describe(mesh),
            # JAX lowers and XLA compiles on any thread, beside a program running on another (the program
            # cache builds each program once however many threads ask). Measured on CPU, where a compile
            # is host work; an accelerator's compile also runs kernels on it (GPU autotuning), so there it
            # stays on the device thread until measured there.
            concurrent_compile=devices[0].platform == "cpu",
            backend_threads=compile_cache.backend_threads(),
        )
        self.rows = CanvasBuilder(tokenizer, context)
        self.programs = ProgramCache(cfg, graphdef, state, dtype_name, mesh, max_programs)
        # Forwards of the model run since start, every decoder's (a queued forward that ran after its
        # consumer stopped reading included): the daemon's counters report it.
        self.forwards = 0
        self._line_tables: dict[bool, np.ndarray] = {}  # newline_table's two tables, built on first use
        self._lines: np.ndarray | None = None  # line_table's, built on first use

    def program_cache(self) -> dict[str, int | None]:
        """The compiled-program cache's bound and contents, for status reports."""
        return self.programs.info()

    # -- what a decoder's run borrows (decoders.Device) -------------------------------------------
    @property
    def mask_id(self) -> int:
        return self.config.mask_token_id

    def host(self, x: Any) -> np.ndarray:
        return processes.host(x)

    def count(self, forwards: int) -> None:
        self.forwards += forwards

    def newline_table(self, counted: bool) -> np.ndarray:
        """``[V]``: newlines per token id where lines are counted (``max_lines``), else zeros. Built once
        per kind and kept (read-only): every editor's one-line request needs it."""
        if counted not in self._line_tables:
            table = np.zeros(self.config.vocab_size, np.int32)
            if counted:
                counts = self.tokenizer.newlines()[: self.config.vocab_size]
                table[: len(counts)] = counts
            table.flags.writeable = False
            self._line_tables[counted] = table
        return self._line_tables[counted]

    def line_table(self) -> np.ndarray:
        """``[lines.ROWS, V]``: where each token puts line breaks, indentation and code (read-only, built
        on first use from every token's text)."""
        if self._lines is None:
            vocab = self.config.vocab_size
            table = line_table(self.tokenizer.token_texts(), vocab)[:, :vocab]
            table.flags.writeable = False
            self._lines = table
        return self._lines

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

    def program_keys(
        self, rows: Sequence[CanvasRow], params: SamplingParams, *, stream: bool = True
    ) -> frozenset[Hashable]:
        """The keys of the programs ``run(rows, params, stream=stream)`` uses."""
        shape = self.checked_shape(rows, params)
        return frozenset(decoders.get(params.decoder).keys(self, rows, params, shape, stream))

    def compiled(self, rows: Sequence[CanvasRow], params: SamplingParams, *, stream: bool = True) -> bool:
        """Whether ``run(rows, params, stream=stream)`` would start without compiling."""
        return all(key in self.programs for key in self.program_keys(rows, params, stream=stream))

    def compile(
        self, rows: Sequence[CanvasRow], params: SamplingParams, *, stream: bool = True
    ) -> CompileReport:
        """Compile (or load from the persistent cache) what ``run(rows, params, stream=stream)`` uses.

        Only the rows' shape counts (their bucket, where their region lies), not their tokens: the daemon
        warms programs up with made-up rows of the shapes its clients send.
        """
        shape = self.checked_shape(rows, params)
        return decoders.get(params.decoder).compile(self, rows, params, shape, stream)

    # -- running --------------------------------------------------------------------------------
    def step_canvas(
        self, x: np.ndarray, attn: np.ndarray | None, step: int, params: SamplingParams
    ) -> np.ndarray:
        """Apply denoising step ``step`` of ``params.steps`` to an arbitrary ``[B, L]`` canvas.

        The same compiled program ``run`` uses, at the canvas's exact shape; for parity checks that feed
        a reference's canvas in and compare what each side commits.
        """
        return REFERENCE.step_canvas(self, x, attn, step, params)

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
        decoder = decoders.get(params.decoder)
        shape = self.checked_shape(rows, params)
        hooks = (logits_hook, tokens_hook)
        if hooks != (None, None) and not decoder.accepts_hooks:
            raise InputError(f"hooks are not supported by the {decoder.name} decoder")
        return decoder.run(self, list(rows), params, shape, stream=stream, hooks=hooks)

    def checked_shape(self, rows: Sequence[CanvasRow], params: SamplingParams) -> tuple[int, int]:
        """The (batch, length) bucket of ``rows``; InputError for rows ``run`` cannot take."""
        if not rows:
            raise InputError("no rows to generate")
        decoder = decoders.get(params.decoder)
        longest = max(max(len(r.ids) for r in rows), decoder.min_length(params))
        shape = self.bucket_for(len(rows), longest)
        for r in rows:
            if r.region[1] <= r.region[0]:
                raise InputError("a row has an empty generation region")
        decoder.check(rows)
        return shape

    def window_for(self, new_tokens: int, n: int) -> int:
        """The logits window plain generation of ``new_tokens`` uses on an ``n``-token canvas (0: all)."""
        window = _pick(self.length_buckets, new_tokens)
        return 0 if window is None or window >= n else window


if TYPE_CHECKING:
    # The type checker in .ci/run holds this class to the interface the daemon serves.
    _conforms: type[RuntimeProtocol] = Runtime
