"""The fast decoder: Fast-dLLM-style DualCache, block-wise decoding and confidence-threshold unmasking.

The generation region is decoded in blocks of ``block_length`` positions, left to right. Per block:

1. ``refresh``: one full forward over the whole canvas keeps every layer's keys/values (after RoPE; the
   positions never move) and commits the block's first position from the output just before it.
2. ``block_loop``: on device, until the block has no mask left: a forward of the block's positions only,
   attending over the cached keys/values of the whole canvas, with the block's fresh keys/values written
   into the cache (DualCache); logits are computed for the block positions only; every masked position
   whose confidence reaches ``threshold`` is committed, and always at least the most confident one.

Both programs have fixed shapes (the bucket and the block length); the in-block loop is a
``lax.while_loop``, so a block costs one dispatch. The loop can also stop after ``limit`` forwards and be
resumed where it stopped (it returns the cache and its forward count), which is how a streaming client
sees every forward: the same program, called with ``limit`` 1 until the block is done, draws the same
keys in the same order, so both ways give the same tokens.

The cache is approximate (the prompt and the rest of the canvas are not re-encoded while a block changes),
which is why outputs can differ from the reference decoder (docs/performance.md has the measured quality
and speed of both).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from model_runtime.batch import PlacedBatch
from model_runtime.interface import CanvasRow, CompileReport
from model_runtime.kernels import step_keys
from model_runtime.model import KV
from model_runtime.params import SamplingParams, fast_block_size
from model_runtime.sampling import SamplerSpec, position_keys, sample_tokens


@dataclass(frozen=True)
class FastSpec:
    """Static switches of the fast decoder's programs."""

    sampler: SamplerSpec  # how a proposal and its confidence are drawn (max-probability confidence)
    block_length: int = 32
    use_factor: bool = False  # the factor rule instead of the plain threshold


def refresh(
    state: nnx.State,
    x: jax.Array,
    attn: jax.Array,
    start: jax.Array,
    key: jax.Array,
    temperature: jax.Array,
    top_p: jax.Array,
    top_k: jax.Array,
    *,
    graphdef: nnx.GraphDef,
    spec: FastSpec,
    mask_id: int,
) -> tuple[jax.Array, list[KV]]:
    """Full forward: every layer's (k, v) for the canvas, and position ``start`` committed if masked.

    Dream predicts position i from the output at i - 1, so the block's first position is the one
    prediction a block-only forward cannot make; the refresh makes it (as Fast-dLLM does). ``key``:
    ``[B]``, one per row.
    """
    model = nnx.merge(graphdef, state)
    b, n = x.shape
    # The output before ``start`` is the only one used: the last layer runs its query alone.
    before, caches = model.hidden_at(x, attn, jnp.broadcast_to(start - 1, (b, 1)))  # [B, 1, D]
    keys = position_keys(key, jnp.broadcast_to(n - 1 - start, (b, 1)))  # counted from the row's end
    _, x0 = sample_tokens(
        no_mask(model.head(before), mask_id), keys, spec.sampler, temperature, top_p, top_k
    )  # [B, 1]
    first = jax.lax.dynamic_slice_in_dim(x, start, 1, axis=1)
    x = jax.lax.dynamic_update_slice_in_dim(x, jnp.where(first == mask_id, x0, first), start, axis=1)
    return x, caches


def no_mask(logits: jax.Array, mask_id: int) -> jax.Array:
    """Never propose ``<|mask|>`` itself: committing it would leave the position masked and stall the
    block loop (dInfer excludes it the same way). The reference decoder keeps the reference's behaviour."""
    return logits.at[..., mask_id].set(jnp.finfo(logits.dtype).min)


def commit_mask(
    confidence: jax.Array, threshold: jax.Array, factor: jax.Array, use_factor: bool
) -> jax.Array:
    """Which positions to commit, branch-free; ``confidence`` is ``-inf`` where nothing may be committed.

    Threshold rule (dInfer): commit ``conf >= min(max(conf) - 1e-5, threshold)``, which always includes
    the row's most confident position. Factor rule (Fast-dLLM): with confidences sorted descending,
    commit the longest prefix where ``c_(i) >= 1 - factor / (i + 1)``, at least one.
    """
    if use_factor:
        ranked = -jnp.sort(-confidence, axis=-1)  # [B, N], descending
        i = jnp.arange(1, ranked.shape[-1] + 1, dtype=jnp.float32)
        ok = ranked >= 1.0 - factor / (i + 1.0)
        n = jnp.maximum(jnp.sum(jnp.cumprod(ok, axis=-1), axis=-1), 1)  # [B]
        thr = jnp.take_along_axis(ranked, (n - 1)[:, None], axis=-1)
    else:
        thr = jnp.minimum(jnp.max(confidence, axis=-1, keepdims=True) - 1e-5, threshold)
    return (confidence >= thr) & (confidence > -jnp.inf)


