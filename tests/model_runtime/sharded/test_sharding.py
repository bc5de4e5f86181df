"""Sharded runtime on 8 virtual CPU devices: tp=4, tp=8 (logits and placement) and dp=2 x tp=4 against one
device."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from model_runtime.sharding import MeshSpec, logical_to_spec
from tests.assistant.helpers import REPO, virtual_devices_env

EIGHT = virtual_devices_env(8)


@pytest.fixture(scope="module")
def report(shard_dir):
    proc = subprocess.run(
        [sys.executable, "-m", "tests.model_runtime.sharded.shard_check", str(shard_dir)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **EIGHT},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_meshes_give_single_device_logits_and_generations(report):
    assert report["devices"] == 8
    for mesh in report["meshes"]:
        what = f"tp={mesh['tp']} dp={mesh['dp']}"
        assert mesh["max_rel_err"] < 1e-5, what
        if mesh["tp"] == 8:
            assert "greedy_equal" not in mesh, what  # placement and logits only
            continue
        assert mesh["greedy_equal"] and mesh["fused_equal"] and mesh["fast_equal"], what
        assert mesh["sliding_equal"], what
    dp2 = next(m for m in report["meshes"] if m["dp"] == 2)
    assert dp2["device"].endswith("x8") and all(b % 2 == 0 for b in dp2["batch_buckets"])


def test_each_device_holds_one_tp_th_of_every_sharded_weight(report):
    for mesh in report["meshes"]:
        tp, fr = mesh["tp"], mesh["fractions"]
        # Every parameter is named by its path (the checks below look at each one's last part).
        assert "layers/0/attn/q_kernel" in fr and "embed" in fr and "norm/weight" in fr, sorted(fr)[:5]
        # Sharded over tp: embeddings and lm_head (vocabulary), q/o (heads), the MLP hidden.
        for name, fractions in fr.items():
            leaf = name.rsplit("/", 1)[-1]
            if leaf in (
                "embed",
                "lm_head",
                "q_kernel",
                "q_bias",
                "o_kernel",
                "gate_kernel",
                "up_kernel",
                "down_kernel",
            ):
                assert fractions == [1 / tp], (mesh["tp"], name, fractions)
            elif leaf in ("k_kernel", "v_kernel", "k_bias", "v_bias", "weight"):
                assert fractions == [1.0], (name, fractions)  # 2 KV heads do not split 4 or 8 ways


def test_quantized_weights_and_their_scales_shard_together(report):
    q = report["quantized"]
    assert q["max_rel_err"] < 1e-5 and q["greedy_equal"]
    fr, dtypes = q["fractions"], q["dtypes"]
    assert "layers/0/mlp/gate_kernel" in fr and "layers/0/mlp/gate_kernel_scale" in fr, sorted(fr)[:5]
    # Per-channel scales take their weight's output axes: split where those are (heads, MLP hidden,
    # vocabulary), replicated where the output is the hidden size (o_proj, down_proj) or 2 KV heads.
    split = ("q_kernel", "q_kernel_scale", "o_kernel", "gate_kernel", "gate_kernel_scale", "up_kernel")
    split += ("up_kernel_scale", "down_kernel", "lm_head", "lm_head_scale")
    whole = ("o_kernel_scale", "down_kernel_scale", "k_kernel", "k_kernel_scale", "v_kernel_scale")
    for name, fractions in fr.items():
        leaf = name.rsplit("/", 1)[-1]
        if leaf in split:
            assert fractions == [1 / 4], (name, fractions)
        elif leaf in whole:
            assert fractions == [1.0], (name, fractions)
        if leaf.endswith("_kernel") or leaf == "lm_head":
            assert dtypes[name] == "int8", name
    assert "int4" in q["int4_cpu_mesh_error"] and "use --quantize int8" in q["int4_cpu_mesh_error"]


def test_cli_tp4_prints_the_tp1_sequences(generate_argv):
    args = generate_argv
    env = {**os.environ, **EIGHT}
    one = subprocess.run(args + ["--tp", "1"], capture_output=True, text=True, timeout=300, env=env)
    four = subprocess.run(args + ["--tp", "4"], capture_output=True, text=True, timeout=300, env=env)
    assert one.returncode == 0 and four.returncode == 0, one.stderr + four.stderr
    assert json.loads(four.stdout)["sequences"] == json.loads(one.stdout)["sequences"]


def test_mesh_errors_are_clear():
    from model_runtime.errors import InputError

    with pytest.raises(InputError, match="does not divide"):
        MeshSpec(tp=3).build()
    with pytest.raises(ValueError, match="twice"):
        import jax
        import numpy as np
        from jax.sharding import Mesh

        logical_to_spec(
            ("heads", "mlp"), (4, 4), Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("dp", "tp"))
        )


def test_7b_weight_memory_per_device():
    from model_runtime.config import DIFFUCODER_7B, DreamConfig
    from model_runtime.sharding import weight_bytes_per_device

    cfg = DreamConfig.from_dict(DIFFUCODER_7B)
    assert weight_bytes_per_device(cfg, 1) == 2 * cfg.param_count()  # 15.23 GB in bfloat16
    assert weight_bytes_per_device(cfg, 2) < 0.51 * weight_bytes_per_device(cfg, 1)
    # At tp=8 the 28 query heads and 4 KV heads do not split 8 ways: attention stays replicated.
    assert weight_bytes_per_device(cfg, 8) > weight_bytes_per_device(cfg, 1) / 8
