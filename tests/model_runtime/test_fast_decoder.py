"""The fast decoder: DualCache block steps, threshold/factor commit rules, early stop, batching."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from model_runtime import SamplingParams
from model_runtime.errors import InputError
from model_runtime.strategies import Factor, Threshold
from tests.model_runtime.logits import jitted_model

NEG = -np.inf


def test_threshold_rule_commits_everything_above_and_always_the_best():
    conf = jnp.array([[0.95, 0.2, 0.91, NEG], [0.3, 0.1, 0.29, 0.05], [NEG, NEG, NEG, NEG]], jnp.float32)
    chosen = np.asarray(Threshold().select(jnp, conf, jnp.float32(0.9), jnp.float32(1.0)))
    assert chosen.tolist() == [[True, False, True, False], [True, False, False, False], [False] * 4]
    # The same value on the host (numpy) as on the device.
    on_host = Threshold().select(np, np.asarray(conf), np.float32(0.9), np.float32(1.0))
    assert on_host.tolist() == chosen.tolist()


def test_factor_rule_commits_the_longest_confident_prefix():
    # Sorted: 0.9 >= 1 - 1/2, 0.8 >= 1 - 1/3, 0.7 < 1 - 1/4 -> two positions.
    conf = jnp.array([[0.7, 0.9, 0.8, NEG], [0.1, 0.2, NEG, NEG]], jnp.float32)
    chosen = np.asarray(Factor().select(jnp, conf, jnp.float32(0.9), jnp.float32(1.0)))
    assert chosen.tolist() == [[False, True, True, False], [False, True, False, False]]
    on_host = Factor().select(np, np.asarray(conf), np.float32(0.9), np.float32(1.0))
    assert on_host.tolist() == chosen.tolist()


def test_block_forward_over_a_fresh_cache_equals_the_full_forward(runtime):
    """DualCache: a block's queries over the refreshed keys/values reproduce the full forward there."""
    model = jitted_model(runtime, "hidden", "hidden_at")
    rng = np.random.default_rng(0)
    ids = rng.integers(0, runtime.config.vocab_size - 64, size=(2, 40))
    attn = np.ones((2, 40), bool)
    attn[1, :9] = False  # a left-padded row
    full, caches = model.hidden(jnp.asarray(ids), jnp.asarray(attn))
    start, size = 24, 8
    block, _ = model.hidden(
        jnp.asarray(ids[:, start : start + size]), jnp.asarray(attn), caches=caches, start=jnp.int32(start)
    )
    np.testing.assert_allclose(
        np.asarray(block), np.asarray(full[:, start : start + size]), rtol=1e-5, atol=1e-5
    )


