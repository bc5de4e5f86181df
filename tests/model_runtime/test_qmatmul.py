"""The weight-only int8 / int4 Pallas kernels (``qmatmul.py``) in interpret mode against XLA's einsum path,
for every quantized weight shape of DiffuCoder-7B and of the bundled model, and W8A8.

Interpret mode runs the kernel body with XLA on the CPU, so the 7B's full widths would take minutes: each
7B product runs on a slice of its output columns with the tiling chosen for the *full* shape (the test
asserts that tiling covers the whole weight), at the block step's 32 rows; the bundled model's weights
run whole.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax import export

from model_runtime import qmatmul, quant
from model_runtime.bundled import bundled_model_dir
from model_runtime.config import DIFFUCODER_7B, DreamConfig
from model_runtime.model import DreamModel
from model_runtime.weights import ParamSpec, by_path

CONFIGS = {
    "7b": DreamConfig.from_dict(DIFFUCODER_7B),
    "bundled": DreamConfig.from_dict(json.loads((Path(bundled_model_dir()) / "config.json").read_text())),
}
NAMES = ("q_kernel", "k_kernel", "v_kernel", "o_kernel", "gate_kernel", "up_kernel", "down_kernel", "lm_head")
# The rows the decoders multiply: block step (batch x 32) and refresh (batch x canvas), batch 1, 8, 32.
ROWS = (32, 256, 1024, 512, 4096, 16384)
SLICE_TILES = 2  # output tiles a 7B product runs on


def weight_specs(cfg: DreamConfig) -> list[ParamSpec]:
    table = by_path(cfg)
    return [table[p] for p in table if p[-1] in NAMES and p[:2] in (("layers", 0), ("lm_head",))]


def as_matrix(spec: ParamSpec) -> tuple[int, int]:
    """(K, N): contracted inputs, outputs."""
    k = int(np.prod([spec.shape[i] for i in spec.contract]))
    return k, spec.size // k


def test_both_models_have_every_weight_shape_listed() -> None:
    for cfg in CONFIGS.values():
        assert sorted(str(s.path[-1]) for s in weight_specs(cfg)) == sorted(NAMES)
    assert {as_matrix(s) for s in weight_specs(CONFIGS["7b"])} == {
        (3584, 3584), (3584, 512), (3584, 18944), (18944, 3584), (3584, 152064)
    }  # fmt: skip


@pytest.mark.parametrize("model", sorted(CONFIGS))
@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_tiling_covers_every_weight_at_the_decoders_row_counts(model: str, mode: str) -> None:
    cfg = CONFIGS[model]
    q = quant.QuantSpec(mode, kernel="pallas")
    for spec in weight_specs(cfg):
        k, n = as_matrix(spec)
        group = q.group_for(spec) if mode == "int4" else None
        assert mode == "int8" or q.packs(spec), spec.name
        for m in ROWS:
            t = qmatmul.tiling(m, k, n, mode=mode, group=group)
            assert t is not None, (spec.name, m)
            splits, cols, row_tiles = t.grid(n)
            stored = k // 2 if mode == "int4" else k
            assert cols * t.bn == n and row_tiles * t.bm == t.rows >= m > t.rows - t.bm, (spec.name, m, t)
            assert splits * t.k_rows == stored and t.steps * t.bk == t.k_rows, (spec.name, m, t)
            # Triton's loads are power-of-two sized and its dots at least 16 wide.
            for b in (t.bm, t.bn, t.bk):
                assert b >= 16 and b & (b - 1) == 0, (spec.name, m, t)
            if mode == "int4":
                assert t.bk == group  # one group per inner step
            if m <= 32 and model == "7b":
                # Memory-bound: the block step spreads every weight over enough programs (k_proj and
                # v_proj, 512 outputs wide, are the smallest).
                assert t.programs(n) >= 32, (spec.name, t)


def _stored(w: np.ndarray, spec: ParamSpec, mode: str, group: int, kernel: str) -> quant.QArray:
    """``w`` quantized by the loader's rules and stored as ``kernel`` stores it, on the device."""
    q = quant.QuantSpec(mode, group=group, kernel=kernel)
    values, scale = quant.quantize(w, spec, q, np.dtype(np.float32))
    qa = quant.stored(values, scale, spec, q)
    return dataclasses.replace(qa, values=jnp.asarray(qa.values), scale=jnp.asarray(qa.scale))


