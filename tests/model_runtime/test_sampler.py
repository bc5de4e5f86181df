"""Sampler behaviour beyond greedy parity: stochastic modes, per-row counts, hooks, buckets, dtypes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from model_runtime import SamplingParams
from model_runtime.sampling import SamplerSpec, sample_tokens, top_p_logits
from tests.model_runtime.logits import logits
from tests.reference import dream_torch


def sample_many(logits: np.ndarray, spec: SamplerSpec, temperature=1.0, top_p=1.0, n=20000) -> np.ndarray:
    keys = jax.random.split(jax.random.key(0), n)
    batch = jnp.broadcast_to(jnp.asarray(logits, jnp.float32), (n, logits.shape[-1]))
    f = jax.jit(
        jax.vmap(lambda k, lg: sample_tokens(lg, k, spec, jnp.float32(temperature), jnp.float32(top_p))[1])
    )
    return np.asarray(f(keys, batch))


def test_top_p_filter_matches_the_reference_function():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((6, 300)).astype(np.float32) * 3
    for p in (0.1, 0.5, 0.9, 0.99):
        ours = np.asarray(top_p_logits(jnp.asarray(logits), jnp.float32(p)))
        ref = dream_torch.top_p_logits(torch.tensor(logits), p).numpy()
        np.testing.assert_array_equal(ours, ref)


@pytest.mark.parametrize("alg", ["maskgit_plus", "topk_margin", "entropy"])
@pytest.mark.parametrize("top_p,top_k", [(None, 50), (0.9, 50), (0.5, 5), (None, 0), (0.8, 0), (None, 2)])
def test_greedy_proposals_and_confidences_match_the_reference(alg, top_p, top_k):
    """Both code paths (top-k on k values, and the full-vocabulary one) against ``sample_tokens``."""
    rng = np.random.default_rng(1)
    logits = (rng.standard_normal((40, 500)) * rng.uniform(0.5, 4, (40, 1))).astype(np.float32)
    spec = SamplerSpec(alg=alg, use_top_p=top_p is not None, top_k=top_k)
    conf, x0 = sample_tokens(
        jnp.asarray(logits), jax.random.key(0), spec, jnp.float32(0), jnp.float32(top_p or 1.0)
    )
    kw = {"topk_margin": {"margin_confidence": True}, "entropy": {"neg_entropy": True}}.get(alg, {})
    ref_conf, ref_x0 = dream_torch.sample_tokens(
        torch.tensor(logits), 0.0, top_p=top_p, top_k=top_k or None, **kw
    )
    np.testing.assert_array_equal(np.asarray(x0), ref_x0.numpy())
    np.testing.assert_allclose(np.asarray(conf), ref_conf.numpy(), rtol=1e-5, atol=1e-6)


def test_temperature_sampling_follows_the_filtered_distribution():
    logits = np.array([2.0, 1.5, 1.0, 0.5, 0.0, -1.0, -2.0, -3.0], np.float32)
    temperature = 0.7
    spec = SamplerSpec(alg="maskgit_plus", do_sample=True, use_top_p=True, top_k=5)
    draws = sample_many(logits, spec, temperature=temperature, top_p=0.9)
    # The expected law: temperature, then top-p (0.9), then top-k (5), then softmax; via the reference.
    filtered = dream_torch.top_k_logits(dream_torch.top_p_logits(torch.tensor(logits / temperature), 0.9), 5)
    expected = torch.softmax(filtered, -1).numpy()
    freq = np.bincount(draws, minlength=len(logits)) / len(draws)
    assert set(np.flatnonzero(freq)) <= set(np.flatnonzero(expected > 1e-6)), "sampled outside the support"
    assert 0.5 * np.abs(freq - expected).sum() < 0.02  # total variation


def test_seeds_reproduce_and_differ(runtime):
    prompt = runtime.tokenizer.encode("def f(x):")
    run = lambda seed: list(
        runtime.generate(
            [prompt],
            SamplingParams(max_new_tokens=16, steps=8, temperature=1.0, top_p=0.95, seed=seed),
            chat=False,
        )
    )[-1]
    a, b, c = run(1), run(1), run(2)
    assert a.generated == b.generated
    assert a.generated != c.generated


def test_stochastic_commit_counts_follow_the_schedule(runtime):
    prompt = runtime.tokenizer.encode("import sys")
    for alg, extra in (
        ("entropy", {"temperature": 1.0}),
        ("topk_margin", {"alg_temp": 0.5}),
        ("maskgit_plus", {"temperature": 0.5, "alg_temp": 1.0}),
    ):
        params = SamplingParams(max_new_tokens=24, steps=6, alg=alg, seed=3, **extra)
        events = list(runtime.generate([prompt], params, chat=False))
        counts = [len(e.unmasked[0]) for e in events[:-1]]
        assert counts == dream_torch.transfer_counts(24, 6), alg


def test_alg_temp_picks_positions_in_proportion_to_softmax_confidence():
    """Gumbel-top-k with k=1 equals one multinomial draw from softmax(confidence / alg_temp)."""
    from model_runtime.commit import commit_by_confidence

    conf = jnp.array([[0.9, 0.5, 0.2, 0.1, 0.7]], jnp.float32)
    mask = jnp.array([[True, True, True, False, True]])
    x = jnp.full((1, 5), -1, jnp.int32)
    x0 = jnp.arange(5, dtype=jnp.int32)[None]
    spec = SamplerSpec(alg="entropy", use_alg_temp=True)
    f = jax.vmap(
        lambda k: commit_by_confidence(x, mask, x0, conf, jnp.array([1]), k, spec, jnp.float32(0.25))
    )
    picks = np.asarray(f(jax.random.split(jax.random.key(1), 20000)))[:, 0]
    chosen = np.argmax(picks >= 0, axis=-1)
    freq = np.bincount(chosen, minlength=5) / len(chosen)
    expected = torch.softmax(torch.tensor([0.9, 0.5, 0.2, -float("inf"), 0.7]) / 0.25, -1).numpy()
    assert freq[3] == 0 and 0.5 * np.abs(freq - expected).sum() < 0.02


def test_origin_reveals_each_mask_with_probability_one_minus_s_over_t(runtime):
    prompt = runtime.tokenizer.encode("x = ")
    params = SamplingParams(max_new_tokens=96, steps=4, alg="origin", temperature=0.8, seed=5)
    events = list(runtime.generate([prompt], params, chat=False))
    from model_runtime.sampling import transfer_ratios

    ratios = transfer_ratios(4, 1e-3)
    left = 96
    for e, r in zip(events[:-1], ratios, strict=True):
        k = len(e.unmasked[0])
        # Binomial(left, r): within 4 standard deviations (or all of them at the last step).
        assert abs(k - left * r) <= 4 * np.sqrt(left * r * (1 - r)) + 1e-9
        left -= k
    assert left == 0


def test_rows_with_different_mask_counts_never_overwrite_prompt_tokens(runtime, tiny_dir):
    """Infill next to plain generation: per-row counts instead of the reference's batch average."""
    rt = runtime
    rows = [
        rt.rows.make_infill_row("def f(x):\n    return ", "\n\nprint(f(1))\n", 2),
        rt.rows.make_row(rt.tokenizer.encode("import os"), 20, chat=False),
    ]
    params = SamplingParams(max_new_tokens=20, steps=5)
    events = list(rt.run(rows, params))
    done = events[-1]
    mask = rt.tokenizer.mask_id
    for row, content in zip(rows, events[-2].content, strict=True):
        lo, hi = row.region
        assert content[:lo] == list(row.ids[:lo]) and content[hi:] == list(row.ids[hi:]), "fixed text changed"
        assert mask not in content
    assert [len(g) for g in done.generated] == [2, 20]

    # The published code, on the same batch, writes <|mask|> over prompt text of the row with fewer masks
    # (its one batch-averaged transfer count), which is why we count per row.
    ref = dream_torch.DreamReference.from_dir(tiny_dir)
    n = max(len(r.ids) for r in rows)
    x = torch.full((2, n), rt.config.pad_token_id)
    attn = torch.zeros((2, n), dtype=torch.long)
    for b, r in enumerate(rows):
        x[b, n - len(r.ids) :] = torch.tensor(r.ids)
        attn[b, n - len(r.ids) :] = 1
    _, mask4, tok_idx = dream_torch.prepare(x, attn, 0, mask)
    canvas = x.clone()
    for i in range(5):
        canvas, _, _ = dream_torch.step(ref, canvas, mask4, tok_idx, i, steps=5, mask_id=mask)
    fixed = attn.bool() & (x != mask)
    assert bool((canvas[fixed] == mask).any()), "expected the reference to overwrite prompt tokens"


