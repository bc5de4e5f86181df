"""The reference decoder's jitted programs: one denoising step, and every step in one ``fori_loop``.

They are pure functions of (graphdef, state, canvas, inputs): ``graphdef``, the sampler switches and the
hooks are static (each distinct value is another program), everything that changes per call is traced,
``top_k`` included (the program is compiled for a width that holds it, ``specs.top_k_width``).
The traced inputs travel as one registered dataclass (:class:`StepInputs`, :class:`LoopInputs`), so the
programs, their abstract signatures and their callers name each input once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from model_runtime.commit import COMMITS
from model_runtime.lines import ROWS
from model_runtime.model import DreamModel, shift_logits
from model_runtime.params import SamplingParams
from model_runtime.programs import ROW_BUCKETS
from model_runtime.sampling import position_keys, sample_tokens, split_rows, transfer_ratios
from model_runtime.specs import SamplerSpec
from model_runtime.strategies import EarlyStop, finished

if TYPE_CHECKING:
    from model_runtime.programs import Jitted, ProgramCache

Hook = Callable[[jax.Array | None, jax.Array, jax.Array | None], jax.Array]


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class Knobs:
    """The traced sampling values (scalars): changing them never recompiles."""

    temperature: jax.Array  # f32
    top_p: jax.Array  # f32
    alg_temp: jax.Array  # f32
    top_k: jax.Array  # i32, 1..spec.top_k (unused when top-k filtering is off)

    @classmethod
    def of(cls, params: SamplingParams) -> Knobs:
        return cls(
            jnp.float32(params.temperature),
            jnp.float32(params.effective_top_p),
            jnp.float32(params.alg_temp or 1.0),
            jnp.int32(max(params.effective_top_k, 1)),
        )

    def sampling(self) -> tuple[jax.Array, jax.Array, jax.Array]:
        """(temperature, top_p, top_k): what the fast decoder's programs take, in their order."""
        return self.temperature, self.top_p, self.top_k


def row_keys(seeds: Sequence[int], batch: int) -> jax.Array:
    """``[batch]`` PRNG keys, ``key(seed)`` for each row and ``key(0)`` for the bucket's spare rows: a row's
    randomness comes from its own seed, not from its place in the batch."""
    padded = np.zeros(batch, np.uint32)
    padded[: len(seeds)] = seeds
    return jax.vmap(jax.random.key)(jnp.asarray(padded))


def step_keys(keys: jax.Array, i: jax.Array | int) -> jax.Array:
    """The ``[B]`` keys of step ``i`` (the streaming and fused paths both use this, so results agree)."""
    return jax.vmap(lambda k: jax.random.fold_in(k, i))(keys)


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class StepInputs:
    """What one denoising step reads besides the canvas."""

    attn: jax.Array  # [B, L] bool: real tokens (False: left padding)
    ratio: jax.Array  # f32: the schedule's fraction of this step's masks to keep masked
    is_last: jax.Array  # bool: the last step commits every mask left
    key: jax.Array  # [B] this step's PRNG key per row (step_keys)
    index: jax.Array  # i32: the step's number, for the hooks
    knobs: Knobs


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class LoopInputs:
    """What the fused loop reads besides the canvas: the whole schedule and the base key."""

    attn: jax.Array  # [B, L] bool
    ratios: jax.Array  # [R] f32, the schedule padded to a power of two (ratio_bucket)
    steps: jax.Array  # i32: how many entries of ``ratios`` to run
    key: jax.Array  # [B] per row; step i uses step_keys(key, i), as the streaming path does
    knobs: Knobs

    def step(self, i: jax.Array) -> StepInputs:
        return StepInputs(
            self.attn, self.ratios[i], i == self.steps - 1, step_keys(self.key, i), i, self.knobs
        )


