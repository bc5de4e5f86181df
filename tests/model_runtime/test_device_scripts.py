"""The accelerator-only scripts in their tiny modes, on the CPU: ``scripts/device_check.py --small``,
``scripts/bench_7b_shapes.py --check`` and ``scripts/quant_gpu_check.py --small``.

Nothing else runs these scripts between device runs, so a change to the runtime that breaks one (the
fast decoder's programs taking new arguments, donating their caches) must break a test here, not the
next hour on an accelerator. The figures of a tiny model on a CPU mean nothing: the tests check that
every part ran and wrote what the docs say it writes. The three scripts share one tiny model
(``random_weights.small_config``), so with the session's persistent compilation cache most programs
compile once.

Also here: the HLO reader (``model_runtime/hlo.py``) that gives the device check its fusion verdicts.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from model_runtime import bench, hlo, quant
from model_runtime.weights import ParamSpec
from scripts import bench_7b_shapes, device_check, quant_gpu_check


def test_device_check_small_runs_every_part_and_writes_json_and_table(tmp_path: Path) -> None:
    assert device_check.main(["--small", "--out", str(tmp_path), "--hlo-dir", str(tmp_path / "hlo")]) == 0
    result = json.loads((tmp_path / "device_check.json").read_text())
    assert result["errors"] == [] and result["skipped"] == []
    assert result["settings"]["small"] and result["settings"]["batches"] == [1, 2]
    assert set(result["ceilings"]) == {"matmul_tflops", "copy_gbytes_per_s"}
    assert list(result["modes"]) == ["bf16", "int8", "int4", "w8a8"]
    for mode, r in result["modes"].items():
        assert r["build"]["weight_bytes"] > 0
        p = r["parts"]
        assert p["forward_ms"] > 0 and p["refresh_ms"] > 0 and p["block_step_ms"] > 0
        assert 1 <= p["block_forwards"] <= p["block_length"] == 16 and p["canvas"] == 32
        assert r["generation"]["fast"]["tokens_per_second"] > 0
        if mode == "bf16":
            assert r["batch"]["2"]["batch"] == 2 and r["batch"]["2"]["tokens_per_second"] > 0
            assert r["generation"]["reference"]["forwards"] == 16  # one token per step
            assert r["build"]["kernel"] is None and "fusion" not in r
            continue
        # The quantized runtimes: int4 through the Pallas kernels (interpret mode), the others XLA.
        assert r["build"]["kernel"] == ("interpret" if mode == "int4" else "xla")
        assert r["build"]["weight_bytes"] < result["modes"]["bf16"]["build"]["weight_bytes"]
        for kind in ("refresh", "block"):
            assert r["fusion"][kind]["verdict"].split(":")[0] in ("FUSED", "NOT FUSED", "INCONCLUSIVE")
            assert (tmp_path / "hlo" / f"{kind}_{mode}.hlo.txt").stat().st_size > 1000
        agree = r["agreement"]["fast"]
        assert 0.0 <= agree["token_agree"] <= 1.0 and agree["of"] == 1
    k = result["kernels"]
    assert [row["m"] for row in k] == [16, 256]  # the block step's rows and (W8A8's least) a refresh's
    assert all(row["int4_kernel_ms"] > 0 and row["int8_xla_ms"] > 0 for row in k) and "w8a8_xla_ms" in k[1]
    modeled = {(r["mode"], r["decoder"]) for r in result["cost_model"]}
    assert modeled == {("bf16", "reference"), ("bf16", "sliding")} | {(m, "fast") for m in result["modes"]}
    for r in result["cost_model"]:
        assert r["modeled_tpf1"] < r["modeled_tpf2"] < r["modeled_tpf3"] and r["measured"] > 0
    targets = {(t["figure"], t["mode"]): t for t in result["targets"]}
    assert targets[("block step vs bf16", "int8")]["value"] == (
        result["modes"]["int8"]["parts"]["block_step_ms"] / result["modes"]["bf16"]["parts"]["block_step_ms"]
    )
    table = (tmp_path / "device_check.md").read_text()
    assert "SMALL MODE" in table and "| figure | bf16 | int8 | int4 | w8a8 |" in table
    for line in ("| block step vs bf16 | int8 | <= 0.6 |", "| fast tokens/s at batch 2 |", "Cost model"):
        assert line in table


def test_device_check_skips_what_the_budget_does_not_allow(tmp_path: Path) -> None:
    """A part whose estimate exceeds the time left is skipped and named; a failing part is recorded and
    the run goes on; the files are written after each."""
    check = device_check.Check(tmp_path, 5.0, device_check.setup(small=False), ["bf16"])
    check.part(("ceilings",), 10, lambda: 1 / 0)
    assert check.result["skipped"] == ["ceilings: 5 s left, about 10 s needed"] and not check.result["errors"]
    check.part(("ceilings",), 1, lambda: 1 / 0)
    error = check.result["errors"][0]
    assert error["part"] == "ceilings" and error["error"].startswith("ZeroDivisionError")
    check.part(("modes", "bf16", "parts"), 1, lambda: {"forward_ms": 2.0})
    written = json.loads((tmp_path / "device_check.json").read_text())
    assert written["errors"][0]["part"] == "ceilings" and written["modes"]["bf16"]["parts"]["forward_ms"] == 2
    table = (tmp_path / "device_check.md").read_text()
    assert "- ceilings: ZeroDivisionError" in table and "| forward ms | 2 |" in table


def test_bench_7b_shapes_check(tmp_path: Path) -> None:
    out = tmp_path / "b7.json"
    assert bench_7b_shapes.main(["--check", "--repeat", "1", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert [f["length"] for f in r["forward"]] == [32, 64] and all(f["floor_ms"] > 0 for f in r["forward"])
    assert r["fast_parts"]["block_step_ms"] > 0 and r["fast_parts"]["canvas"] == 32
    assert [g["decoder"] for g in r["generation"]] == [c.name for c in bench.DECODERS]
    for g in r["generation"]:
        assert g["tokens_per_second"] > 0 and set(g["modeled_tokens_per_second"]) >= {"1", "2", "3"}


def test_quant_gpu_check_small(tmp_path: Path) -> None:
    out = tmp_path / "q.json"
    assert (
        quant_gpu_check.main(["--small", "--repeat", "1", "--json", str(out), "--hlo-dir", str(tmp_path)])
        == 0
    )
    r = json.loads(out.read_text())
    assert set(r["hlo"]) == {f"{what}_{m}" for what in ("projection", "forward") for m in quant.MODES}
    assert [t["mode"] for t in r["timings"]] == ["bf16", "int8", "int4"]
    for row in r["timings"][1:]:
        assert row["weight_bytes_vs_bf16"] < 0.8 and "verdict" in row["block_hlo"]
    # On a CPU XLA converts each integer weight to float in a fusion of its own before the matmul.
    assert r["hlo"]["projection_int4"]["verdict"].startswith("NOT FUSED")
    assert (tmp_path / "block_int4.hlo.txt").is_file()


# -- the HLO reader ---------------------------------------------------------------------------------------

# Optimized-HLO shapes of the three cases, as XLA's GPU backend prints them (one instruction a line).
_W, _X, _OUT = "s8[3584,18944]{1,0}", "bf16[32,3584]{1,0}", "bf16[32,18944]{1,0}"
_FUSED = f"""HloModule m