def test_hooks_ban_tokens_and_force_text(runtime):
    rt = runtime
    prompt = rt.tokenizer.encode("def add(a, b):")
    plain = list(rt.generate([prompt], SamplingParams(max_new_tokens=12, steps=12), chat=False))[-1]
    banned = plain.generated[0][0] if plain.generated[0][0] != rt.tokenizer.mask_id else plain.generated[0][1]

    def ban(step, x, logits):
        return logits.at[..., banned].set(-jnp.inf)

    forced = rt.tokenizer.encode("END")

    def force_end(step, x, logits):  # demo_token_control.py: overwrite the last positions every step
        return x.at[:, -len(forced) :].set(jnp.asarray(forced, x.dtype))

    out = list(
        rt.generate(
            [prompt],
            SamplingParams(max_new_tokens=12, steps=12),
            chat=False,
            logits_hook=ban,
            tokens_hook=force_end,
        )
    )[-1]
    assert banned not in out.generated[0][: -len(forced)]
    assert out.generated[0][-len(forced) :] == forced


def test_prompt_lengths_inside_a_bucket_share_one_program(runtime):
    rt = runtime
    params = SamplingParams(max_new_tokens=8, steps=2)
    before = len(rt.programs)
    results = {}
    for text in ("a", "def f():", "class A(object):\n    pass"):
        ids = rt.tokenizer.encode(text)
        results[text] = list(rt.generate([ids], params, chat=False))[-1]
        assert results[text].stats.bucket == (1, 32)
    assert len(rt.programs) - before <= 1, "another prompt length in the same bucket recompiled"
    assert sum(r.stats.compiled_programs for r in results.values()) <= 1
    # Padding to the bucket does not change a row's result: run the same prompt at an exact-shape canvas.
    ids = rt.tokenizer.encode("def f():")
    exact = np.array([ids + [rt.tokenizer.mask_id] * 8])
    for i in range(2):
        exact = rt.step_canvas(exact, None, i, params)
    assert exact[0, len(ids) :].tolist() == results["def f():"].generated[0]