def denoise_step(
    state: nnx.State,
    x: jax.Array,
    inputs: StepInputs,
    *,
    graphdef: nnx.GraphDef,
    spec: SamplerSpec,
    mask_id: int,
    logits_hook: Hook | None,
    tokens_hook: Hook | None,
    window: int = 0,
    rows: tuple[int, ...] = ROW_BUCKETS,
) -> jax.Array:
    """One step of the reference's ``_sample`` loop on a ``[B, L]`` canvas; returns the new canvas.

    ``window`` (static; 0 = the whole canvas) limits the sampler to the last ``window`` positions when
    the caller knows every mask lies there (plain generation: the appended region). The reference computes
    logits for the whole canvas and then only uses masked positions; we compute them for masked positions
    only (``_sample_masked``). Neither changes a result, only the cost: ``lm_head`` and top-k over the
    vocabulary are a large part of a step. ``rows`` (static): the row counts it may gather
    (``ProgramCache.row_buckets``).
    """
    model = nnx.merge(graphdef, state)
    knobs = inputs.knobs
    n = x.shape[1]
    w = window if window and window < n else n
    canvas = x
    head, x = (x[:, : n - w], x[:, n - w :]) if w < n else (None, x)
    mask_index = x == mask_id  # masks inside the prompt are denoised too (infill)
    b = x.shape[0]
    k_sample, k_commit = split_rows(inputs.key)  # [B] each
    # Window position j lies w - 1 - j tokens before the row's end, wherever padding and bucket put it.
    dist = jnp.broadcast_to(w - 1 - jnp.arange(w, dtype=jnp.int32), (b, w))
    if logits_hook is None and tokens_hook is None:
        trunk = model.trunk(canvas, inputs.attn)
        confidence, x0 = _sample_masked(model, trunk, n - w, mask_index, k_sample, spec, knobs, rows)
        logits = None
    else:
        hidden, _ = model.hidden(canvas, inputs.attn)
        # The shift: position p is predicted by the output at p - 1 (position 0 by itself, never a mask).
        hidden = hidden[:, n - w - 1 : n - 1] if w < n else shift_logits(hidden)
        logits = model.head(hidden)  # [B, W, V]: the hooks see every position's logits
        if logits_hook is not None:
            logits = logits_hook(inputs.index, x, logits)
        keys = position_keys(k_sample, dist)
        confidence, x0 = sample_tokens(logits, keys, spec, knobs.temperature, knobs.top_p, knobs.top_k)
    alg = COMMITS[spec.alg]
    # Only commits that draw (origin, or sampled by alg_temp) build the per-position keys.
    commit_keys = position_keys(k_commit, dist) if alg.keyed(spec) else k_commit
    new = alg.commit(
        x, mask_index, x0, confidence, inputs.ratio, inputs.is_last, commit_keys, spec, knobs.alg_temp
    )
    if tokens_hook is not None:
        new = tokens_hook(inputs.index, new, logits)
    return new if head is None else jnp.concatenate([head, new], axis=1)


def denoise_all(state: nnx.State, x: jax.Array, inputs: LoopInputs, **statics: Any) -> jax.Array:
    """All ``inputs.steps`` steps in one program; per-step keys as the streaming path, so results agree.
    ``statics``: :func:`denoise_step`'s (graph, sampler, mask id, hooks, window, rows)."""

    def body(i: jax.Array, x: jax.Array) -> jax.Array:
        return denoise_step(state, x, inputs.step(i), **statics)

    return jax.lax.fori_loop(0, inputs.steps, body, x)


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class Limits:
    """What the early stops read (``strategies.StopTables``), on the device: a run's
    ``decoders.base.HostLimits`` as arrays."""

    stops: jax.Array  # [B, V] bool: tokens that end a row's text
    newlines: jax.Array  # [V] i32: newlines per token (zeros when lines are not counted)
    max_lines: jax.Array  # i32: a row's text ends with this many lines (0: no limit)
    lines: jax.Array  # [lines.ROWS, V] i32: line breaks, indentation and code per token
    scope: jax.Array  # [B] i32: each row's scope in columns (< 0: none)

    @classmethod
    def of(cls, host: Any) -> Limits:
        """``host`` (a ``HostLimits``) on the device."""
        return cls(
            jnp.asarray(host.stops),
            jnp.asarray(host.newlines),
            jnp.int32(host.max_lines),
            jnp.asarray(host.lines),
            jnp.asarray(host.scope),
        )

    @classmethod
    def abstract(cls, cache: ProgramCache, batch: int) -> Limits:
        v = cache.cfg.vocab_size
        return cls(
            cache.abstract((batch, v), jnp.bool_),
            cache.abstract((v,), jnp.int32),
            cache.scalar(jnp.int32),
            cache.abstract((ROWS, v), jnp.int32, rows=False),
            cache.abstract((batch,), jnp.int32),
        )