def _matrix_spec(k: int, n: int) -> ParamSpec:
    return ParamSpec("w", ("w",), (k, n), (k, n), ("embed", "mlp"), lambda a: a, lambda a: a, contract=(0,))


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_kernels_match_the_einsum_path_on_every_7b_shape(mode: str) -> None:
    """Full K, a slice of N run with the full shape's tiling; float32 and bfloat16 activations."""
    rng = np.random.default_rng(0)
    m = 32  # the block step at batch 1
    seen = set()
    for spec in weight_specs(CONFIGS["7b"]):
        k, n = as_matrix(spec)
        if (k, n) in seen:
            continue
        seen.add((k, n))
        group = quant.QuantSpec(mode).group_for(spec) if mode == "int4" else quant.DEFAULT_GROUP
        t = qmatmul.tiling(m, k, n, mode=mode, group=group)
        assert t is not None
        cols = SLICE_TILES * t.bn
        w = (rng.standard_normal((k, cols)) * 0.02).astype(np.float32)
        kernel, xla = (_stored(w, _matrix_spec(k, cols), mode, group, impl) for impl in ("interpret", "xla"))
        assert kernel.packed == (mode == "int4") and not xla.packed
        x32 = rng.standard_normal((m, k)).astype(np.float32)
        for dtype, tol in ((jnp.float32, 1e-5), (jnp.bfloat16, 2e-2)):
            x = jnp.asarray(x32, dtype)
            want = np.asarray(quant.dense("mk,kn->mn", x, xla), np.float32)
            if mode == "int8":
                got = qmatmul.int8_matmul(x, kernel.values, kernel.scale, t=t, interpret=True)
            else:
                got = qmatmul.int4_matmul(x, kernel.values, kernel.scale, t=t, interpret=True)
            assert got.dtype == dtype and got.shape == (m, cols)
            diff = np.abs(np.asarray(got, np.float32) - want).max() / np.abs(want).max()
            assert diff <= tol, (spec.name, dtype, diff)
            if dtype == jnp.float32:
                # The quantized product is the float one within the quantization's own rounding: each
                # weight is off by at most half its step, so each output by at most |x| @ (step / 2).
                half_step = quant.dequantize(np.ones((k, cols), np.int8), np.asarray(xla.scale)) / 2
                assert np.all(np.abs(np.asarray(got) - x32 @ w) <= np.abs(x32) @ half_step + 1e-4)


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_bundled_model_weights_whole_through_the_model_einsums(mode: str) -> None:
    """Every bundled weight in its own layout and einsum (``[D, H, E]`` q, ``[H, E, D]`` o, ...), at the
    block step's and a refresh's row counts: the kernel path equals XLA's."""
    cfg = CONFIGS["bundled"]
    subscripts = {
        "q_kernel": ("bld,dhe->blhe", "d"), "k_kernel": ("bld,dke->blke", "d"),
        "v_kernel": ("bld,dke->blke", "d"), "o_kernel": ("bhle,hed->bld", "he"),
        "gate_kernel": ("bld,df->blf", "d"), "up_kernel": ("bld,df->blf", "d"),
        "down_kernel": ("blf,fd->bld", "f"), "lm_head": ("...d,dv->...v", "d"),
    }  # fmt: skip
    rng = np.random.default_rng(1)
    q = quant.QuantSpec(mode)
    for spec in weight_specs(cfg):
        eq, _ = subscripts[str(spec.path[-1])]
        w = (rng.standard_normal(spec.shape) * 0.02).astype(np.float32)
        group = q.group_for(spec)
        kernel, xla = (_stored(w, spec, mode, group, impl) for impl in ("interpret", "xla"))
        assert kernel.packed == (mode == "int4")
        # The block step's rows for every weight; for the MLP's also a refresh's (128-row tiles) and a
        # count no tile divides (20 rows, padded to 32).
        for rows in (32, 128, 20) if spec.path[-1] == "gate_kernel" else (32,):
            if spec.path[-1] == "o_kernel":  # attention output: heads before positions
                x = rng.standard_normal((1, cfg.num_attention_heads, rows, cfg.head_dim))
            else:
                x = rng.standard_normal((1, rows, spec.shape[0]))
            x = jnp.asarray(x, jnp.float32)
            want = np.asarray(quant.dense(eq, x, xla))
            got = np.asarray(quant.dense(eq, x, kernel))
            assert got.shape == want.shape == np.einsum(eq, np.asarray(x), w).shape
            assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max(), (spec.name, rows)


def test_shapes_the_kernel_cannot_tile_take_xlas_path() -> None:
    """An output width that is not a multiple of 16, or an int4 group below 16: no tiling, and
    ``quant.dense`` still gives the right product (XLA's path)."""
    assert qmatmul.tiling(32, 256, 200, mode="int8") is None
    assert qmatmul.tiling(32, 256, 256, mode="int4", group=8) is None
    rng = np.random.default_rng(2)
    w = (rng.standard_normal((256, 200)) * 0.02).astype(np.float32)
    kernel = _stored(w, _matrix_spec(256, 200), "int8", 128, "interpret")
    xla = _stored(w, _matrix_spec(256, 200), "int8", 128, "xla")
    x = jnp.asarray(rng.standard_normal((4, 256)), jnp.float32)
    np.testing.assert_array_equal(quant.dense("mk,kn->mn", x, kernel), quant.dense("mk,kn->mn", x, xla))


def test_int4_packing_round_trips_and_is_half_the_bytes() -> None:
    values = np.random.default_rng(3).integers(-8, 8, (256, 48)).astype(np.int8)
    packed = qmatmul.pack_int4(values)
    assert packed.dtype == np.int8 and packed.shape == (128, 48)
    np.testing.assert_array_equal(np.asarray(qmatmul.unpack_int4(jnp.asarray(packed))), values)
    np.testing.assert_array_equal(np.asarray(qmatmul.pack_int4(jnp.asarray(values))), packed)