def test_bfloat16_checkpoint_converts_and_stays_close(tmp_path):
    import model_runtime
    from model_runtime.tiny import write_tiny_checkpoint

    d = write_tiny_checkpoint(tmp_path / "bf16", dtype="bfloat16", shards=1)
    rt32 = model_runtime.load(d, dtype="float32", length_buckets=(32,), batch_buckets=(1,))
    rt16 = model_runtime.load(d, dtype="bfloat16", length_buckets=(32,), batch_buckets=(1,))
    assert rt16.info.dtype == "bfloat16" and jax.tree.leaves(rt16.state)[0].dtype == jnp.bfloat16
    ids = jnp.asarray([rt32.tokenizer.encode("def add(a, b):\n    return a + b")])
    l32, l16 = logits(rt32, ids), logits(rt16, ids).astype(np.float32)
    # bf16 keeps ~3 significant digits; the top prediction agrees almost everywhere.
    assert np.mean(np.argmax(l32, -1) == np.argmax(l16, -1)) > 0.9
    list(rt16.generate([rt16.tokenizer.encode("x")], SamplingParams(max_new_tokens=8, steps=4), chat=False))


def test_invalid_sampling_parameters_are_named():
    from model_runtime import ParamError

    with pytest.raises(ParamError, match="alg: must be one of"):
        SamplingParams(alg="random")
    with pytest.raises(ParamError, match="top_p: must be in"):
        SamplingParams(top_p=0.0)
    with pytest.raises(ParamError, match="top_k: must be >= 0, got -1"):
        SamplingParams(top_k=-1)
    with pytest.raises(ParamError, match="temperature: must be >= 0"):
        SamplingParams(temperature=-0.1)
    with pytest.raises(ParamError, match="bogus: unknown sampling parameter"):
        SamplingParams.from_dict({"bogus": 1})
    assert SamplingParams().effective_top_k == 50 and SamplingParams(top_k=0).effective_top_k == 0


