"""The sliding decoder: a window of queries that follows each row's first mask, on one device loop.

The fast decoder (``fast.py``, Fast-dLLM's DualCache) cuts the region into fixed blocks and pays a full
refresh forward per block, which commits one token; a block's forwards ask queries for all of its
positions until the last one is filled. This decoder keeps the cache of DualCache and moves the block:

- **Sliding window** (dInfer's vicinity refresh, Elastic-Cache's window over the leftmost masks): each
  forward asks queries for ``window`` positions starting just before the row's first mask, writes their
  fresh keys/values into the cache and commits among the window's masks. A position is predicted by the
  output just before it (Dream's shift), so the window's first position is the decoded token that
  predicts the first mask. Each row has its own window, so rows whose regions lie in different columns
  (infill rows with different suffix lengths) share a batch.
- **Delayed caching** (dKV-Cache): a position committed in a forward still holds the keys/values of a
  mask in the cache. The next window starts no later than the leftmost such position, so every committed
  token is re-encoded once while the window passes over it.
- **The refresh is a decoding step**: the first forward runs over the whole canvas (it fills the cache)
  and commits by the same rule as every other forward, instead of committing exactly one position.
  With ``refresh_every`` N > 0 every N-th forward is such a full forward again (dKV-Cache-Decode's
  periodic refresh); 0 refreshes only at the start.
- **Early stop per row** (dInfer): a row is finished once a stop token (end of text) is committed with
  every position before it committed, or, for a request with ``max_lines``, once the positions before
  its first mask hold that many lines; or when no mask is left. Its text cannot change after that, so
  the loop stops when every row is finished; the row's masks left after the stop become padding.
- **Commit rules and early stops** are the spec's strategy values (``model_runtime/strategies.py``): the
  threshold or the factor rule, or dInfer's credit rule, which adds ``0.7 * log(1 + credit)`` to the
  logits, ``credit`` being a decaying (0.8 per forward) sum of ``p_top1 ** 0.2`` at each position's
  proposed token: a proposal that stays the same over forwards passes the threshold sooner.

After the first forward (its own program, ``prefill``), everything is one ``lax.while_loop`` (``steps``;
a ``lax.cond`` picks the full or the window forward), so a call runs any number of forwards without a
host sync; ``limit`` bounds a call and the carry resumes it, which
is how streaming and cancellation see every forward: forward ``i`` draws from ``fold_in(key, i)``
whichever call runs it, so one call or one call per forward commit the same tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from model_runtime.fast import no_mask
from model_runtime.kernels import Knobs, Limits, row_keys
from model_runtime.model import KV, DreamModel, read_block
from model_runtime.params import SamplingParams
from model_runtime.placement import output_shardings
from model_runtime.sampling import position_keys, sample_tokens
from model_runtime.specs import SlidingSpec
from model_runtime.strategies import finished

if TYPE_CHECKING:
    from model_runtime.programs import Jitted, ProgramCache


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class SlidingInputs:
    """What every forward reads besides the carry."""

    attn: jax.Array  # [B, L] bool: real tokens (False: left padding)
    fill: jax.Array  # [B, L] bool: the positions to decode (the region's masks at the start)
    limits: Limits  # what the early stops read
    key: jax.Array  # [B] PRNG key per row; forward i draws from fold_in(key, i)
    temperature: jax.Array  # f32
    top_p: jax.Array  # f32
    top_k: jax.Array  # i32
    threshold: jax.Array  # f32
    factor: jax.Array  # f32
    refresh_every: jax.Array  # i32: a full forward every this many forwards (0: only the first)


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class Front:
    """The small part of the loop's state; the host reads it after each call (never donated)."""

    x: jax.Array  # [B, L] i32 canvas
    pending: jax.Array  # [B] i32: leftmost position committed by the last forward (L: none)
    start: jax.Array  # [B] i32: the last forward's window start (the credit follows it)
    forwards: jax.Array  # i32: forwards run so far
    finished: jax.Array  # [B] bool


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class Cache:
    """The large part of the loop's state, updated in place (donated to each call)."""

    kv: list[KV]  # every layer's keys/values, [B, K, L, E] each
    credit: jax.Array  # [B, window, V] f32 under the credit rule, aligned with the window; else [B, 1, 1]


def frontier(
    x: jax.Array, inputs: SlidingInputs, spec: SlidingSpec, mask_id: int
) -> tuple[jax.Array, jax.Array]:
    """Each row's first mask (``L`` when none) and whether the row is finished (``strategies.finished``:
    no mask left, or one of the spec's early stops ends the text before its first mask)."""
    return finished(spec.stops, jnp, x, inputs.fill, inputs.limits, mask_id)