def test_auto_kernel_is_xla_on_cpu_and_on_meshes() -> None:
    """``auto`` resolves to XLA's path here (a CPU) and on any mesh; an explicit choice stays."""
    assert jax.default_backend() == "cpu"
    assert quant.QuantSpec("int4").resolved(1).kernel == "xla"
    assert quant.QuantSpec("int8").resolved(8).kernel == "xla"
    assert quant.QuantSpec("int8", kernel="pallas").resolved(1).kernel == "pallas"
    with pytest.raises(quant.InputError, match="only int8 activations with int8 weights"):
        quant.QuantSpec("int4", activations="int8")
    with pytest.raises(quant.InputError, match="kernel: expected one of"):
        quant.QuantSpec("int8", kernel="cuda")


def test_w8a8_is_used_from_256_rows_and_stays_close_to_weight_only() -> None:
    rng = np.random.default_rng(4)
    k, n = 512, 256
    w = (rng.standard_normal((k, n)) * 0.02).astype(np.float32)
    spec = _matrix_spec(k, n)
    q = quant.QuantSpec("int8", activations="int8", kernel="xla")
    values, scale = quant.quantize(w, spec, q, np.dtype(np.float32))
    w8a8 = quant.stored(jnp.asarray(values), jnp.asarray(scale), spec, q)
    w8 = dataclasses.replace(w8a8, spec=quant.QuantSpec("int8", kernel="xla"))
    for rows, int8_dot in ((32, False), (quant.W8A8_MIN_ROWS, True)):
        x = jnp.asarray(rng.standard_normal((rows, k)), jnp.float32)
        text = jax.jit(lambda x: quant.dense("mk,kn->mn", x, w8a8)).lower(x).as_text()
        assert ("xi32>" in text) == int8_dot, rows  # the int8 x int8 -> int32 product
        a, b = np.asarray(quant.dense("mk,kn->mn", x, w8a8)), np.asarray(quant.dense("mk,kn->mn", x, w8))
        # Per-token int8 activations: about 0.4% of a row's largest value per element.
        assert np.abs(a - b).max() <= (0.02 if int8_dot else 0.0) * np.abs(b).max(), rows


TRITON = "__gpu$xla.gpu.triton"


def _lower_for_gpu(f: Callable[..., Any], *args: Any) -> str:
    """The StableHLO ``f`` lowers to for a CUDA GPU, from this CPU-only machine: Pallas's Triton backend
    runs here (its checks: power-of-two loads, supported ops, block shapes); only compiling the Triton
    IR to GPU code is left for a device."""
    disabled = [export.DisabledSafetyCheck.custom_call(TRITON)]
    return export.export(jax.jit(f), platforms=["cuda"], disabled_checks=disabled)(*args).mlir_module()


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_kernels_lower_through_triton_for_every_7b_shape(mode: str) -> None:
    seen = set()
    for spec in weight_specs(CONFIGS["7b"]):
        k, n = as_matrix(spec)
        if (k, n) in seen:
            continue
        seen.add((k, n))
        group = quant.QuantSpec(mode).group_for(spec)
        for m in (32, 512):  # the block step's rows, the refresh's
            t = qmatmul.tiling(m, k, n, mode=mode, group=group)
            assert t is not None
            x = jax.ShapeDtypeStruct((m, k), jnp.bfloat16)
            if mode == "int8":
                w = (jax.ShapeDtypeStruct((k, n), jnp.int8), jax.ShapeDtypeStruct((1, n), jnp.bfloat16))
                f = functools.partial(qmatmul.int8_matmul, t=t)
            else:
                w = (
                    jax.ShapeDtypeStruct((k // 2, n), jnp.int8),
                    jax.ShapeDtypeStruct((k // group, n), jnp.bfloat16),
                )
                f = functools.partial(qmatmul.int4_matmul, t=t)
            text = _lower_for_gpu(f, x, *w)
            assert text.count(TRITON) == 1, (spec.name, m)


def test_a_quantized_model_lowers_with_one_kernel_per_projection_for_gpu() -> None:
    """The whole forward of a small model with ``kernel="pallas"``, lowered for a GPU: every projection
    and ``lm_head`` is a Triton kernel call and no weight is dequantized by XLA."""
    cfg = dataclasses.replace(CONFIGS["bundled"], num_hidden_layers=2)  # each layer lowers alike
    for mode in ("int8", "int4"):
        q = quant.QuantSpec(mode, kernel="pallas")
        abstract = nnx.eval_shape(lambda q=q: DreamModel(cfg, dtype=jnp.bfloat16, rngs=nnx.Rngs(0), quant=q))
        graphdef, state = nnx.split(abstract)
        ids = jax.ShapeDtypeStruct((1, 32), jnp.int32)
        text = _lower_for_gpu(lambda s, x, g=graphdef: nnx.merge(g, s)(x), state, ids)
        per_layer = 7  # q, k, v, o, gate, up, down
        assert text.count(TRITON) == per_layer * cfg.num_hidden_layers + 1, mode