@pytest.mark.parametrize(
    "extra", [{}, {"temperature": 0.9, "top_p": 0.9, "seed": 4}, {"alg": "origin", "seed": 2}]
)
def test_fused_loop_gives_the_streamed_result(runtime, extra):
    """The one-program loop (no per-step host sync) and the per-step path produce the same canvases."""
    rt = runtime
    prompts = [rt.tokenizer.encode("def f(x):"), rt.tokenizer.encode("import re")]
    params = SamplingParams(max_new_tokens=16, steps=8, **extra)
    streamed = list(rt.generate(prompts, params, chat=False))
    fused = list(rt.generate(prompts, params, chat=False, stream=False))
    assert len(fused) == 1 and len(streamed) == 9
    assert fused[0].sequences == streamed[-1].sequences
    # Another step count in the same schedule bucket reuses the fused program.
    before = len(rt.programs)
    list(rt.generate(prompts, SamplingParams(max_new_tokens=16, steps=12, **extra), chat=False, stream=False))
    assert len(rt.programs) == before


@pytest.mark.parametrize("vocab", [152064, 8192, 4096, 40003])
def test_chunked_top_k_equals_lax_top_k(vocab):
    from model_runtime.sampling import top_k_values

    x = jnp.asarray(np.random.default_rng(vocab).standard_normal((3, 7, vocab)), jnp.float32)
    values, index = jax.jit(top_k_values, static_argnums=1)(x, 50)
    want_values, want_index = jax.lax.top_k(x, 50)
    np.testing.assert_array_equal(np.asarray(values), np.asarray(want_values))
    np.testing.assert_array_equal(np.asarray(index), np.asarray(want_index))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_chunked_top_k_with_many_equal_values(dtype):
    """Ties everywhere (a few distinct values, as bf16 logits of a large vocabulary have): the values are
    lax.top_k's, every index points at its value once, and the first index is the lowest position of the
    maximum (what a greedy pick takes)."""
    from model_runtime.sampling import top_k_values

    rng = np.random.default_rng(5)
    x = jnp.asarray(rng.integers(-20, 8, (16, 8192)), dtype)
    x = x.at[3].set(-jnp.inf).at[3, 100:140].set(1.0)  # fewer than k finite entries in row 3
    values, index = map(np.asarray, jax.jit(top_k_values, static_argnums=1)(x, 50))
    want_values, want_index = map(np.asarray, jax.lax.top_k(x, 50))
    np.testing.assert_array_equal(values, want_values)
    np.testing.assert_array_equal(index[:, 0], want_index[:, 0])
    xs = np.asarray(x)
    for row in range(x.shape[0]):
        finite = values[row] > -np.inf
        np.testing.assert_array_equal(xs[row, index[row]][finite], values[row][finite])
        assert len(set(index[row][finite].tolist())) == int(finite.sum())