def _write(x: jax.Array, block: jax.Array, start: jax.Array) -> jax.Array:
    """``x[b, start[b] : start[b] + W] = block[b]`` for ``[B, L]`` canvases."""
    return jax.vmap(lambda row, new, s: jax.lax.dynamic_update_slice_in_dim(row, new, s, axis=0))(
        x, block, start
    )


def _forward(
    model: DreamModel,
    front: Front,
    cache: Cache,
    inputs: SlidingInputs,
    full: bool,
    spec: SlidingSpec,
    mask_id: int,
) -> tuple[Front, Cache]:
    """One forward (the whole canvas when ``full``, else the window over the cache) and its commits."""
    x = front.x
    n = x.shape[1]
    w = spec.window
    first, finished = frontier(x, inputs, spec, mask_id)
    # Just before the first mask (its predictor), and no later than last forward's leftmost commit.
    start = jnp.clip(jnp.minimum(first - 1, front.pending), 0, n - w)  # [B]
    block = read_block(x, start, w)  # [B, W]
    pos = start[:, None] + jnp.arange(w, dtype=jnp.int32)  # [B, W]
    if full:
        hidden, kv = model.hidden_at(x, inputs.attn, pos)  # [B, W, D]
    else:
        hidden, kv = model.hidden(block, inputs.attn, caches=cache.kv, start=start)  # [B, W, D]
    logits = no_mask(model.head(hidden), mask_id)
    # Position j of the window is predicted by output j - 1; the window's first position by nothing here.
    logits = jnp.concatenate([logits[:, :1], logits[:, :-1]], axis=1)  # [B, W, V]
    can = (block == mask_id) & read_block(inputs.fill, start, w) & (pos > start[:, None])
    can &= ~finished[:, None]
    credit, logits = spec.rule.fuse(jnp, cache.credit, logits, can, start - front.start)
    keys = jax.vmap(lambda k: jax.random.fold_in(k, front.forwards))(inputs.key)
    keys = position_keys(keys, n - 1 - pos)  # a position's draws do not depend on padding or bucket
    conf, x0 = sample_tokens(logits, keys, spec.sampler, inputs.temperature, inputs.top_p, inputs.top_k)
    conf = jnp.where(can, conf.astype(jnp.float32), -jnp.inf)
    chosen = spec.rule.select(jnp, conf, inputs.threshold, inputs.factor) & can
    x = _write(x, jnp.where(chosen, x0, block), start)
    pending = jnp.min(jnp.where(chosen, pos, n), axis=-1)
    _, finished = frontier(x, inputs, spec, mask_id)
    return Front(x, pending, start, front.forwards + 1, finished), Cache(kv, credit)


def prefill(
    state: nnx.State,
    x: jax.Array,
    inputs: SlidingInputs,
    *,
    graphdef: nnx.GraphDef,
    spec: SlidingSpec,
    mask_id: int,
) -> tuple[Front, Cache]:
    """Forward 0: the whole canvas, which fills every layer's cache, and the first window's commits."""
    model = nnx.merge(graphdef, state)
    b, n = x.shape
    credit = spec.rule.state_shape(b, spec.window, model.cfg.vocab_size)
    front = Front(
        x=x,
        pending=jnp.full((b,), n, jnp.int32),
        start=jnp.zeros((b,), jnp.int32),
        forwards=jnp.int32(0),
        finished=jnp.zeros((b,), bool),
    )
    # A full forward reads no cache: the empty one only stands in for it.
    return _forward(model, front, Cache([], jnp.zeros(credit, jnp.float32)), inputs, True, spec, mask_id)


def steps(
    state: nnx.State,
    front: Front,
    cache: Cache,
    inputs: SlidingInputs,
    limit: jax.Array,
    bound: jax.Array,
    *,
    graphdef: nnx.GraphDef,
    spec: SlidingSpec,
    mask_id: int,
) -> tuple[Front, Cache]:
    """At most ``limit`` more forwards (``bound`` in all), until every row is finished."""
    model = nnx.merge(graphdef, state)
    stop = jnp.minimum(front.forwards + limit, bound)

    def cond(carry: tuple[Front, Cache]) -> jax.Array:
        front = carry[0]
        return jnp.any(~front.finished) & (front.forwards < stop)

    def body(carry: tuple[Front, Cache]) -> tuple[Front, Cache]:
        if not spec.refresh:
            return _forward(model, carry[0], carry[1], inputs, False, spec, mask_id)
        every = inputs.refresh_every
        full = (every > 0) & (carry[0].forwards % jnp.maximum(every, 1) == 0)
        return jax.lax.cond(
            full,
            lambda c: _forward(model, c[0], c[1], inputs, True, spec, mask_id),
            lambda c: _forward(model, c[0], c[1], inputs, False, spec, mask_id),
            carry,
        )

    return jax.lax.while_loop(cond, body, (front, cache))


