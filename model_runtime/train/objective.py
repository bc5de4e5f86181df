"""The Dream / DiffuCoder masked-diffusion training objective.

Forward process: for each sequence draw a noise level ``t ~ U(eps, 1)`` and replace each token by
``<|mask|>`` independently with probability ``t``. The model sees the noised sequence (bidirectional
attention) and is trained with cross-entropy on the masked positions only.

Two Dream-specific details (dream-reference.md 1.5):

- The logit shift. Dream was adapted from an autoregressive model and kept next-token prediction, so
  the prediction for position ``i`` is the model output at ``i - 1`` (``shift_logits``). Training must
  use the same alignment as generation, or the model learns to predict the token under the mask from
  its own position and generation reads the wrong row.
- Position 0 is never masked. Under the shift, position 0 would be predicted from its own output; in
  generation it is always a prompt token, so we keep it visible and never score it.

Weighting: LLaDA / Dream's "1/t" ELBO weighting. Per sequence,
``loss = sum_{masked i} CE_i / t``, and the batch loss is the sum over sequences divided by the number
of scorable tokens (``B * (L - 1)``), not by the number of masked tokens. Why this and not a plain mean
over masked tokens: with probability-``t`` masking, ``E[#masked] = t * (L - 1)``, so dividing each
sequence's masked-token CE sum by ``t`` and by the token count gives an unbiased estimate of the mean
per-token CE at that noise level, and its expectation over ``t`` is the negative ELBO bound of the
masked-diffusion model (the objective the reference trains). A mean over masked tokens would weight all
noise levels alike regardless of how many tokens each hides; that is a different (un-ELBO) objective.
The 1/t factor makes low-``t`` samples noisy, which is why ``eps`` keeps ``t`` away from 0.

Instruction tuning (``sft_objective``) noises the response only and normalises by the masked-token
count, as DiffuCoder's SFT does (``response_loss``; model_runtime/train/sft.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import optax

from model_runtime.model import shift_logits
from model_runtime.train.config import DEFAULT_EPS

Metrics = dict[str, jax.Array]  # a step's auxiliary figures (scalars), by name

# What a training step minimises: (model, batch, key) -> (loss, aux metrics). ``model`` maps token ids
# [B, L] to logits [B, L, V]; ``key`` is the step's noise (a pure function of the step: exact resume).
Objective = Callable[[Callable[[jax.Array], jax.Array], Any, jax.Array], tuple[jax.Array, Metrics]]


@dataclass(frozen=True)
class NoisedBatch:
    """A masked batch: the model input, which positions were masked, and each row's noise level."""

    noisy: jax.Array  # [B, L] int32, masked positions replaced by mask_id
    masked: jax.Array  # [B, L] bool
    t: jax.Array  # [B] float32


def add_noise(
    key: jax.Array,
    tokens: jax.Array,
    mask_id: int,
    eps: float = DEFAULT_EPS,
    maskable: jax.Array | None = None,
) -> NoisedBatch:
    """Sample ``t ~ U(eps, 1)`` per row and mask each token (except position 0) with probability ``t``.

    ``maskable`` ([B, L] bool) limits the noise to some positions: SFT noises the response only, and
    the prompt stays visible (the published recipe's ``src_mask``).
    """
    b, n = tokens.shape
    k_t, k_m = jax.random.split(key)
    t = eps + (1.0 - eps) * jax.random.uniform(k_t, (b,), dtype=jnp.float32)  # [B]
    masked = jax.random.uniform(k_m, (b, n), dtype=jnp.float32) < t[:, None]  # [B, L]
    masked = masked.at[:, 0].set(False)  # position 0 is never a target under the shift
    if maskable is not None:
        masked = masked & maskable
    noisy = jnp.where(masked, mask_id, tokens)
    return NoisedBatch(noisy.astype(jnp.int32), masked, t)


def mask_at_rate(key: jax.Array, tokens: jax.Array, mask_id: int, rate: float | jax.Array) -> NoisedBatch:
    """Mask each token (except position 0) with a fixed probability ``rate`` (evaluation)."""
    b, n = tokens.shape
    masked = jax.random.uniform(key, (b, n), dtype=jnp.float32) < rate
    masked = masked.at[:, 0].set(False)
    noisy = jnp.where(masked, mask_id, tokens)
    return NoisedBatch(noisy.astype(jnp.int32), masked, jnp.full((b,), rate, jnp.float32))