def block_loop(
    state: nnx.State,
    x: jax.Array,
    attn: jax.Array,
    caches: list[KV],
    window: jax.Array,
    key: jax.Array,
    temperature: jax.Array,
    top_p: jax.Array,
    top_k: jax.Array,
    threshold: jax.Array,
    factor: jax.Array,
    done: jax.Array,
    limit: jax.Array,
    *,
    graphdef: nnx.GraphDef,
    spec: FastSpec,
    mask_id: int,
) -> tuple[jax.Array, list[KV], jax.Array]:
    """Decode the ``block_length`` positions from ``window`` until none is masked, at most ``limit``
    forwards in this call, ``done`` forwards having run on this block before it (0 for a fresh block).

    Returns (x, caches, forwards run on this block so far). ``key`` is ``[B]``, one per row; forward
    ``i`` of a block draws from ``fold_in(key, i)`` whichever call runs it, so one call with
    ``limit >= block_length`` and ``block_length`` calls with ``limit`` 1 commit the same tokens.
    """
    model = nnx.merge(graphdef, state)
    size = spec.block_length
    b, n = x.shape
    block = jax.lax.dynamic_slice_in_dim(x, window, size, axis=1)  # [B, N]
    # A block needs at most ``size`` forwards (each commits at least one position of every row).
    stop = jnp.minimum(done + limit, size)
    # Each block position's distance from the row's end: its draws do not depend on padding or bucket.
    dist = jnp.broadcast_to(n - 1 - window - jnp.arange(size, dtype=jnp.int32), (b, size))

    def cond(carry: tuple) -> jax.Array:
        block, _, it = carry
        return jnp.any(block == mask_id) & (it < stop)

    def body(carry: tuple) -> tuple:
        block, caches, it = carry
        hidden, caches = model.hidden(block, attn, caches=caches, start=window)  # [B, N, D]
        # Shift inside the block: position j is predicted by output j - 1. The window's first position is
        # never a mask here (committed by the refresh, or decoded earlier), so its own output is unused.
        logits = no_mask(model.head(hidden), mask_id)
        logits = jnp.concatenate([logits[:, :1], logits[:, :-1]], axis=1)  # [B, N, V]
        keys = position_keys(jax.vmap(lambda k: jax.random.fold_in(k, it))(key), dist)
        conf, x0 = sample_tokens(logits, keys, spec.sampler, temperature, top_p, top_k)
        is_mask = block == mask_id
        conf = jnp.where(is_mask, conf.astype(jnp.float32), -jnp.inf)
        chosen = commit_mask(conf, threshold, factor, spec.use_factor) & is_mask
        return jnp.where(chosen, x0, block), caches, it + 1

    block, caches, forwards = jax.lax.while_loop(cond, body, (block, caches, done))
    return jax.lax.dynamic_update_slice_in_dim(x, block, window, axis=1), caches, forwards


def layout(
    rows: Sequence[CanvasRow], params: SamplingParams, shape: tuple[int, int]
) -> tuple[int, int, int, FastSpec]:
    """Where the fast decoder works in the bucket: the region's columns [lo, hi), the block size, and
    the programs' static switches. Every row's region sits in the same columns (the runtime checks)."""
    n = shape[1]
    r = rows[0]
    lo = n - len(r.ids) + r.region[0]  # rows are left-padded: a row starts at n - len(ids)
    hi = n - len(r.ids) + r.region[1]
    size = fast_block_size(params.block_length, hi - lo, n - 1)
    fspec = FastSpec(
        sampler=dataclasses.replace(SamplerSpec.from_params(params), alg="maskgit_plus", use_alg_temp=False),
        block_length=size,
        use_factor=params.factor is not None,
    )
    return lo, hi, size, fspec


@dataclass(frozen=True)
class FastCalls:
    """The fast decoder's two compiled programs bound to one run's fixed inputs: the one way they are
    called, by ``Runtime`` (generation) and by the benchmarks (``Runtime.fast_calls``,
    ``bench.fast_parts``), so a change to the programs' arguments cannot leave a caller behind.

    Both programs donate what they are given: ``refresh`` its canvas, ``block`` its canvas and caches.
    A caller that needs them again passes copies.
    """

    refresh_program: Callable[..., Any]
    block_program: Callable[..., Any]
    state: nnx.State
    batch: PlacedBatch  # the left-padded rows (``batch.x`` is the starting canvas, on the host)
    attn: jax.Array  # [B, L]
    keys: jax.Array  # [B], one per row
    sampling: tuple[jax.Array, jax.Array, jax.Array]  # temperature, top_p, top_k (kernels.Knobs)
    threshold: jax.Array
    factor: jax.Array
    lo: int  # the region's columns [lo, hi) in the bucket
    hi: int
    size: int  # block length
    compiled: CompileReport  # what getting the programs ready cost

    @property
    def starts(self) -> list[int]:
        """Each block's first column."""
        return list(range(self.lo, self.hi, self.size))

    def window(self, b: int) -> int:
        """Block ``b``'s window: the last block may be short, or the region shorter than a block, so it
        slides back, never past ``hi`` (the positions it takes in are decoded already, or prompt)."""
        return max(0, min(self.starts[b], self.hi - self.size))

    def refresh(self, x: jax.Array, b: int) -> tuple[jax.Array, list[KV]]:
        """Block ``b``'s refresh: every layer's keys and values, and the block's first position."""
        key = step_keys(self.keys, b)
        start = jnp.int32(self.starts[b])
        return self.refresh_program(self.state, x, self.attn, start, step_keys(key, 0), *self.sampling)

    def block(
        self, x: jax.Array, caches: list[KV], b: int, done: int, limit: int
    ) -> tuple[jax.Array, list[KV], jax.Array]:
        """Block ``b``'s loop: at most ``limit`` more forwards after ``done``; (x, caches, forwards)."""
        key = step_keys(step_keys(self.keys, b), 1)
        return self.block_program(
            self.state,
            x,
            self.attn,
            caches,
            jnp.int32(self.window(b)),
            key,
            *self.sampling,
            self.threshold,
            self.factor,
            jnp.int32(done),
            jnp.int32(limit),
        )