def test_a_refresh_that_asks_for_a_few_rows_gets_those_rows_of_the_full_forward(runtime):
    """hidden_at runs the last layer's queries for the refresh's window only: same outputs, same cache."""
    model = jitted_model(runtime, "hidden", "hidden_at")
    rng = np.random.default_rng(1)
    ids = jnp.asarray(rng.integers(0, runtime.config.vocab_size - 64, size=(2, 40)))
    attn = np.ones((2, 40), bool)
    attn[0, :5] = False
    rows = jnp.asarray([[10, 11, 12], [30, 31, 39]])
    full, caches = model.hidden(ids, jnp.asarray(attn))
    part, part_caches = model.hidden_at(ids, jnp.asarray(attn), rows)
    want = np.take_along_axis(np.asarray(full), np.asarray(rows)[..., None], axis=1)
    np.testing.assert_allclose(np.asarray(part), want, rtol=1e-5, atol=1e-5)
    for (k, v), (pk, pv) in zip(caches, part_caches, strict=True):
        np.testing.assert_allclose(np.asarray(pk), np.asarray(k), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(np.asarray(pv), np.asarray(v), rtol=1e-5, atol=1e-5)


def fast(max_new_tokens=48, **kw):
    return SamplingParams(max_new_tokens=max_new_tokens, decoder="fast", **kw)


def test_fast_decoder_fills_every_block_and_reports_forwards(runtime):
    ids = runtime.tokenizer.encode("def add(a, b):")
    rows = [runtime.rows.make_row(ids, 48, chat=False)]
    events = list(runtime.run(rows, fast(block_length=16)))
    steps, done = events[:-1], events[-1]
    assert list(dict.fromkeys(s.block for s in steps)) == [0, 1, 2]
    assert {s.blocks for s in steps} == {3}
    assert runtime.tokenizer.mask_id not in done.generated[0]
    # Block b fills positions [16b, 16b + 16) and nothing else, all of them.
    for b in range(3):
        filled = [p for s in steps if s.block == b for p in s.unmasked[0]]
        assert sorted(filled) == list(range(16 * b, 16 * b + 16))
    assert 3 <= done.stats.steps <= 48  # forwards: at least one refresh per block, at most one per token
    # A step is a forward: the last event's step number is the forward count.
    assert steps[-1].step + 1 == done.stats.steps and {s.steps for s in steps} == {48}


def test_streaming_reports_every_forward_and_commits_the_same_tokens(runtime):
    ids = runtime.tokenizer.encode("def add(a, b):")
    rows = [runtime.rows.make_row(ids, 48, chat=False)]
    params = fast(block_length=16, threshold=0.5)
    events = list(runtime.run(rows, params))
    steps, done = events[:-1], events[-1]
    # One event per forward, numbered in order, as many as the BatchDone counts.
    assert [s.step for s in steps] == list(range(done.stats.steps)) and len(steps) > 3
    # Tokens land inside a block over several forwards: some event leaves its block part-filled.
    mask = runtime.tokenizer.mask_id
    partial = [
        s for s in steps if 0 < sum(t == mask for t in s.canvas[0][16 * s.block : 16 * s.block + 16]) < 16
    ]
    assert len(partial) >= 2
    assert all(len(s.unmasked[0]) >= 1 for s in steps)  # every forward commits at least one position
    # The same tokens as the fused run (one call per block), forward for forward.
    fused = list(runtime.run(rows, params, stream=False))
    assert len(fused) == 1
    assert done.generated == fused[0].generated and done.stats.steps == fused[0].stats.steps


def test_lower_threshold_means_fewer_forwards(runtime):
    ids = runtime.tokenizer.encode("import os")
    strict = list(runtime.generate([ids], fast(threshold=1.0), chat=False))[-1]
    loose = list(runtime.generate([ids], fast(threshold=0.02), chat=False))[-1]
    assert strict.stats.steps > loose.stats.steps
    factor = list(runtime.generate([ids], fast(factor=4.0), chat=False))[-1]
    assert runtime.tokenizer.mask_id not in factor.generated[0]


def test_batched_rows_equal_rows_alone(runtime):
    tok = runtime.tokenizer
    prompts = [tok.encode("def add(a, b):"), tok.encode("x = [")]
    batch = list(runtime.generate(prompts, fast(max_new_tokens=32), chat=False))[-1]
    for i, p in enumerate(prompts):
        alone = list(runtime.generate([p], fast(max_new_tokens=32), chat=False))[-1]
        assert alone.generated[0] == batch.generated[i]


def test_stops_once_every_row_has_ended_its_text(runtime, monkeypatch):
    ids = runtime.tokenizer.encode("def f():")
    # Make every token a stop token: after the first block every row has "ended".
    monkeypatch.setattr(runtime.tokenizer, "stop_ids", lambda chat: tuple(range(runtime.config.vocab_size)))
    rows = [runtime.rows.make_row(ids, 64, chat=False)]
    events = list(runtime.run(rows, fast(max_new_tokens=64, block_length=16)))
    assert {e.block for e in events[:-1]} == {0}  # one block, then done
    rest = events[-1].generated[0][16:]
    assert rest == [runtime.config.pad_token_id] * 48


def test_fast_decoder_infill_and_misaligned_rows(runtime):
    rt = runtime
    row = rt.rows.make_infill_row("def f(x):\n    return ", "\n\nprint(f(3))\n", 10)
    done = list(rt.run([row], fast(block_length=8)))[-1]
    content = done.sequences[0]
    lo, hi = row.region
    assert content[:lo] == list(row.ids[:lo]) and content[hi:] == list(row.ids[hi:])
    assert rt.tokenizer.mask_id not in done.generated[0]
    with pytest.raises(InputError, match="same columns"):
        rt.run([row, rt.rows.make_row(rt.tokenizer.encode("x"), 10, chat=False)], fast())
    with pytest.raises(InputError, match="hooks"):
        rt.run([row], fast(), logits_hook=lambda s, x, lg: lg)


def test_fast_decoder_parameters_are_validated():
    from model_runtime import ParamError

    with pytest.raises(ParamError, match="decoder: must be one of"):
        SamplingParams(decoder="turbo")
    with pytest.raises(ParamError, match="threshold: must be in"):
        SamplingParams(threshold=1.5)
    with pytest.raises(ParamError, match="block_length: must be >= 1"):
        SamplingParams(block_length=0)
    assert jax.numpy.float32(SamplingParams(factor=2).factor) == 2


def test_cli_fast_decoder(tiny_dir, capsys):
    import json

    from assistant.cli.main import main

    args = [
        "generate",
        "--model",
        str(tiny_dir),
        "--raw",
        "--prompt",
        "def f():",
        "--max-new-tokens",
        "32",
        "--decoder",
        "fast",
        "--block-length",
        "16",
        "--threshold",
        "0.5",
        "--json",
    ]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["sequences"][0]) == len(out["prompt_ids"][0]) + 32
    assert out["stats"]["steps"] <= 32  # forwards, not the reference's one step per token
