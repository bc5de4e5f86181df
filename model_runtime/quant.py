"""Weight-only quantization: int8 with per-output-channel scales, int4 with group-wise scales.

Done at load time, one tensor at a time on the host (``quantize``), so the bfloat16 model never exists
as a whole: each checkpoint tensor becomes integer values plus a small scale tensor and goes to its
device(s). Activations, norms, biases, the attention and the KV cache stay in the model dtype.

Layout (for every quantizable parameter of ``weights.param_table``):

- the integer tensor has the parameter's own shape and logical axes (so it shards exactly as the
  float weight did);
- the scale tensor has the same rank and axes: int8 puts size 1 on every contracted dimension (one
  scale per output channel); int4 replaces the *last* contracted dimension ``C`` by ``C // group``
  (one scale per group of ``group`` consecutive inputs of one output channel; for ``o_proj``, whose
  contracted dimensions are heads x head_dim, a group lies inside one head). The default group is 128
  (the GPTQ/AWQ convention); a dimension smaller than the group is one group. A size-1 or undivisible
  dimension of a scale is replicated by the sharding rules, the others are split with their weight's.

Symmetric, round to nearest: ``scale = max|w| / 127.5`` (int8, values in -128..127) or ``/ 7.5`` (int4,
-8..7), the largest magnitude rounding to the top value. The
scales are stored in the model dtype. In the forward, int8 multiplies the matmul's *output* by the
per-channel scale (exact: the scale does not depend on the summed index); int4 dequantizes
``values * scale`` in the einsum's input and relies on XLA fusing that into the matmul
(``scripts/quant_gpu_check.py`` checks the compiled program).
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from model_runtime.errors import InputError
from model_runtime.weights import ParamSpec

MODES = ("int8", "int4")
DEFAULT_GROUP = 128
_QMAX = {"int8": 127, "int4": 7}
_QMIN = {"int8": -128, "int4": -8}
# The largest magnitude maps to qmax + 1/2, not qmax: the top bucket then covers [qmax - 1/2, qmax + 1/2)
# like every other one (the half-step bound qwix uses), a step 7% finer at int4 than amax / 7.
_BOUND = {"int8": 127.5, "int4": 7.5}
_NP_DTYPE = {"int8": np.dtype(np.int8), "int4": np.dtype(ml_dtypes.int4)}
_BITS = {"int8": 8, "int4": 4}


@dataclass(frozen=True)
class QuantSpec:
    """How to quantize a model: ``mode`` int8 or int4, the int4 ``group`` size, and whether the
    embedding table is quantized too (off by default: it is only gathered from, so it costs memory but
    no bandwidth per step, and with an untied ``lm_head`` it plays no part in the matmuls)."""

    mode: str
    group: int = DEFAULT_GROUP
    embedding: bool = False

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise InputError(f"quantize: expected one of {', '.join(MODES)}; got {self.mode!r}")
        if not isinstance(self.group, int) or self.group < 2 or self.group % 2:
            raise InputError(f"quantize group size must be an even integer >= 2, got {self.group!r}")

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


def quantize(w: np.ndarray, spec: ParamSpec, q: QuantSpec, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """One tensor in our layout -> (integer values, scales in ``dtype``), on the host.

    The float32 working copy is this tensor's only; the caller frees it before reading the next.
    """
    if np.issubdtype(w.dtype, np.integer):
        raise InputError(
            f"quantize {q.mode}: {spec.name} is already an integer tensor ({w.dtype}); "
            "load a floating-point checkpoint"
        )
    w = np.asarray(w, np.float32)
    if q.mode == "int8":
        amax = np.max(np.abs(w), axis=spec.contract, keepdims=True)
        grouped = w
    else:
        last = spec.contract[-1]
        g = q.group_for(spec)
        # [.., C, ..] -> [.., C/g, g, ..]: the group's inputs in a dimension of their own.
        grouped = w.reshape(w.shape[:last] + (w.shape[last] // g, g) + w.shape[last + 1 :])
        amax = np.max(np.abs(grouped), axis=last + 1, keepdims=True)
    scale = np.where(amax > 0, amax / _BOUND[q.mode], 1.0).astype(np.float32)
    # The values are rounded against the scale as it will be stored (model dtype), so the stored pair
    # reconstructs the weight as closely as that dtype allows.
    scale = scale.astype(dtype).astype(np.float32)
    values = np.clip(np.rint(grouped / scale), _QMIN[q.mode], _QMAX[q.mode])
    values = values.reshape(w.shape).astype(q.np_dtype)
    if q.mode == "int4":
        scale = np.squeeze(scale, axis=spec.contract[-1] + 1)
    return values, scale.astype(dtype)


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


# -- the forward side (JAX) --------------------------------------------------------------------------


def dense(subscripts: str, x, w, scale=None):
    """``einsum(subscripts, x, w)`` for a float weight, or for quantized ``w`` with its ``scale``.

    ``subscripts`` must put the weight's output dimensions last in the result (all our projections
    do), in the weight's order. Per-channel scales (int8, or int4 with one group per channel) whose
    size-1 contracted dimensions lead: the integer weight is converted to ``x.dtype`` inside the
    matmul and the output is multiplied by the scale. Otherwise (int4 groups): ``values * scale`` is
    formed per group and fed to the same einsum.
    """
    import jax.numpy as jnp

    if scale is None:
        return jnp.einsum(subscripts, x, w)
    k = next((i for i, n in enumerate(scale.shape) if n != 1), scale.ndim)
    if k >= 1 and scale.shape[k:] == w.shape[k:]:
        # One scale per output channel, and the contracted dimensions lead (every projection of ours):
        # scale the matmul's output, so the weight only needs a convert on its way into the dot.
        channel = scale.reshape(scale.shape[k:])
        return jnp.einsum(subscripts, x, w.astype(x.dtype)) * channel.astype(x.dtype)
    return jnp.einsum(subscripts, x, dequantize_jax(w, scale, x.dtype))


def dequantize_jax(w, scale, dtype):
    """``values * scale`` in ``dtype`` with the scale broadcast over its channel or group."""
    import jax.numpy as jnp

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


def quantize_device(w, spec: ParamSpec, q: QuantSpec):
    """``quantize`` for a weight already on a device (our layout): same layout and rounding, done by
    XLA (whose ``amax / 127.5`` may differ in the last bit, so a channel's ``-amax`` can round to
    ``-127`` instead of ``-128``). For models that exist only in memory (random-weight benchmarks, a
    model just trained)."""
    import jax.numpy as jnp

    dtype = w.dtype
    w32 = w.astype(jnp.float32)
    if q.mode == "int8":
        grouped = w32
        amax = jnp.max(jnp.abs(w32), axis=spec.contract, keepdims=True)
    else:
        last = spec.contract[-1]
        g = q.group_for(spec)
        grouped = w32.reshape(w.shape[:last] + (w.shape[last] // g, g) + w.shape[last + 1 :])
        amax = jnp.max(jnp.abs(grouped), axis=last + 1, keepdims=True)
    scale = jnp.where(amax > 0, amax / _BOUND[q.mode], 1.0).astype(dtype).astype(jnp.float32)
    values = jnp.clip(jnp.rint(grouped / scale), _QMIN[q.mode], _QMAX[q.mode])
    values = values.reshape(w.shape).astype(q.np_dtype)
    if q.mode == "int4":
        scale = jnp.squeeze(scale, axis=spec.contract[-1] + 1)
    return values, scale.astype(dtype)


def quantize_state(state, cfg, q: QuantSpec, *, delete: bool = True):
    """A float model's NNX state -> (graphdef, state) of the same model quantized, tensor by tensor on
    its devices (each float weight is deleted once quantized when ``delete``, so the peak is one tensor
    above the quantized model plus the float remainder)."""
    import jax
    from flax import nnx

    from model_runtime.model import DreamModel
    from model_runtime.weights import by_path

    dtype = jax.tree.leaves(state)[0].dtype
    abstract = nnx.eval_shape(lambda: DreamModel(cfg, dtype=dtype, rngs=nnx.Rngs(0), quant=q))
    graphdef, out_state = nnx.split(abstract)
    src, out = nnx.to_pure_dict(state), nnx.to_pure_dict(out_state)
    fns: dict = {}
    for path, spec in by_path(cfg).items():
        s, o = src, out
        for part in path[:-1]:
            s, o = s[part], o[part]
        leaf = path[-1]
        w = s[leaf]
        if q.applies(spec):
            key = (spec.shape, spec.contract, str(w.dtype))
            fn = fns.setdefault(key, jax.jit(lambda w, spec=spec: quantize_device(w, spec, q)))
            o[leaf], o[str(leaf) + "_scale"] = fn(w)
            if delete:
                jax.block_until_ready(o[leaf])
                w.delete()
        else:
            o[leaf] = w
    nnx.replace_by_pure_dict(out_state, out)
    return graphdef, out_state