def token_losses(logits: jax.Array, tokens: jax.Array) -> jax.Array:
    """Per-position cross-entropy of the *shifted* logits against the clean tokens, ``[B, L]`` float32."""
    shifted = shift_logits(logits).astype(jnp.float32)  # [B, L, V]; row i predicts token i
    return optax.softmax_cross_entropy_with_integer_labels(shifted, tokens)


def diffusion_loss(logits: jax.Array, tokens: jax.Array, batch: NoisedBatch) -> tuple[jax.Array, Metrics]:
    """The 1/t-weighted masked-diffusion loss (see the module docstring) and a few diagnostics.

    ``logits`` are the model's unshifted outputs on ``batch.noisy``. Returns ``(loss, aux)`` where aux
    holds the unweighted mean CE and the argmax accuracy over masked positions.
    """
    ce = token_losses(logits, tokens)  # [B, L]
    m = batch.masked.astype(jnp.float32)
    n_scored = tokens.shape[0] * (tokens.shape[1] - 1)
    loss = jnp.sum(jnp.sum(ce * m, axis=-1) / batch.t) / n_scored
    return loss, _masked_metrics(logits, tokens, ce, m, n_scored)


def _masked_metrics(
    logits: jax.Array, tokens: jax.Array, ce: jax.Array, m: jax.Array, n_scored: Any
) -> Metrics:
    """Unweighted CE and argmax accuracy over the masked positions, and the share of scorable ones masked."""
    n_masked = jnp.maximum(jnp.sum(m), 1.0)
    pred = jnp.argmax(shift_logits(logits), axis=-1)
    return {
        "masked_ce": jnp.sum(ce * m) / n_masked,
        "masked_acc": jnp.sum((pred == tokens) * m) / n_masked,
        "masked_frac": jnp.sum(m) / jnp.maximum(n_scored, 1),
    }


def masked_diffusion_objective(mask_id: int, eps: float = DEFAULT_EPS) -> Objective:
    """Pre-training: every position but the first may be noised; the 1/t loss of ``diffusion_loss``."""

    def objective(
        model: Callable[[jax.Array], jax.Array], tokens: jax.Array, key: jax.Array
    ) -> tuple[jax.Array, Metrics]:
        noised = add_noise(key, tokens, mask_id, eps)
        return diffusion_loss(model(noised.noisy), tokens, noised)  # [B, L, V], no padding in training

    return objective


def response_loss(
    logits: jax.Array, tokens: jax.Array, batch: NoisedBatch, response: jax.Array
) -> tuple[jax.Array, Metrics]:
    """SFT's loss, as DiffuCoder's instruction tuning computes it (LLaMA-Factory with a diffusion loss,
    apple/ml-diffucoder issue #9): ``sum_{masked i} CE_i / t`` over the batch, divided by the number of
    masked tokens. Only response positions are ever masked, so only they are scored; the end-of-turn and
    the padding after it are response tokens, which is how the model learns where its answer ends.
    ``response`` ([B, L] bool) is where the answer and its padding are.
    """
    ce = token_losses(logits, tokens)  # [B, L]
    m = batch.masked.astype(jnp.float32)
    n_masked = jnp.maximum(jnp.sum(m), 1.0)
    loss = jnp.sum(jnp.sum(ce * m, axis=-1) / batch.t) / n_masked
    return loss, _masked_metrics(logits, tokens, ce, m, jnp.sum(response))


def sft_noise(
    batch: dict[str, jax.Array], key: jax.Array, mask_id: int, eps: float
) -> tuple[NoisedBatch, jax.Array]:
    """The noised SFT batch and its response positions ([B, L] bool): the prompt is never masked."""
    tokens = batch["tokens"]
    response = jnp.arange(tokens.shape[1])[None, :] >= batch["prompt_len"][:, None]  # [B, L]
    return add_noise(key, tokens, mask_id, eps, maskable=response), response


def sft_objective(mask_id: int, eps: float = DEFAULT_EPS) -> Objective:
    """SFT on batches ``{"tokens": [B, L], "prompt_len": [B]}`` (``sft_noise``, ``response_loss``)."""

    def objective(
        model: Callable[[jax.Array], jax.Array], batch: dict[str, jax.Array], key: jax.Array
    ) -> tuple[jax.Array, Metrics]:
        noised, response = sft_noise(batch, key, mask_id, eps)
        return response_loss(model(noised.noisy), batch["tokens"], noised, response)

    return objective
