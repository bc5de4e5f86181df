"""Forward parity: our Flax model against the float32 PyTorch reference on the same checkpoint files."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch

from model_runtime.model import positions_and_mask, shift_logits
from tests.model_runtime.logits import logits as our_logits
from tests.reference import dream_torch


@pytest.fixture(scope="module")
def reference(tiny_dir):
    return dream_torch.DreamReference.from_dir(tiny_dir)


def rel_err(ours: np.ndarray, ref: np.ndarray) -> float:
    return float(np.max(np.abs(ours - ref)) / np.max(np.abs(ref)))


def test_unpadded_logits_match_reference(runtime, reference):
    rng = np.random.default_rng(1)
    ids = rng.integers(0, runtime.config.vocab_size, size=(2, 37))
    ref = reference(torch.tensor(ids)).detach().numpy()
    ours = our_logits(runtime, ids)
    assert ours.shape == ref.shape == (2, 37, runtime.config.vocab_size)
    assert rel_err(ours, ref) < 1e-4


def test_left_padded_batch_matches_reference_and_unpadded_rows(runtime, reference):
    cfg = runtime.config
    rng = np.random.default_rng(2)
    lengths = [30, 17, 5]
    n = max(lengths)
    ids = np.full((3, n), cfg.pad_token_id)
    attn = np.zeros((3, n), bool)
    for b, length in enumerate(lengths):
        ids[b, n - length :] = rng.integers(0, cfg.vocab_size - 64, size=length)
        attn[b, n - length :] = True
    # The reference's own preparation: symmetric bool [B,1,L,L] mask, tok_idx with pads at position 1.
    _, mask4, tok_idx = dream_torch.prepare(
        torch.tensor(ids), torch.tensor(attn.astype(np.int64)), 0, cfg.mask_token_id
    )
    ref = reference(torch.tensor(ids), mask4, tok_idx).detach().numpy()
    ours = our_logits(runtime, ids, attn)
    assert not np.isnan(ours).any(), "fully masked pad rows must give zeros, never NaN"
    assert rel_err(ours, ref) < 1e-4
    np.testing.assert_array_equal(np.asarray(positions_and_mask(jnp.asarray(attn))), tok_idx.numpy())
    for b, length in enumerate(lengths):
        alone = our_logits(runtime, ids[b : b + 1, n - length :])
        assert rel_err(ours[b, n - length :], alone[0]) < 1e-5


def test_pad_rows_attend_to_nothing(runtime):
    """A row of pads only (what a spare batch row looks like) yields finite logits."""
    cfg = runtime.config
    ids = np.full((1, 8), cfg.pad_token_id)
    out = our_logits(runtime, ids, np.zeros((1, 8), bool))
    assert np.isfinite(out).all()


def test_logit_shift_moves_predictions_one_position_right():
    logits = jnp.arange(2 * 4 * 3, dtype=jnp.float32).reshape(2, 4, 3)
    shifted = np.asarray(shift_logits(logits))
    np.testing.assert_array_equal(shifted[:, 0], np.asarray(logits[:, 0]))
    np.testing.assert_array_equal(shifted[:, 1:], np.asarray(logits[:, :-1]))