def denoise_until(
    state: nnx.State,
    x: jax.Array,
    inputs: LoopInputs,
    fill: jax.Array,
    limits: Limits,
    *,
    stops: tuple[EarlyStop, ...],
    **statics: Any,
) -> tuple[jax.Array, jax.Array]:
    """The fused loop, until every row is finished (``strategies.finished`` with ``stops``: its text has
    ended before its first mask) or the schedule ends; returns (x, the steps run). The steps it runs are
    :func:`denoise_all`'s (no hooks; ``statics`` as there), so a row's text up to its end is the same;
    what lies after it stays masked."""
    mask_id = statics["mask_id"]

    def cond(carry: tuple[jax.Array, jax.Array]) -> jax.Array:
        x, i = carry
        _, done = finished(stops, jnp, x, fill, limits, mask_id)
        return (i < inputs.steps) & ~jnp.all(done)

    def body(carry: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        x, i = carry
        step = denoise_step(state, x, inputs.step(i), logits_hook=None, tokens_hook=None, **statics)
        return step, i + 1

    return jax.lax.while_loop(cond, body, (x, jnp.int32(0)))


def row_sizes(window: int, rows: tuple[int, ...]) -> list[int]:
    """The row counts ``_sample_masked`` may gather over a ``window``-position region, smallest first, of
    ``rows`` (a runtime's: ``ProgramCache.row_buckets``)."""
    return [m for m in rows if m < window] + [window]


def gathered_rows(masks: int, window: int, rows: tuple[int, ...]) -> int:
    """Rows a reference step gathers when its fullest row holds ``masks`` masks (for FLOP counts)."""
    return next(m for m in row_sizes(window, rows) if m >= masks)


def _sample_masked(
    model: DreamModel,
    trunk: tuple[jax.Array, jax.Array, jax.Array],
    offset: int,
    mask_index: jax.Array,
    row_keys: jax.Array,
    spec: SamplerSpec,
    knobs: Knobs,
    rows: tuple[int, ...],
) -> tuple[jax.Array, jax.Array]:
    """``sample_tokens`` of the still-masked positions only: (confidence, proposal) over ``[B, W]``.

    ``trunk`` is ``model.trunk`` of the canvas, whose last ``W`` positions (from ``offset``) are sampled.
    A step's masks are gathered (in position order) into the smallest row bucket that holds every row's,
    and the last layer's queries and MLP, ``lm_head`` and the sampler run on those rows only; early steps
    use all ``W`` rows, late ones a few. Other positions get confidence -inf, which the commit ignores as
    the reference's ``logits[mask_index]`` gather does. A gathered position draws with its own key
    (``row_keys`` folded with its distance from the row's end), so the row bucket changes no sample.
    """
    b, w = mask_index.shape
    sizes = row_sizes(w, rows)
    # Masked positions first, in position order (stable), so rows keep the reference's tie order.
    order = jnp.argsort(~mask_index, axis=-1, stable=True)
    batch = jnp.arange(b)[:, None]

    def branch(m: int) -> Callable[..., tuple[jax.Array, jax.Array]]:
        def run(order: jax.Array, *trunk: jax.Array) -> tuple[jax.Array, jax.Array]:
            idx = order[:, :m]
            # The shift: position p is predicted by the output at p - 1 (position 0 by itself).
            hidden = model.finish(trunk[0], trunk[1], trunk[2], jnp.maximum(idx + offset - 1, 0))  # [B, m, D]
            keys = position_keys(row_keys, w - 1 - idx)  # [B, m]
            logits = model.head(hidden)
            confidence, x0 = sample_tokens(logits, keys, spec, knobs.temperature, knobs.top_p, knobs.top_k)
            full_conf = jnp.full((b, w), -jnp.inf, confidence.dtype).at[batch, idx].set(confidence)
            return full_conf, jnp.zeros((b, w), jnp.int32).at[batch, idx].set(x0)

        return run

    most = jnp.max(jnp.sum(mask_index, axis=-1))
    pick = jnp.searchsorted(jnp.asarray(sizes, jnp.int32), most.astype(jnp.int32))  # first size >= most
    return jax.lax.switch(pick, [branch(m) for m in sizes], order, *trunk)


# -- the programs, as the reference decoder (model_runtime/decoders/reference.py) builds and calls them ----
_STATIC = ("graphdef", "spec", "mask_id", "logits_hook", "tokens_hook", "window", "rows")


def jitted(cache: ProgramCache) -> dict[str, Jitted]:
    """The two programs' jitted functions for ``cache``'s device or mesh."""
    return {
        # One denoising step per call: for streaming, where every canvas goes to the host anyway.
        "step": jax.jit(denoise_step, static_argnames=_STATIC, donate_argnames=("x",), **cache.rows_out()),
        # The whole loop in one program (lax.fori_loop): no dispatch or host sync between steps.
        "all": jax.jit(denoise_all, static_argnames=_STATIC, donate_argnames=("x",), **cache.rows_out()),
        # The same loop ending once every row's text has (a request with ``max_lines``).
        "until": jax.jit(
            denoise_until,
            static_argnames=("graphdef", "spec", "mask_id", "stops", "window", "rows"),
            donate_argnames=("x",),
        ),
    }


def abstract_args(cache: ProgramCache, kind: str, shape: tuple[int, int], n_ratios: int) -> tuple[Any, ...]:
    """Abstract (canvas, inputs) of ``kind`` "step" or "all" (its schedule padded to ``n_ratios``)."""
    f32, i32 = cache.scalar(jnp.float32), cache.scalar(jnp.int32)
    common: dict[str, Any] = dict(
        attn=cache.abstract(shape, jnp.bool_),
        key=cache.abstract_keys(shape[0]),
        knobs=Knobs(f32, f32, f32, i32),
    )
    inputs: StepInputs | LoopInputs
    if kind == "step":
        inputs = StepInputs(ratio=f32, is_last=cache.scalar(jnp.bool_), index=i32, **common)
    else:
        inputs = LoopInputs(ratios=cache.abstract((n_ratios,), jnp.float32), steps=i32, **common)
    x = cache.abstract(shape, jnp.int32)
    if kind != "until":
        return (x, inputs)
    return (x, inputs, cache.abstract(shape, jnp.bool_), Limits.abstract(cache, shape[0]))


@dataclass(frozen=True)
class ReferenceCalls:
    """A reference-decoder run's program bound to its fixed inputs: ``step(x, i)`` runs step ``i`` (the
    "step" program), ``loop(x)`` every step (the "all" program, its schedule padded to ``n_ratios``)."""

    program: Callable[..., Any]
    state: nnx.State
    attn: jax.Array  # [B, L]
    keys: jax.Array  # [B], one per row
    knobs: Knobs
    ratios: np.ndarray  # the schedule, one entry per step

    @classmethod
    def bind(
        cls,
        program: Callable[..., Any],
        state: nnx.State,
        attn: np.ndarray,
        seeds: Sequence[int],
        params: SamplingParams,
    ) -> ReferenceCalls:
        keys = row_keys(seeds, attn.shape[0])  # [B]: a row draws from its own seed
        ratios = transfer_ratios(params.steps, params.eps)
        return cls(program, state, jnp.asarray(attn), keys, Knobs.of(params), ratios)

    @staticmethod
    def canvas(x: np.ndarray) -> jax.Array:
        """A host canvas on the device (a fresh copy: the programs donate their canvas)."""
        return jnp.asarray(x)

    def step(self, x: jax.Array, i: int) -> jax.Array:
        inputs = StepInputs(
            attn=self.attn,
            ratio=jnp.float32(self.ratios[i]),
            is_last=jnp.bool_(i == len(self.ratios) - 1),
            key=step_keys(self.keys, i),
            index=jnp.int32(i),
            knobs=self.knobs,
        )
        return self.program(self.state, x, inputs)

    def _loop_inputs(self, n_ratios: int) -> LoopInputs:
        padded = np.ones(n_ratios, np.float32)
        padded[: len(self.ratios)] = self.ratios
        steps = jnp.int32(len(self.ratios))
        return LoopInputs(self.attn, jnp.asarray(padded), steps, self.keys, self.knobs)

    def loop(self, x: jax.Array, n_ratios: int) -> jax.Array:
        """Every step (the "all" program)."""
        return self.program(self.state, x, self._loop_inputs(n_ratios))

    def until(
        self, x: jax.Array, n_ratios: int, fill: np.ndarray, limits: Any
    ) -> tuple[jax.Array, jax.Array]:
        """Every step until every row is finished (the "until" program); (x, steps run). ``fill``: the
        rows' regions; ``limits``: the run's ``HostLimits``."""
        return self.program(self.state, x, self._loop_inputs(n_ratios), jnp.asarray(fill), Limits.of(limits))
