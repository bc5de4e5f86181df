"""Sampler parity with the published ``diffusion_generate``, step by step and tie-aware.

For every step we feed the same canvas to the PyTorch reference step and to our compiled step and
compare what each commits. Near-ties between masked positions are common on random models, so a
position may differ only where the reference's confidences tie at the selection boundary (float
sums in a different order break ties differently); everything else (counts, positions, tokens) must
be identical.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from model_runtime import SamplingParams
from model_runtime.sampling import schedule_counts, timesteps
from tests.reference import dream_torch
from tests.reference.parity import assert_step_matches


@pytest.fixture(scope="module")
def reference(tiny_dir):
    return dream_torch.DreamReference.from_dir(tiny_dir)


def left_padded(runtime, prompts: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    n = max(map(len, prompts))
    ids = np.full((len(prompts), n), runtime.config.pad_token_id, np.int64)
    attn = np.zeros((len(prompts), n), np.int64)
    for b, p in enumerate(prompts):
        ids[b, n - len(p) :] = p
        attn[b, n - len(p) :] = 1
    return ids, attn


CASES = [
    ("entropy", {}),
    ("maskgit_plus", {}),
    ("topk_margin", {}),
    ("entropy", {"top_p": 0.9}),
    ("maskgit_plus", {"top_k": 5}),
    ("topk_margin", {"top_p": 0.8, "top_k": 20}),
    ("entropy", {"top_k": 0}),
]


@pytest.mark.parametrize("alg,extra", CASES, ids=[f"{a}-{e}" for a, e in CASES])
def test_greedy_steps_follow_reference_with_left_padding(runtime, reference, alg, extra):
    tok = runtime.tokenizer
    prompts = [tok.encode("def add(a, b):\n    return"), tok.encode("import os")]
    new, steps = 12, 8
    params = SamplingParams(max_new_tokens=new, steps=steps, alg=alg, temperature=0.0, **extra)
    ids, attn = left_padded(runtime, prompts)
    x, mask4, tok_idx = dream_torch.prepare(
        torch.tensor(ids), torch.tensor(attn), new, runtime.config.mask_token_id
    )
    attn_full = np.concatenate([attn, np.ones((len(prompts), new), np.int64)], axis=1).astype(bool)
    ref_top_k = dream_torch.INHERITED_TOP_K if params.top_k is None else (params.top_k or None)
    canvas = x.numpy()
    mask_id = runtime.config.mask_token_id
    for i in range(steps):
        # The published step commits one batch-averaged count in every row. Rows hold equal numbers of
        # masks unless the model proposed <|mask|> itself somewhere (it stays masked); then diffu's
        # deliberate difference applies, per-row counts, which is the published step run on each row
        # alone (docs/reference.md).
        rows = [slice(None)] if len(set((canvas == mask_id).sum(axis=1))) == 1 else [
            slice(b, b + 1) for b in range(len(prompts))
        ]  # fmt: skip
        parts = [
            dream_torch.step(
                reference,
                torch.tensor(canvas[r]),
                mask4[r],
                tok_idx[r],
                i,
                steps=steps,
                alg=alg,
                temperature=0.0,
                top_p=params.top_p,
                top_k=ref_top_k,
                mask_id=mask_id,
            )
            for r in rows
        ]
        ref, conf = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
        ours = runtime.step_canvas(canvas, attn_full, i, params)
        assert_step_matches(canvas, ours, ref.numpy(), conf.numpy(), mask_id, f"step {i}")
        canvas = ours  # continue along our own trajectory
    # No mask needs to be left: the last step commits every remaining one, unless the model proposes
    # <|mask|> there, which the reference keeps as well (the last step's sets were compared above).
    assert np.sum(canvas == mask_id) < np.sum(x.numpy() == mask_id) // 4


def test_generate_history_follows_reference_sampler(runtime, reference):
    """The acceptance run: 32 new tokens in 32 steps, greedy; every history canvas checked."""
    tok = runtime.tokenizer
    prompt = tok.encode("def add(a, b):")
    params = SamplingParams(max_new_tokens=32, steps=32, temperature=0.0)
    events = list(runtime.generate([prompt], params, chat=False))
    history = [np.array(e.content) for e in events[:-1]]
    assert len(history) == 32
    x, mask4, tok_idx = dream_torch.prepare(torch.tensor([prompt]), None, 32, runtime.config.mask_token_id)
    prev = x.numpy()
    for i, canvas in enumerate(history):
        ref, conf, k = dream_torch.step(
            reference, torch.tensor(prev), mask4, tok_idx, i, steps=32, mask_id=runtime.config.mask_token_id
        )
        assert_step_matches(
            prev, canvas, ref.numpy(), conf.numpy(), runtime.config.mask_token_id, f"step {i}"
        )
        prev = canvas
    assert events[-1].sequences[0] == history[-1][0].tolist()


@pytest.mark.parametrize(
    "n,steps", [(32, 32), (64, 64), (256, 256), (512, 512), (256, 128), (100, 7), (16, 3)]
)
def test_schedule_counts_match_reference_formula(n, steps):
    counts = schedule_counts(n, steps, 1e-3)
    assert counts == dream_torch.transfer_counts(n, steps)
    assert sum(counts) == n
    if n == steps:
        assert counts == [0] + [1] * (steps - 2) + [2]
    if (n, steps) == (256, 128):
        assert counts == [1] + [2] * 126 + [3]


@pytest.mark.parametrize("steps", [1, 2, 7, 32, 128, 255, 256, 512, 1000])
@pytest.mark.parametrize("eps", [1e-3, 1e-2, 0.05])
def test_timesteps_within_one_ulp_of_torch_linspace(steps, eps):
    # torch's CPU kernel vectorises (base + j * step per SIMD lane), so its last bit depends on the SIMD
    # width; CUDA and the scalar path use the two-sided formula we implement. The counts are what matter.
    ours, ref = timesteps(steps, eps), torch.linspace(1, eps, steps + 1).numpy()
    assert np.all(np.abs(ours - ref) <= np.spacing(ref))


def test_schedule_counts_match_reference_across_lengths():
    for steps in (1, 3, 16, 64, 128, 512):
        for n in range(1, 513, 17):
            assert schedule_counts(n, steps, 1e-3) == dream_torch.transfer_counts(n, steps), (n, steps)
