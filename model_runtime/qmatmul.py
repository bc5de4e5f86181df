"""Weight-only int8 / int4 matmuls with the dequantization inside the matmul (Pallas kernels), and the
int8-activation variant (W8A8) for the compute-bound full-canvas forwards.

``x [M, K] @ w [K, N]`` where ``w`` is stored as integers with scales (``quant.py``):

- **int8**, one scale per output channel (``scale [1, N]``): each inner step converts a ``[bk, bn]`` tile
  of integers to the activation dtype on its way into the dot; the ``[bm, bn]`` accumulator (float32)
  is multiplied by the channel scales once at the end.
- **int4**, one scale per group of ``g`` consecutive inputs (``scale [K / g, N]``), stored **packed**:
  ``packed [K / 2, N]`` int8 holds input row ``j`` in its low nibble and row ``j + K / 2`` in its high
  nibble (``pack_int4``). One inner step reads one group's packed tile (``bk = g`` rows, two groups'
  worth of weights), splits the nibbles with two shifts, does two dots (against the activation's
  columns ``j`` and ``K / 2 + j``) and scales each partial product by its group's scales. The packing
  by halves keeps both activation slices contiguous: no strided gather of even/odd columns.

So the weight travels from memory as integers only (1 or 1/2 byte per weight) and no float copy of it
is ever written: what XLA's own path does for int4 (``values * scale`` materialised as a bf16 weight
before every matmul, docs/quantization.md) and, at 512 rows, for int8.

The grid is ``(splits, N / bn, M / bm)``: a program owns one ``[bm, bn]`` output tile and loops over its
share of K. Where the output has fewer tiles than the device has cores (the block step's 32 rows against
the 512 outputs of k_proj), K is split in ``splits`` parts whose float32 partial sums XLA adds
(split-K). ``tiling`` picks the blocks; the kernels need ``N`` a multiple of 16 and ``K`` (int4: ``K / 2``)
a multiple of the inner step, and return None (the XLA fallback) otherwise.

On GPU the kernel lowers through Pallas's Triton backend, whose loads must be power-of-two sized (every
block here is). ``interpret=True`` runs the same kernel body with XLA on any backend, which is how the
CPU tests check it against the einsum path.

W8A8 (``w8a8_matmul``) quantizes the activations too, one scale per row (token), and multiplies int8 by
int8 into int32 (the int8 tensor cores of an H100 do twice the bf16 rate); plain XLA, no kernel. An
option for the refresh's 512-row products (``quant.QuantSpec(activations="int8")``), not a default.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

# A Triton dot needs at least 16 rows and columns; blocks are powers of two (Triton's load rule).
_MIN_BLOCK = 16
_ROW_BLOCKS = (16, 32, 64, 128)
_COL_BLOCKS = (128, 64, 32, 16)
_MAX_SPLITS = 16
# Shared memory one program may use for its software pipeline (an H100 SM has 228 KiB).
_PIPELINE_BYTES = 160 * 1024
# The default core count when the device does not report one: an H100 SXM's 132 SMs.
DEFAULT_CORES = 132


@dataclass(frozen=True)
class Tiling:
    """How one ``[m, k] x [k, n]`` product is cut: rows padded to ``rows``, ``[bm, bn]`` output tiles,
    ``bk`` stored weight rows per inner step (int4: one group, i.e. ``bk`` packed rows holding ``2 bk``
    inputs), ``splits`` parts of K, each ``k_rows`` stored rows long."""

    rows: int
    bm: int
    bn: int
    bk: int
    splits: int
    k_rows: int

    @property
    def steps(self) -> int:
        """Inner steps per program."""
        return self.k_rows // self.bk

    def grid(self, n: int) -> tuple[int, int, int]:
        return (self.splits, n // self.bn, self.rows // self.bm)

    def programs(self, n: int) -> int:
        return math.prod(self.grid(n))


def _row_block(m: int) -> tuple[int, int]:
    """(bm, padded rows): the smallest block that holds a short ``m``; for long ones 128 or 64, whichever
    pads less (128 on a tie: fewer programs re-read the same weight tile)."""
    for bm in _ROW_BLOCKS[:-1]:
        if m <= bm:
            return bm, bm
    return min(((bm, -(-m // bm) * bm) for bm in (128, 64)), key=lambda t: (t[1], -t[0]))


def tiling(
    m: int, k: int, n: int, *, mode: str, group: int | None = None, cores: int = DEFAULT_CORES
) -> Tiling | None:
    """The blocks for ``x [m, k] @ w [k, n]``, or None where the kernel does not apply (the caller then
    takes XLA's path). ``k`` is the logical input count (int4: twice the packed rows)."""
    if mode not in ("int8", "int4") or m < 1 or n % _MIN_BLOCK:
        return None
    bm, rows = _row_block(m)
    if mode == "int4":
        if group is None or group < _MIN_BLOCK or group & (group - 1) or k % 2 or (k // 2) % group:
            return None
        stored, unit = k // 2, group  # one inner step is one group
    else:
        stored, unit = k, _MIN_BLOCK
        if k % unit:
            return None
    bn = next(b for b in _COL_BLOCKS if n % b == 0)
    # Memory-bound shapes (few rows) want every core streaming weights: narrower output tiles first
    # (down to 64 columns, 64 bytes of int8 per weight row), then split-K.
    while bn > 64 and n % (bn // 2) == 0 and (n // bn) * (rows // bm) < cores:
        bn //= 2
    # Split-K until the programs cover the cores: K cut into equal parts of whole inner steps (any
    # divisor, not only powers of two: 3584 inputs are 7 x 512), each part at least 512 inputs (int8) or
    # 2 groups (int4) long, below which a program's start-up outweighs its share of the weight.
    tiles = (n // bn) * (rows // bm)
    floor = 2 * unit if mode == "int4" else 512
    fits = [s for s in range(1, _MAX_SPLITS + 1) if stored % (s * unit) == 0 and stored // s >= floor]
    splits = next((s for s in fits if tiles * s >= cores), fits[-1] if fits else 1)
    k_rows = stored // splits
    step = unit if mode == "int4" else next(b for b in (128, 64, 32, 16) if k_rows % b == 0)
    return Tiling(rows=rows, bm=bm, bn=bn, bk=step, splits=splits, k_rows=k_rows)


def pack_int4(values: jax.Array) -> jax.Array:
    """``[K, N]`` integers in -8..7 (int4 or int8) -> ``[K / 2, N]`` int8: row ``j``'s value in the low
    nibble, row ``j + K / 2``'s in the high one. Works on numpy and JAX arrays alike."""
    half = values.shape[0] // 2
    v = values.astype("int8")
    lo, hi = v[:half], v[half:]
    return (lo & 0x0F) | (hi << 4)


def unpack_int4(packed: jax.Array) -> jax.Array:
    """The inverse of ``pack_int4``: ``[K / 2, N]`` int8 -> ``[K, N]`` int8 values (sign-extended)."""
    lo = jnp.right_shift(jnp.left_shift(packed, 4), 4)
    hi = jnp.right_shift(packed, 4)
    return jnp.concatenate([lo, hi], axis=0)


def _int8_kernel(x_ref: Any, w_ref: Any, s_ref: Any, o_ref: Any, *, bk: int, steps: int) -> None:
    def body(t: jax.Array, acc: jax.Array) -> jax.Array:
        ks = pl.ds(pl.multiple_of(t * bk, bk), bk)
        w = w_ref[ks, :].astype(x_ref.dtype)  # [bk, bn]: integers converted on their way into the dot
        return acc + jnp.dot(x_ref[:, ks], w, preferred_element_type=jnp.float32)

    acc = lax.fori_loop(0, steps, body, jnp.zeros(o_ref.shape, jnp.float32))
    o_ref[...] = (acc * s_ref[...].astype(jnp.float32)).astype(o_ref.dtype)  # per-channel scales


def _int4_kernel(
    xl_ref: Any, xh_ref: Any, w_ref: Any, sl_ref: Any, sh_ref: Any, o_ref: Any, *, bk: int, steps: int
) -> None:
    dtype = xl_ref.dtype

    def body(t: jax.Array, acc: jax.Array) -> jax.Array:
        ks = pl.ds(pl.multiple_of(t * bk, bk), bk)
        packed = w_ref[ks, :]  # [bk, bn] int8: two groups' weights
        lo = jnp.right_shift(jnp.left_shift(packed, 4), 4).astype(dtype)  # sign-extended low nibble
        hi = jnp.right_shift(packed, 4).astype(dtype)
        group = pl.ds(t, 1)  # bk == the group: one scale row per half per step
        part = jnp.dot(xl_ref[:, ks], lo, preferred_element_type=jnp.float32) * sl_ref[group, :].astype(
            jnp.float32
        )
        part += jnp.dot(xh_ref[:, ks], hi, preferred_element_type=jnp.float32) * sh_ref[group, :].astype(
            jnp.float32
        )
        return acc + part

    acc = lax.fori_loop(0, steps, body, jnp.zeros(o_ref.shape, jnp.float32))
    o_ref[...] = acc.astype(o_ref.dtype)


def _compiler_params(t: Tiling, per_stage: int, interpret: bool) -> Any:
    """Triton's warps and pipeline depth: the kernels are written for Pallas's Triton backend, which the
    type of these parameters selects on GPU (without them this JAX picks Mosaic GPU, whose rules they
    do not follow). None in interpret mode and on TPU (Mosaic's defaults)."""
    if interpret or jax.default_backend() == "tpu":
        return None
    stages = max(1, min(4, _PIPELINE_BYTES // per_stage))
    return pltriton.CompilerParams(num_warps=8 if t.bm * t.bn >= 128 * 128 else 4, num_stages=stages)


def _finish(out: jax.Array, t: Tiling, m: int, dtype: jnp.dtype) -> jax.Array:
    """Split-K partial sums added, padded rows dropped, the activation dtype."""
    if t.splits > 1:
        out = out.sum(axis=0)
    return out[:m].astype(dtype)


def _padded(x: jax.Array, t: Tiling) -> jax.Array:
    return x if x.shape[0] == t.rows else jnp.pad(x, ((0, t.rows - x.shape[0]), (0, 0)))


def _out_spec(t: Tiling, n: int, dtype: jnp.dtype) -> tuple[jax.ShapeDtypeStruct, pl.BlockSpec]:
    if t.splits > 1:
        shape = jax.ShapeDtypeStruct((t.splits, t.rows, n), jnp.float32)
        return shape, pl.BlockSpec((None, t.bm, t.bn), lambda s, j, i: (s, i, j))
    return jax.ShapeDtypeStruct((t.rows, n), dtype), pl.BlockSpec((t.bm, t.bn), lambda s, j, i: (i, j))


def int8_matmul(
    x: jax.Array, values: jax.Array, scale: jax.Array, *, t: Tiling, interpret: bool = False
) -> jax.Array:
    """``x [M, K] @ (values [K, N] int8 * scale [1, N])`` in ``x.dtype``, dequantizing inside the matmul."""
    m, n = x.shape[0], values.shape[1]
    out_shape, out_spec = _out_spec(t, n, x.dtype)
    call = pl.pallas_call(
        functools.partial(_int8_kernel, bk=t.bk, steps=t.steps),
        out_shape=out_shape,
        grid=t.grid(n),
        in_specs=[
            pl.BlockSpec((t.bm, t.k_rows), lambda s, j, i: (i, s)),
            pl.BlockSpec((t.k_rows, t.bn), lambda s, j, i: (s, j)),
            pl.BlockSpec((1, t.bn), lambda s, j, i: (0, j)),
        ],
        out_specs=out_spec,
        interpret=interpret,
        compiler_params=_compiler_params(t, t.bk * (t.bm * x.dtype.itemsize + t.bn), interpret),
        name=f"int8_matmul_{t.bm}x{t.bn}x{t.bk}_s{t.splits}",
    )
    return _finish(call(_padded(x, t), values, scale), t, m, x.dtype)


def int4_matmul(
    x: jax.Array, packed: jax.Array, scale: jax.Array, *, t: Tiling, interpret: bool = False
) -> jax.Array:
    """``x [M, K] @ dequantized(packed [K / 2, N], scale [K / g, N])`` in ``x.dtype``; ``t.bk`` is the
    group ``g`` (``tiling(..., mode="int4", group=g)``)."""
    m, n = x.shape[0], packed.shape[1]
    s = t.splits
    groups = t.k_rows // t.bk  # scale rows per split and half
    out_shape, out_spec = _out_spec(t, n, x.dtype)
    call = pl.pallas_call(
        functools.partial(_int4_kernel, bk=t.bk, steps=t.steps),
        out_shape=out_shape,
        grid=t.grid(n),
        in_specs=[
            # The activation's columns [0, K/2) meet the low nibbles, [K/2, K) the high ones.
            pl.BlockSpec((t.bm, t.k_rows), lambda si, j, i: (i, si)),
            pl.BlockSpec((t.bm, t.k_rows), lambda si, j, i: (i, si + s)),
            pl.BlockSpec((t.k_rows, t.bn), lambda si, j, i: (si, j)),
            pl.BlockSpec((groups, t.bn), lambda si, j, i: (si, j)),
            pl.BlockSpec((groups, t.bn), lambda si, j, i: (si + s, j)),
        ],
        out_specs=out_spec,
        interpret=interpret,
        compiler_params=_compiler_params(t, t.bk * (2 * t.bm * x.dtype.itemsize + t.bn), interpret),
        name=f"int4_matmul_{t.bm}x{t.bn}x{t.bk}_s{t.splits}",
    )
    xp = _padded(x, t)
    return _finish(call(xp, xp, packed, scale, scale), t, m, x.dtype)


def w8a8_matmul(x: jax.Array, values: jax.Array, scale: jax.Array) -> jax.Array:
    """``x [M, K] @ (values [K, N] int8 * scale [1, N])`` with ``x`` quantized to int8 too, one scale per
    row (``max|x_row| / 127``, round to nearest), an int8 x int8 -> int32 product, and both scales on the
    output. Costs the activations' rounding (docs/quantization.md measures how much) for the int8 rate."""
    x32 = x.astype(jnp.float32)
    x_scale = jnp.max(jnp.abs(x32), axis=1, keepdims=True) / 127.0  # [M, 1]
    x_scale = jnp.where(x_scale > 0, x_scale, 1.0)
    xq = jnp.clip(jnp.rint(x32 / x_scale), -127, 127).astype(jnp.int8)
    acc = jnp.dot(xq, values, preferred_element_type=jnp.int32)  # [M, N]
    return (acc.astype(jnp.float32) * x_scale * scale.astype(jnp.float32)).astype(x.dtype)
