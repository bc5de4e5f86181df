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

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
from flax import nnx

from model_runtime.batch import PlacedBatch
from model_runtime.interface import CompileReport
from model_runtime.kernels import Knobs, row_keys, step_keys
from model_runtime.model import KV
from model_runtime.params import SamplingParams
from model_runtime.placement import output_shardings
from model_runtime.sampling import position_keys, sample_tokens
from model_runtime.specs import FastSpec

if TYPE_CHECKING:
    from model_runtime.programs import Jitted, ProgramCache


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
        chosen = spec.rule.select(jnp, conf, threshold, factor) & is_mask
        return jnp.where(chosen, x0, block), caches, it + 1

    block, caches, forwards = jax.lax.while_loop(cond, body, (block, caches, done))
    return jax.lax.dynamic_update_slice_in_dim(x, block, window, axis=1), caches, forwards


@dataclass(frozen=True)
class FastCalls:
    """The fast decoder's two compiled programs bound to one run's fixed inputs: the one way they are
    called, by the fast decoder's run (``decoders/fast.py``) and by the benchmarks (``bench.fast_parts``),
    so a change to the programs' arguments cannot leave a caller behind.

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

    @classmethod
    def bind(
        cls,
        programs: Sequence[Callable[..., Any]],
        state: nnx.State,
        batch: PlacedBatch,
        params: SamplingParams,
        region: tuple[int, int, int],
        compiled: CompileReport,
    ) -> FastCalls:
        """``programs`` (refresh, block) bound to a run of ``batch`` under ``params``; ``region`` is
        (lo, hi, block size)."""
        lo, hi, size = region
        return cls(
            refresh_program=programs[0],
            block_program=programs[1],
            state=state,
            batch=batch,
            attn=jnp.asarray(batch.attn),
            keys=row_keys([r.seed_for(params) for r in batch.rows], batch.shape[0]),
            sampling=Knobs.of(params).sampling(),
            threshold=jnp.float32(params.threshold),
            factor=jnp.float32(params.factor or 1.0),
            lo=lo,
            hi=hi,
            size=size,
            compiled=compiled,
        )

    def canvas(self) -> jax.Array:
        """The starting canvas on the device (a fresh copy: the refresh donates what it is given)."""
        return jnp.asarray(self.batch.x)

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


# -- the programs, as the fast decoder (model_runtime/decoders/fast.py) builds them ---------------------
_STATIC = ("graphdef", "spec", "mask_id")


def jitted(cache: ProgramCache) -> dict[str, Jitted]:
    """The refresh and block programs' jitted functions. The cache goes in and comes out of the block
    program: a streamed block resumes with it. The canvas is not donated there, so the host can read one
    call's canvas while the next call runs."""
    return {
        "refresh": jax.jit(refresh, static_argnames=_STATIC, donate_argnames=("x",)),
        "block": jax.jit(block_loop, static_argnames=_STATIC, donate_argnames=("caches",)),
    }


def abstract_args(
    cache: ProgramCache, kind: str, shape: tuple[int, int], built: Sequence[Callable[..., Any]]
) -> tuple[Any, ...]:
    """The abstract arguments of ``kind``; the block program's caches are laid out as the refresh program
    (``built[0]``) lays them out."""
    b, n = shape
    cfg = cache.cfg
    x, attn = cache.abstract(shape, jnp.int32), cache.abstract(shape, jnp.bool_)
    f32, i32, rng = cache.scalar(jnp.float32), cache.scalar(jnp.int32), cache.abstract_keys(b)
    if kind == "refresh":
        return (x, attn, i32, rng, f32, f32, i32)
    kv_shape = (b, cfg.num_key_value_heads, n, cfg.head_dim)
    layouts: Any = output_shardings(built[0])
    caches = [
        tuple(jax.ShapeDtypeStruct(kv_shape, jnp.dtype(cache.dtype), sharding=lay) for lay in layer)
        for layer in (layouts[1] if layouts else [(None, None)] * cfg.num_hidden_layers)
    ]
    return (x, attn, caches, i32, rng, f32, f32, i32, f32, f32, i32, i32)
