"""The parameter table and weight-only quantization (``--quantize int8|int4``) on the tiny checkpoint."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import model_runtime
from assistant.cli.main import main
from model_runtime import quant
from model_runtime.config import DIFFUCODER_7B, DreamConfig
from model_runtime.errors import InputError
from model_runtime.model import DreamModel, named_arrays
from model_runtime.sharding import weight_bytes_per_device
from model_runtime.weights import by_path, param_table
from tests.model_runtime.logits import logits

KW = dict(length_buckets=(32, 64, 128), batch_buckets=(1, 2, 4))
PROMPTS = ["def add(a, b):", "import os", "class Stack:", "for i in range(3):"]


def _flat(state: nnx.State) -> dict[str, jax.Array]:
    return named_arrays(state)


def _bytes(arr: jax.Array) -> int:
    """As accelerators store it: int4 two to a byte."""
    bits = 4 if arr.dtype == jnp.int4 else 8 * arr.dtype.itemsize
    return arr.size * bits // 8


def _logits(rt, ids: np.ndarray) -> np.ndarray:
    return logits(rt, ids).astype(np.float64)


def _kl(p_logits: np.ndarray, q_logits: np.ndarray) -> float:
    def log_softmax(z):
        z = z - z.max(-1, keepdims=True)
        return z - np.log(np.exp(z).sum(-1, keepdims=True))

    lp, lq = log_softmax(p_logits), log_softmax(q_logits)
    return float((np.exp(lp) * (lp - lq)).sum(-1).mean())


@pytest.fixture(scope="module")
def quantized(tiny_dir: Path) -> dict[str, object]:
    return {mode: model_runtime.load(tiny_dir, quantize=mode, **KW) for mode in ("int8", "int4")}


def test_the_model_is_built_from_the_table_alone(tiny_dir: Path) -> None:
    cfg = DreamConfig.from_dict(json.loads((tiny_dir / "config.json").read_text()))
    table = param_table(cfg)
    for spec in table.values():
        hf = np.arange(int(np.prod(spec.hf_shape)), dtype=np.float32).reshape(spec.hf_shape)
        assert spec.convert(hf).shape == spec.shape and np.array_equal(spec.invert(spec.convert(hf)), hf)
        assert len(spec.axes) == len(spec.shape)
    plain = _flat(nnx.split(nnx.eval_shape(lambda: DreamModel(cfg, rngs=nnx.Rngs(0))))[1])
    assert {"/".join(map(str, s.path)): s.shape for s in table.values()} == {
        k: v.shape for k, v in plain.items()
    }
    q = quant.QuantSpec("int4")
    qstate = _flat(nnx.split(nnx.eval_shape(lambda: DreamModel(cfg, rngs=nnx.Rngs(0), quant=q)))[1])
    quantizable = {"/".join(map(str, s.path)) for s in table.values() if s.quantizable}
    # Every projection and lm_head, not the embedding, norms or biases.
    assert {k.rsplit("/", 1)[-1] for k in quantizable} == {
        "q_kernel", "k_kernel", "v_kernel", "o_kernel", "gate_kernel", "up_kernel", "down_kernel", "lm_head"
    }  # fmt: skip
    assert set(qstate) == set(plain) | {k + "_scale" for k in quantizable}
    assert all(qstate[k].dtype == jnp.int4 for k in quantizable)


def test_quantized_weights_take_half_and_a_quarter_of_bf16(tiny_dir: Path, quantized) -> None:
    cfg = quantized["int8"].config
    table = by_path(cfg)
    quantizable = {"/".join(map(str, p)) for p, s in table.items() if s.quantizable}
    bf16 = sum(2 * table[p].size for p in table if "/".join(map(str, p)) in quantizable)
    for mode, (low, high) in {"int8": (0.5, 0.55), "int4": (0.25, 0.33)}.items():
        state = _flat(quantized[mode].state)
        values = sum(_bytes(state[k]) for k in quantizable)
        scales = sum(state[k + "_scale"].size * 2 for k in quantizable)  # bf16 scales on an accelerator
        assert values == bf16 // (4 if mode == "int4" else 2)
        assert low <= (values + scales) / bf16 <= high, mode
        # The memory table counts exactly what the loader placed (float32 on this CPU: 4-byte scales).
        spec = quantized[mode].quantize
        assert weight_bytes_per_device(cfg, 1, itemsize=4, quantize=spec) == sum(map(_bytes, state.values()))


def test_7b_memory_table_halves_and_quarters() -> None:
    cfg = DreamConfig.from_dict(DIFFUCODER_7B)
    bf16 = weight_bytes_per_device(cfg, 1)
    int8 = weight_bytes_per_device(cfg, 1, quantize=quant.QuantSpec("int8"))
    int4 = weight_bytes_per_device(cfg, 1, quantize=quant.QuantSpec("int4"))
    embedding = 2 * cfg.vocab_size * cfg.hidden_size  # kept in bf16 unless asked for
    assert 0.5 < (int8 - embedding) / (bf16 - embedding) < 0.51
    assert 0.25 < (int4 - embedding) / (bf16 - embedding) < 0.27
    with_embedding = weight_bytes_per_device(cfg, 1, quantize=quant.QuantSpec("int4", embedding=True))
    assert with_embedding < int4 - embedding / 2
    assert weight_bytes_per_device(cfg, 2, quantize=quant.QuantSpec("int8")) < 0.51 * int8


def test_quantized_logits_and_greedy_answers_follow_the_float_model(runtime, quantized) -> None:
    ids = np.random.default_rng(0).integers(0, runtime.config.vocab_size - 64, (4, 48))
    ref = _logits(runtime, ids)
    int8, int4 = _logits(quantized["int8"], ids), _logits(quantized["int4"], ids)
    # Measured on this checkpoint: KL 6e-5 (int8), 1e-2 (int4); arg-max agreement 0.98 and 0.78.
    assert _kl(ref, int8) < 5e-4 and (int8.argmax(-1) == ref.argmax(-1)).mean() > 0.95
    assert _kl(ref, int8) < _kl(ref, int4) < 0.05 and (int4.argmax(-1) == ref.argmax(-1)).mean() > 0.6
    rows = [runtime.tokenizer.encode(p) for p in PROMPTS]
    for decoder in ("reference", "fast"):
        params = model_runtime.SamplingParams(max_new_tokens=16, steps=16, decoder=decoder, block_length=8)
        want = list(runtime.generate(rows, params, chat=False, stream=False))[-1].generated
        got = list(quantized["int8"].generate(rows, params, chat=False, stream=False))[-1].generated
        same = sum(a == b for w, g in zip(want, got, strict=True) for a, b in zip(w, g, strict=True))
        assert same / (16 * len(rows)) >= 0.5, decoder
        assert any(w == g for w, g in zip(want, got, strict=True)), decoder


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_rounding_error_is_at_most_half_a_step(tiny_dir: Path, mode: str) -> None:
    cfg = DreamConfig.from_dict(json.loads((tiny_dir / "config.json").read_text()))
    q = quant.QuantSpec(mode, group=16)
    rng = np.random.default_rng(1)
    for spec in param_table(cfg).values():
        if not spec.quantizable or spec.path[:2] == ("layers", 1):  # layer 1 repeats layer 0's shapes
            continue
        w = rng.standard_normal(spec.shape).astype(np.float32)
        values, scale = quant.quantize(w, spec, q, np.dtype(np.float32))
        assert scale.shape == q.scale_shape(spec) and values.dtype == q.np_dtype
        step = quant.dequantize(np.ones(values.shape, np.int8), scale)  # each weight's own scale
        assert np.all(np.abs(quant.dequantize(values, scale) - w) <= 0.5 * step + 1e-6), spec.name
        # The device quantizer (random-weight benchmarks) rounds the same way, but for the weight at -amax
        # of a channel or group: exactly -qmax - 1/2 on the host, a hair above it with XLA's scale.
        dv, ds = quant.quantize_device(jnp.asarray(w), spec, q)
        diff = np.abs(np.asarray(dv, np.int32) - values.astype(np.int32))
        assert diff.max() <= 1 and (diff > 0).sum() <= scale.size and np.allclose(np.asarray(ds), scale)


def test_int4_group_scales(tiny_dir: Path) -> None:
    cfg = DreamConfig.from_dict(json.loads((tiny_dir / "config.json").read_text()))
    d, h, k, e, f = 64, 4, 2, 16, 128
    assert (cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim, cfg.intermediate_size) == (d, h, e, f)
    t = by_path(cfg)
    q16 = quant.QuantSpec("int4", group=16)
    assert q16.scale_shape(t[("layers", 0, "attn", "q_kernel")]) == (d // 16, h, e)
    assert q16.scale_shape(t[("layers", 0, "attn", "o_kernel")]) == (h, 1, d)  # a group inside one head
    assert q16.scale_shape(t[("layers", 0, "mlp", "down_kernel")]) == (f // 16, d)
    assert q16.scale_shape(t[("lm_head",)]) == (d // 16, cfg.vocab_size)
    # The default group (128) is the whole dimension when that is smaller.
    assert quant.QuantSpec("int4").scale_shape(t[("layers", 0, "mlp", "down_kernel")]) == (1, d)
    assert quant.QuantSpec("int8").scale_shape(t[("layers", 0, "attn", "k_kernel")]) == (1, k, e)
    with pytest.raises(InputError, match="not a multiple of the group size 48"):
        quant.QuantSpec("int4", group=48).scale_shape(t[("layers", 0, "attn", "q_kernel")])


def test_quantized_embedding_is_gathered_and_dequantized(tiny_dir: Path, runtime) -> None:
    rt = model_runtime.load(tiny_dir, quantize=quant.QuantSpec("int8", embedding=True), **KW)
    state = _flat(rt.state)
    assert state["embed"].dtype == jnp.int8 and state["embed_scale"].shape == (rt.config.vocab_size, 1)
    ids = np.random.default_rng(2).integers(0, rt.config.vocab_size - 64, (2, 32))
    assert _kl(_logits(runtime, ids), _logits(rt, ids)) < 1e-3


def test_bad_quantize_values_give_one_line_and_exit_2(
    tiny_dir: Path, tmp_path: Path, capsys, monkeypatch
) -> None:
    run = ["generate", "--model", str(tiny_dir), "--raw", "--prompt", "x", "--max-new-tokens", "4"]
    assert main([*run, "--quantize", "int3"]) == 2
    err = capsys.readouterr().err
    assert err == "diffu: error: quantize: expected one of int8, int4; got 'int3'\n"
    monkeypatch.setenv("DIFFU_QUANTIZE", "int3")
    assert main(run) == 2
    assert "expected one of int8, int4; got 'int3'" in capsys.readouterr().err
    from assistant.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="DIFFU_QUANTIZE: quantize: expected one of int8, int4; got"):
        load_config(env={"DIFFU_QUANTIZE": "int3"}, path=tmp_path / "none.toml")
    assert load_config({"quantize": "int4"}, env={}, path=tmp_path / "none.toml")[0].quantize == "int4"


def test_an_integer_checkpoint_is_refused_with_one_line(tiny_dir: Path, tmp_path: Path, capsys) -> None:
    from safetensors.numpy import save_file

    d = tmp_path / "already-int8"
    d.mkdir()
    for f in tiny_dir.iterdir():
        if f.is_file() and f.suffix != ".safetensors" and f.name != "model.safetensors.index.json":
            (d / f.name).write_bytes(f.read_bytes())
    cfg = DreamConfig.from_dict(json.loads((tiny_dir / "config.json").read_text()))
    save_file(
        {n: np.zeros(s.hf_shape, np.int8) for n, s in param_table(cfg).items()}, str(d / "model.safetensors")
    )
    code = main(["generate", "--model", str(d), "--raw", "--prompt", "x", "--quantize", "int8"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("diffu: error: ")
    # The reader refuses integer tensors before anything is quantized, naming the first one.
    assert ".weight: is an integer tensor (I8) in model.safetensors" in err and "--quantize" in err
    spec = param_table(cfg)["lm_head.weight"]
    with pytest.raises(InputError, match="lm_head.weight is already an integer tensor"):
        quant.quantize(np.zeros(spec.shape, np.int8), spec, quant.QuantSpec("int8"), np.dtype(np.float32))


def test_generate_flag_runs_the_quantized_model(tiny_dir: Path, quantized, capsys) -> None:
    run = ["generate", "--model", str(tiny_dir), "--raw", "--prompt", PROMPTS[0], "--max-new-tokens", "16"]
    assert main([*run, "--quantize", "int4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    rt = quantized["int4"]
    params = model_runtime.SamplingParams(max_new_tokens=16, steps=16)
    want = list(rt.generate([rt.rows.tokenizer.encode(PROMPTS[0])], params, chat=False, stream=False))[-1]
    assert out["sequences"] == want.sequences


def test_daemon_serves_the_quantized_model(micro_dir: Path, tmp_path: Path) -> None:
    from tests.assistant.helpers import isolated_env, start_daemon

    env = isolated_env(
        tmp_path,
        DIFFU_LENGTH_BUCKETS="64",
        DIFFU_BATCH_BUCKETS="1",
        DIFFU_MAX_CONTEXT="64",
        DIFFU_QUANTIZE="int8",
    )
    daemon = start_daemon(tmp_path, str(micro_dir), "--no-warmup", env=env)
    try:
        with daemon.client() as c:
            status = c.get("/v1/diffu/status").json()
            answer = c.post("/v1/completions", json={"prompt": "def add(a, b):", "max_tokens": 8})
        assert status["quantize"] == "int8" and status["engine"]["stage"] == "ready"
        assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] > 0
    finally:
        daemon.stop()


def test_w8a8_option_follows_weight_only_int8(tiny_dir: Path, quantized) -> None:
    """``QuantSpec(activations="int8")``: the 4 x 64 canvas makes every product 256 rows, so all of them
    quantize their activations too; the logits stay close to weight-only int8's."""
    rt = model_runtime.load(tiny_dir, quantize=quant.QuantSpec("int8", activations="int8"), **KW)
    ids = np.random.default_rng(3).integers(0, rt.config.vocab_size - 64, (4, 64))
    w8, w8a8 = _logits(quantized["int8"], ids), _logits(rt, ids)
    assert 0 < np.abs(w8a8 - w8).max() and _kl(w8, w8a8) < 1e-3


