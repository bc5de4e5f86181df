"""Weight-only quantization: int8 with per-output-channel scales, int4 with group-wise scales.

Done at load time, one tensor at a time on the host (``quantize``), so the bfloat16 model never exists
as a whole: each checkpoint tensor becomes integer values plus a small scale tensor and goes to its
device(s) as one ``QArray``. Activations, norms, biases, the attention and the KV cache stay in the
model dtype (W8A8, an option, quantizes the activations of the large products too).

Layout (for every quantizable parameter of ``weights.param_table``):

- the integer tensor has the parameter's own shape and logical axes (so it shards exactly as the
  float weight did); int4 for the Pallas kernel is stored packed two to a byte instead
  (``qmatmul.pack_int4``: ``[K / 2, N]`` int8, K the contracted inputs, N the outputs), on one device;
- the scale tensor has the same rank and axes: int8 puts size 1 on every contracted dimension (one
  scale per output channel); int4 replaces the *last* contracted dimension ``C`` by ``C // group``
  (one scale per group of ``group`` consecutive inputs of one output channel; for ``o_proj``, whose
  contracted dimensions are heads x head_dim, a group lies inside one head). The default group is 128
  (the GPTQ/AWQ convention); a dimension smaller than the group is one group. A size-1 or undivisible
  dimension of a scale is replicated by the sharding rules, the others are split with their weight's.

Symmetric, round to nearest: ``scale = max|w| / 127.5`` (int8, values in -128..127) or ``/ 7.5`` (int4,
-8..7), the largest magnitude rounding to the top value. The scales are stored in the model dtype.

The forward (``dense``) takes one of three paths per product, chosen at trace time:

- ``pallas``: the weight-only kernels of ``qmatmul.py``, which dequantize inside the matmul; selected
  automatically on a single GPU (``QuantSpec.kernel = "auto"``, ``resolved``), for every projection
  whose shape the kernel tiles;
- ``w8a8`` (``QuantSpec(activations="int8")``, int8 only): int8 activations with per-token scales for
  products of at least ``W8A8_MIN_ROWS`` rows (the refresh's full canvas), XLA's int8 matmul;
- ``xla``, the fallback and the CPU path: int8 multiplies the matmul's *output* by the per-channel scale
  (exact: the scale does not depend on the summed index); int4 forms ``values * scale`` in the einsum's
  input, which XLA materialises as a float weight before the matmul (``model_runtime/hlo.py`` reads
  the compiled program to tell).
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field, replace
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from model_runtime import qmatmul
from model_runtime.errors import InputError
from model_runtime.weights import ParamSpec

log = logging.getLogger(__name__)

MODES = ("int8", "int4")
# How products with quantized weights run: "auto" picks "pallas" on a single GPU and "xla" elsewhere
# (``resolved``); "interpret" runs the Pallas kernels through XLA on any backend (the CPU checks).
KERNELS = ("auto", "pallas", "xla", "interpret")
DEFAULT_GROUP = 128
# W8A8 applies from this many rows on: below it a product is bound by reading the weight, which int8
# activations do not shorten (the block step at batch 1 has 32 rows, the refresh at canvas 512 has 512).
W8A8_MIN_ROWS = 256
_QMAX = {"int8": 127, "int4": 7}
_QMIN = {"int8": -128, "int4": -8}
# The largest magnitude maps to qmax + 1/2, not qmax: the top bucket then covers [qmax - 1/2, qmax + 1/2)
# like every other one (the half-step bound qwix uses), a step 7% finer at int4 than amax / 7.
_BOUND = {"int8": 127.5, "int4": 7.5}
_NP_DTYPE = {"int8": np.dtype(np.int8), "int4": np.dtype(ml_dtypes.int4)}
_BITS = {"int8": 8, "int4": 4}


@dataclass(frozen=True)
class QuantSpec:
    """How to quantize a model: ``mode`` int8 or int4, the int4 ``group`` size, whether the embedding
    table is quantized too (off by default: it is only gathered from, so it costs memory but no
    bandwidth per step, and with an untied ``lm_head`` it plays no part in the matmuls), which matmul
    runs the products (``kernel``, one of ``KERNELS``) and whether the large products quantize their
    activations too (``activations="int8"``: W8A8, int8 weights only)."""

    mode: str
    group: int = DEFAULT_GROUP
    embedding: bool = False
    kernel: str = "auto"
    activations: str | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise InputError(f"quantize: expected one of {', '.join(MODES)}; got {self.mode!r}")
        if not isinstance(self.group, int) or self.group < 2 or self.group % 2:
            raise InputError(f"quantize group size must be an even integer >= 2, got {self.group!r}")
        if self.kernel not in KERNELS:
            raise InputError(f"quantize kernel: expected one of {', '.join(KERNELS)}; got {self.kernel!r}")
        if self.activations not in (None, "int8") or (self.activations and self.mode != "int8"):
            raise InputError(
                f"quantize activations: only int8 activations with int8 weights (W8A8); got "
                f"{self.activations!r} with {self.mode}"
            )

    def applies(self, spec: ParamSpec) -> bool:
        return spec.quantizable or (self.embedding and spec.is_embedding)

    def group_for(self, spec: ParamSpec) -> int:
        """The int4 group along the last contracted dimension: ``group``, or the whole dimension when
        it is smaller. A dimension that is not a multiple of the group is refused."""
        size = spec.shape[spec.contract[-1]]
        g = min(self.group, size)
        if size % g:
            raise InputError(
                f"quantize int4: {spec.name} has {size} inputs per channel, not a multiple of the "
                f"group size {g}"
            )
        return g

    def scale_shape(self, spec: ParamSpec) -> tuple[int, ...]:
        shape = list(spec.shape)
        if self.mode == "int8":
            for i in spec.contract:
                shape[i] = 1
        else:
            last = spec.contract[-1]
            shape[last] //= self.group_for(spec)
        return tuple(shape)

    def packs(self, spec: ParamSpec) -> bool:
        """Whether this parameter's int4 values are stored packed for the Pallas kernel: the kernel
        runs it, and its contracted dimensions lead (every projection and ``lm_head``; not the
        embedding, which is gathered from)."""
        if self.mode != "int4" or self.kernel not in ("pallas", "interpret"):
            return False
        k = int(np.prod([spec.shape[i] for i in spec.contract]))
        return spec.contract == tuple(range(len(spec.contract))) and (k // 2) % self.group_for(spec) == 0

    def stored_shape(self, spec: ParamSpec) -> tuple[int, ...]:
        """The shape of the integer tensor as stored: the parameter's, or ``[K / 2, N]`` packed."""
        if not self.packs(spec):
            return spec.shape
        k = int(np.prod(spec.shape[: len(spec.contract)]))
        return (k // 2, spec.size // k)

    def resolved(self, devices: int) -> QuantSpec:
        """``kernel="auto"`` made definite for a model on ``devices`` devices of the default backend:
        the Pallas kernels on one GPU where they compile (``kernels_compile``), XLA otherwise (CPU;
        TPU, where the kernels have not been measured; meshes, where a kernel has no sharding rule)."""
        if self.kernel != "auto":
            return self
        use = devices == 1 and jax.default_backend() == "gpu" and kernels_compile()
        return replace(self, kernel="pallas" if use else "xla")

    @property
    def np_dtype(self) -> np.dtype:
        return _NP_DTYPE[self.mode]

    @property
    def bits(self) -> int:
        return _BITS[self.mode]


def parse(mode: str | None, *, group: int = DEFAULT_GROUP, embedding: bool = False) -> QuantSpec | None:
    """``None``/``""``/``"none"`` -> no quantization; otherwise a validated QuantSpec."""
    if mode is None or mode in ("", "none"):
        return None
    return QuantSpec(str(mode), group=group, embedding=embedding)


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class QArray:
    """A quantized weight, one value: its integers (``values``, as stored: packed for the int4 kernel),
    its scales, and (static) how it was quantized and the parameter's own ``shape``."""

    values: Any  # jax.Array, or a host array before placement
    scale: Any
    spec: QuantSpec = field(metadata=dict(static=True))
    shape: tuple[int, ...] = field(metadata=dict(static=True))
    packed: bool = field(default=False, metadata=dict(static=True))

    def ints(self) -> jax.Array:
        """The integer values in the parameter's shape (unpacked)."""
        if not self.packed:
            return self.values
        return qmatmul.unpack_int4(self.values).reshape(self.shape)


Weight = jax.Array | QArray


def _quantize(w: Any, spec: ParamSpec, q: QuantSpec, dtype: Any, xp: Any) -> tuple[Any, Any]:
    """Quantize one weight with numpy (``xp=np``, on the host) or jax.numpy (on its device); float32
    working copy, scales stored in ``dtype``."""
    w = w.astype(xp.float32)
    if q.mode == "int8":
        amax = xp.max(xp.abs(w), axis=spec.contract, keepdims=True)
        grouped = w
    else:
        last = spec.contract[-1]
        g = q.group_for(spec)
        # [.., C, ..] -> [.., C/g, g, ..]: the group's inputs in a dimension of their own.
        grouped = w.reshape(w.shape[:last] + (w.shape[last] // g, g) + w.shape[last + 1 :])
        amax = xp.max(xp.abs(grouped), axis=last + 1, keepdims=True)
    # The values are rounded against the scale as it will be stored (model dtype), so the stored pair
    # reconstructs the weight as closely as that dtype allows.
    scale = xp.where(amax > 0, amax / _BOUND[q.mode], 1.0).astype(dtype).astype(xp.float32)
    values = xp.clip(xp.rint(grouped / scale), _QMIN[q.mode], _QMAX[q.mode])
    values = values.reshape(w.shape).astype(q.np_dtype)
    if q.mode == "int4":
        scale = xp.squeeze(scale, axis=spec.contract[-1] + 1)
    return values, scale.astype(dtype)


def quantize(w: np.ndarray, spec: ParamSpec, q: QuantSpec, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """One tensor in our layout -> (integer values, scales in ``dtype``), on the host.

    The float32 working copy is this tensor's only; the caller frees it before reading the next.
    """
    if np.issubdtype(w.dtype, np.integer):
        raise InputError(
            f"quantize {q.mode}: {spec.name} is already an integer tensor ({w.dtype}); "
            "load a floating-point checkpoint"
        )
    return _quantize(np.asarray(w), spec, q, dtype, np)


def quantize_device(w: jax.Array, spec: ParamSpec, q: QuantSpec) -> tuple[jax.Array, jax.Array]:
    """``quantize`` for a weight already on a device (our layout): same layout and rounding, done by
    XLA (whose ``amax / 127.5`` may differ in the last bit, so a channel's ``-amax`` can round to
    ``-127`` instead of ``-128``). For models that exist only in memory (random-weight benchmarks, a
    model just trained)."""
    return _quantize(w, spec, q, w.dtype, jnp)


def stored(values: Any, scale: Any, spec: ParamSpec, q: QuantSpec) -> QArray:
    """Integer values and scales in the parameter's layout (host or device arrays) -> the weight as the
    forward stores it (int4 packed two to a byte where the kernel runs it)."""
    packed = q.packs(spec)
    if packed:
        values = qmatmul.pack_int4(values.reshape(q.stored_shape(spec)[0] * 2, -1))
    return QArray(values, scale, q, spec.shape, packed)


def placeholder(spec: ParamSpec, q: QuantSpec, dtype: Any) -> QArray:
    """A quantized parameter of the right shapes and dtypes, for models built abstractly and loaded."""
    dt = np.int8 if q.packs(spec) else q.np_dtype
    return QArray(
        jnp.zeros(q.stored_shape(spec), dt),
        jnp.ones(q.scale_shape(spec), dtype),
        q,
        spec.shape,
        q.packs(spec),
    )


def dequantize(values: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Host-side inverse (float32), for tests and error measurements."""
    v = np.asarray(values, np.float32)
    s = np.asarray(scale, np.float32)
    for i, (a, b) in enumerate(zip(v.shape, s.shape, strict=True)):
        if b not in (1, a):  # the grouped dimension
            s = np.repeat(s, a // b, axis=i)
    return v * s


def tensor_bytes(shape: tuple[int, ...], bits: int) -> int:
    """Bytes of a tensor of ``bits``-bit elements as accelerators store it (int4: two per byte)."""
    return -(-int(np.prod(shape)) * bits // 8)


# -- the forward side --------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Product:
    """An einsum read as ``x2 [M, K] @ w2 [K, N]``: the permutation that brings ``x``'s kept dimensions
    first and its contracted ones last (in the weight's order), the sizes, and how many of the weight's
    dimensions are contracted (they lead)."""

    perm: tuple[int, ...]
    kept: tuple[int, ...]  # x's kept dimensions' sizes (the output's leading dimensions)
    k: int
    n: int
    contracted: int


def _product(subscripts: str, x_shape: tuple[int, ...], w_shape: tuple[int, ...]) -> _Product | None:
    """``subscripts`` as a plain ``[M, K] x [K, N]`` product, or None when the weight's contracted
    dimensions do not lead or the output is not x's kept dimensions then the weight's others."""
    lhs, rest = subscripts.replace(" ", "").split(",")
    rhs, out = rest.split("->")
    if "..." in lhs:
        fill = "ABCDEFGHIJ"[: len(x_shape) - (len(lhs) - 3)]
        lhs, out = lhs.replace("...", fill), out.replace("...", fill)
    contracted = [c for c in rhs if c in lhs]
    w_out = [c for c in rhs if c not in lhs]
    kept = [c for c in lhs if c not in contracted]
    if list(rhs) != contracted + w_out or list(out) != kept + w_out or len(lhs) != len(x_shape):
        return None
    return _Product(
        perm=tuple(lhs.index(c) for c in kept + contracted),
        kept=tuple(x_shape[lhs.index(c)] for c in kept),
        k=int(np.prod([x_shape[lhs.index(c)] for c in contracted])),
        n=int(np.prod(w_shape[len(contracted) :])),
        contracted=len(contracted),
    )


def dense(subscripts: str, x: jax.Array, w: Weight) -> jax.Array:
    """``einsum(subscripts, x, w)`` for a float weight or a quantized one (``QArray``).

    For a quantized weight whose contracted dimensions lead (all our projections), the product runs
    as ``[M, K] x [K, N]`` through W8A8 or the Pallas kernel when the weight asks for them and the
    shape allows; every other case takes XLA's path (``_xla_dense``).
    """
    if not isinstance(w, QArray):
        return jnp.einsum(subscripts, x, w)
    p = _product(subscripts, x.shape, w.shape)
    out = None if p is None else _fast_product(jnp.transpose(x, p.perm).reshape(-1, p.k), w, p)
    if p is None or out is None:
        return _xla_dense(subscripts, x, w)
    return out.reshape(p.kept + w.shape[p.contracted :])


def _fast_product(x2: jax.Array, w: QArray, p: _Product) -> jax.Array | None:
    """``x2 @ w`` through W8A8 or the kernel, or None where neither applies."""
    m, q = x2.shape[0], w.spec
    if q.activations == "int8" and m >= W8A8_MIN_ROWS:
        return qmatmul.w8a8_matmul(x2, w.values.reshape(p.k, p.n), w.scale.reshape(1, p.n))
    if q.kernel not in ("pallas", "interpret"):
        return None
    interpret = q.kernel == "interpret"
    if q.mode == "int8":
        t = qmatmul.tiling(m, p.k, p.n, mode="int8")
        values, scale = w.values.reshape(p.k, p.n), w.scale.reshape(1, p.n)
        return None if t is None else qmatmul.int8_matmul(x2, values, scale, t=t, interpret=interpret)
    if not w.packed:
        return None
    scale = w.scale.reshape(-1, p.n)  # [K / g, N]: the groups of one channel in order along K
    t = qmatmul.tiling(m, p.k, p.n, mode="int4", group=p.k // scale.shape[0])
    return None if t is None else qmatmul.int4_matmul(x2, w.values, scale, t=t, interpret=interpret)


def _xla_dense(subscripts: str, x: jax.Array, w: QArray) -> jax.Array:
    """XLA's path: per-channel scales (int8, or int4 with one group per channel) whose size-1
    contracted dimensions lead multiply the output, the integer weight converted to ``x.dtype`` inside
    the matmul; otherwise (int4 groups) ``values * scale`` is formed per group and fed to the einsum."""
    values, scale = w.ints(), w.scale
    k = next((i for i, n in enumerate(scale.shape) if n != 1), scale.ndim)
    if k >= 1 and scale.shape[k:] == values.shape[k:]:
        channel = scale.reshape(scale.shape[k:])
        return jnp.einsum(subscripts, x, values.astype(x.dtype)) * channel.astype(x.dtype)
    return jnp.einsum(subscripts, x, dequantize_jax(values, scale, x.dtype))


def dequantize_jax(w: jax.Array, scale: jax.Array, dtype: Any) -> jax.Array:
    """``values * scale`` in ``dtype`` with the scale broadcast over its channel or group."""
    dim = _grouped_dim(w.shape, scale.shape)
    if dim is None:
        return w.astype(dtype) * scale.astype(dtype)
    n = scale.shape[dim]
    split = w.shape[:dim] + (n, w.shape[dim] // n) + w.shape[dim + 1 :]
    out = w.reshape(split).astype(dtype) * jnp.expand_dims(scale.astype(dtype), dim + 1)
    return out.reshape(w.shape)


def _grouped_dim(w_shape: tuple[int, ...], s_shape: tuple[int, ...]) -> int | None:
    """The dimension an int4 scale groups (smaller than the weight's but not 1), else None (int8)."""
    for i, (a, b) in enumerate(zip(w_shape, s_shape, strict=True)):
        if b != a and b != 1:
            return i
    return None


@functools.cache
def kernels_compile() -> bool:
    """Whether the Pallas kernels compile on the default backend (checked once per process, on a small
    int8 and int4 product): a JAX or driver without a working Triton lowering falls back to XLA with a
    warning instead of failing every quantized program."""
    x = jnp.zeros((16, 256), jnp.bfloat16)
    try:
        t8 = qmatmul.tiling(16, 256, 256, mode="int8")
        t4 = qmatmul.tiling(16, 256, 256, mode="int4", group=128)
        assert t8 is not None and t4 is not None
        int8 = jax.jit(functools.partial(qmatmul.int8_matmul, t=t8))
        int4 = jax.jit(functools.partial(qmatmul.int4_matmul, t=t4))
        int8.lower(x, jnp.zeros((256, 256), jnp.int8), jnp.ones((1, 256), jnp.bfloat16)).compile()
        int4.lower(x, jnp.zeros((128, 256), jnp.int8), jnp.ones((2, 256), jnp.bfloat16)).compile()
    except Exception as exc:  # any lowering or compiler failure means: use XLA's path
        log.warning("quantized matmul kernels unavailable on %s, using XLA: %s", jax.default_backend(), exc)
        return False
    return True
