"""``diffu bench`` output: the fields a user or a script reads (not the timings themselves)."""

from __future__ import annotations

import json

from assistant.cli.main import main


def test_bench_suite_json_fields(tiny_dir, capsys, tmp_path):
    plot = tmp_path / "bench.png"
    args = [
        "bench",
        "--model",
        str(tiny_dir),
        "--batches",
        "1,2",
        "--lengths",
        "32,64",
        "--generate",
        "16x16",
        "--repeat",
        "1",
        "--json",
    ]
    try:
        import matplotlib  # noqa: F401

        args += ["--plot", str(plot)]
    except ImportError:
        plot = None
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert {
        "environment",
        "model",
        "dtype",
        "load_seconds",
        "matmul_gflops",
        "forward",
        "generation",
        "compile",
        "batch_scaling",
    } <= set(out)
    assert {"backend", "device", "jax", "flax", "cpu"} <= set(out["environment"])
    assert [(f["batch"], f["length"]) for f in out["forward"]] == [(1, 32), (2, 32), (1, 64), (2, 64)]
    for f in out["forward"]:
        assert f["median_seconds"] > 0 and f["tokens_per_second"] > 0 and f["gflops_per_second"] > 0
    assert {g["decoder"] for g in out["generation"]} == {"reference", "fast"}
    assert [g["batch"] for g in out["batch_scaling"]] == [1, 2]
    for g in out["generation"] + out["batch_scaling"]:
        assert g["median_seconds"] > 0 and g["tokens_per_second"] > 0 and g["forwards"] >= 1
    if plot is not None:
        assert plot.stat().st_size > 1000


def test_bench_generate_json_fields(tiny_dir, capsys):
    args = [
        "bench",
        "generate",
        "--model",
        str(tiny_dir),
        "--raw",
        "--prompt",
        "def f():",
        "--max-new-tokens",
        "16",
        "--decoder",
        "fast",
        "--block-length",
        "8",
        "--repeat",
        "2",
        "--json",
    ]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert {
        "median_seconds",
        "tokens_per_second",
        "compile_seconds",
        "forwards",
        "decoder",
        "environment",
    } <= set(out)
    assert out["decoder"] == "fast" and len(out["seconds"]) == 2 and out["compile_seconds"] > 0
    assert out["stream"] is False
    # A forward per call, as the daemon runs jobs: the same forwards (the same programs, the same keys).
    assert main([*args, "--stream"]) == 0
    streamed = json.loads(capsys.readouterr().out)
    assert streamed["stream"] is True and streamed["forwards"] == out["forwards"]


def test_bench_rejects_bad_grids(tiny_dir, capsys):
    import pytest

    with pytest.raises(SystemExit):
        main(["bench", "--model", str(tiny_dir), "--batches", "0,x"])
    assert "expected" in capsys.readouterr().err
    assert main(["bench", "--model", str(tiny_dir), "--lengths", "5000", "--repeat", "1"]) == 2
    assert "exceeds the model's context" in capsys.readouterr().err


def test_reference_step_flops_count_the_gathered_rows_only(tiny_dir):
    from model_runtime import bench
    from model_runtime.config import load_config

    cfg = load_config(tiny_dir)
    full = bench.forward_flops(cfg, 2, 64)
    assert bench.reference_step_flops(cfg, 2, 64, 64) == full  # every row gathered: a full forward
    fewer = bench.reference_step_flops(cfg, 2, 64, 8)
    # 56 fewer rows per sequence skip lm_head and the last layer's queries, attention, output and MLP.
    d, v = cfg.hidden_size, cfg.vocab_size
    assert (
        full - fewer > 2 * 2 * 56 * d * v
        and fewer > full * (cfg.num_hidden_layers - 1) / cfg.num_hidden_layers / 2
    )