# -- the programs, as the sliding decoder (model_runtime/decoders/sliding.py) builds and calls them ------
_STATIC = ("graphdef", "spec", "mask_id")


def jitted(cache: ProgramCache) -> dict[str, Jitted]:
    """Forward 0 over the whole canvas, then the loop. The loop updates the caches in place; the canvas and
    the rest stay readable after the call, so the host can read one call's canvas while the next runs."""
    return {
        "prefill": jax.jit(prefill, static_argnames=_STATIC),
        "steps": jax.jit(steps, static_argnames=_STATIC, donate_argnames=("cache",)),
    }


def _abstract_inputs(cache: ProgramCache, shape: tuple[int, int]) -> SlidingInputs:
    b, _ = shape
    f32, i32 = cache.scalar(jnp.float32), cache.scalar(jnp.int32)
    return SlidingInputs(
        attn=cache.abstract(shape, jnp.bool_),
        fill=cache.abstract(shape, jnp.bool_),
        limits=Limits.abstract(cache, b),
        key=cache.abstract_keys(b),
        temperature=f32,
        top_p=f32,
        top_k=i32,
        threshold=f32,
        factor=f32,
        refresh_every=i32,
    )


def abstract_args(
    cache: ProgramCache,
    kind: str,
    shape: tuple[int, int],
    spec: SlidingSpec,
    built: Sequence[Callable[..., Any]],
) -> tuple[Any, ...]:
    """The abstract arguments of ``kind``; the loop takes the state exactly as the prefill program
    (``built[0]``) lays it out."""
    x, inputs = cache.abstract(shape, jnp.int32), _abstract_inputs(cache, shape)
    if kind == "prefill":
        return (x, inputs)
    graphdef, mask_id = cache.graphdef, cache.cfg.mask_token_id
    front, state = jax.eval_shape(
        lambda x, i: prefill(cache.state, x, i, graphdef=graphdef, spec=spec, mask_id=mask_id), x, inputs
    )
    layouts: Any = output_shardings(built[0])
    if layouts:
        front, state = jax.tree.map(
            lambda a, lay: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=lay),
            (front, state),
            tuple(layouts),
        )
    i32 = cache.scalar(jnp.int32)
    return (front, state, inputs, i32, i32)


@dataclass(frozen=True)
class SlidingCalls:
    """The sliding decoder's two programs bound to one run's inputs: ``prefill()`` runs forward 0,
    ``steps(front, cache, limit)`` at most ``limit`` more forwards (``bound`` in all)."""

    prefill_program: Callable[..., Any]
    steps_program: Callable[..., Any]
    state: nnx.State
    x: np.ndarray  # [B, L] the starting canvas, on the host
    inputs: SlidingInputs
    bound: int  # forwards at most: every forward commits at least one position of every unfinished row

    @classmethod
    def bind(
        cls,
        programs: Sequence[Callable[..., Any]],
        state: nnx.State,
        x: np.ndarray,
        attn: np.ndarray,
        fill: np.ndarray,
        limits: Any,
        seeds: Sequence[int],
        params: SamplingParams,
    ) -> SlidingCalls:
        """``fill``: the positions to decode; ``limits``: the run's ``HostLimits``, what the early stops
        read."""
        knobs = Knobs.of(params)
        inputs = SlidingInputs(
            attn=jnp.asarray(attn),
            fill=jnp.asarray(fill),
            limits=Limits.of(limits),
            key=row_keys(seeds, x.shape[0]),
            temperature=knobs.temperature,
            top_p=knobs.top_p,
            top_k=knobs.top_k,
            threshold=jnp.float32(params.threshold),
            factor=jnp.float32(params.factor or 1.0),
            refresh_every=jnp.int32(params.refresh_every),
        )
        bound = int(fill.sum(axis=1).max(initial=0))
        return cls(programs[0], programs[1], state, x, inputs, bound)

    def prefill(self) -> tuple[Front, Cache]:
        return self.prefill_program(self.state, jnp.asarray(self.x), self.inputs)

    def steps(self, front: Front, cache: Cache, limit: int | None = None) -> tuple[Front, Cache]:
        """At most ``limit`` more forwards (None: until every row is finished)."""
        bound = jnp.int32(max(self.bound, 1))
        return self.steps_program(
            self.state, front, cache, self.inputs, bound if limit is None else jnp.int32(limit), bound
        )