%fused_computation (param_0: s8[3584,18944], param_1: bf16[32,3584]) -> bf16[32,18944] {{
  %param_0 = {_W} parameter(0)
  %convert.1 = bf16[3584,18944]{{1,0}} convert({_W} %param_0)
  %param_1 = {_X} parameter(1)
  ROOT %dot.1 = {_OUT} dot({_X} %param_1, bf16[3584,18944]{{1,0}} %convert.1)
}}

ENTRY %main (p0: s8[3584,18944], p1: bf16[32,3584]) -> bf16[32,18944] {{
  %p0 = {_W} parameter(0)
  %p1 = {_X} parameter(1)
  ROOT %fusion = {_OUT} fusion({_W} %p0, {_X} %p1), kind=kCustom, calls=%fused_computation
}}
"""
_MATERIALIZED = f"""HloModule m

ENTRY %main (p0: s8[3584,18944], p1: bf16[32,3584]) -> bf16[32,18944] {{
  %p0 = {_W} parameter(0)
  %p1 = {_X} parameter(1)
  %convert = bf16[3584,18944]{{1,0}} convert({_W} %p0)
  ROOT %cc = {_OUT} custom-call({_X} %p1, bf16[3584,18944]{{1,0}} %convert), custom_call_target="gemm"
}}
"""
_KERNEL = f"""HloModule m

ENTRY %main (p0: s8[3584,18944], p1: bf16[32,3584], p2: bf16[1,18944]) -> bf16[32,18944] {{
  %p0 = {_W} parameter(0)
  %p1 = {_X} parameter(1)
  %p2 = bf16[1,18944]{{1,0}} parameter(2)
  ROOT %cc = {_OUT} custom-call({_X} %p1, {_W} %p0, %p2), custom_call_target="__gpu$xla.gpu.triton"
}}
"""


def test_fusion_verdicts_on_gpu_shaped_hlo() -> None:
    shape = {(3584, 18944)}
    assert hlo.fusion_verdict(_FUSED, shape)["verdict"].startswith("FUSED: the integer weight is converted")
    materialized = hlo.fusion_verdict(_MATERIALIZED, shape)
    assert not materialized["fused"] and materialized["materialized_weight_buffers"] == [
        "main: convert = bf16[3584, 18944] convert"
    ]
    kernel = hlo.fusion_verdict(_KERNEL, shape)
    assert kernel["fused"] and kernel["verdict"] == "FUSED: 1 Pallas kernel calls read the integer weights"
    # A float tensor of another shape made from integers is not a weight (a KV cache, say).
    assert hlo.fusion_verdict(_MATERIALIZED, {(3584, 512)})["materialized_weight_buffers"] == []


def test_fusion_verdict_on_this_cpus_int4_product() -> None:
    """XLA's own int4 path on a CPU: ``values * scale`` is a float weight made before the matmul."""
    k, n = 256, 128
    spec = ParamSpec("w", ("w",), (k, n), (k, n), ("embed", "mlp"), lambda a: a, lambda a: a, contract=(0,))
    q = quant.QuantSpec("int4", kernel="xla")
    w = jnp.asarray(np.random.default_rng(0).standard_normal((k, n)), jnp.float32)
    qa = quant.stored(*quant.quantize_device(w, spec, q), spec, q)
    x = jnp.ones((32, k), jnp.float32)
    text = jax.jit(lambda x, qa: quant.dense("mk,kn->mn", x, qa)).lower(x, qa).compile().as_text()
    verdict = hlo.fusion_verdict(text, {(k, n)})
    assert verdict["verdict"].startswith("NOT FUSED") and verdict["materialized_weight_buffers"]