def test_a_tied_head_reads_the_embedding_float_or_quantized(tiny_dir: Path) -> None:
    """With ``tie_word_embeddings`` the head is the embedding table (``[V, D]``, contracted on its last
    dimension, which the kernels do not take): XLA's path, float or with the table quantized."""
    cfg = dataclasses.replace(
        DreamConfig.from_dict(json.loads((tiny_dir / "config.json").read_text())), tie_word_embeddings=True
    )
    model = DreamModel(cfg, rngs=nnx.Rngs(0))
    hidden = jnp.asarray(np.random.default_rng(4).standard_normal((2, 5, cfg.hidden_size)), jnp.float32)
    table = np.asarray(model.embed.get_value())
    np.testing.assert_allclose(
        np.asarray(model.head(hidden)), np.asarray(hidden) @ table.T, rtol=1e-5, atol=1e-5
    )
    q = quant.QuantSpec("int8", embedding=True, kernel="interpret")
    spec = by_path(cfg)[("embed",)]
    assert not q.packs(spec)
    model.embed.set_value(quant.stored(*quant.quantize(table, spec, q, np.dtype(np.float32)), spec, q))
    want = np.asarray(hidden) @ quant.dequantize(*quant.quantize(table, spec, q, np.dtype(np.float32))).T
    np.testing.assert_allclose(np.asarray(model.head(hidden)), want, rtol=1e-5, atol=1e-5)
