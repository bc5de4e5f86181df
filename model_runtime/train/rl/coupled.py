"""The pure pieces of coupled-GRPO: mask draws, the coupled log-probability estimate, advantages, loss.

Shapes: B completions in a batch (prompts x ``num_generations``), P prompt tokens (left-padded), T
completion tokens, L = P + T, V vocabulary, C rows per normalisation chunk (the published
``per_device_train_batch_size``), A chunks per published device (its ``gradient_accumulation_steps``).

The estimate (``coupled_logps``). A masked-diffusion model has no exact sequence likelihood, so the
published trainer scores each completion token from three forward passes over the same sequence: pass 0
with every completion token masked, pass 1 with the tokens whose uniform draw ``r < t`` masked, pass 2
with the complement (``r > t``) masked. A token's log-probability is ``(lp0 + lp1 / t) / 2`` when pass 1
hid it and ``(lp0 + lp2 / (1 - t)) / 2`` otherwise: every token is scored once with the others visible
("coupled" passes 1 and 2 see complementary masks), weighted by the ELBO's 1/t, and averaged with the
fully masked pass. The prompt is never masked.

The masks (``group_masks``). The published trainer draws them on each device, from a per-iteration mask
seed: one ``t ~ U(0.2, 0.8)`` for the device's rows and one ``[C, T]`` block of ``r`` repeated over its A
micro-batches. Here a device group is C x A consecutive rows (one prompt's generations in the recipe: 5 x
2 = 10), and group ``g`` draws from ``fold_in(mask_seed, g)``: a step sees one independent ratio per
group, as a published step sees one per device. The same seed gives the same masks to the old-policy,
reference and current log-probabilities of an iteration, which makes their ratio and KL meaningful.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

MASK_RATIO_RANGE = (0.2, 0.8)  # coupled_grpo.forward_process: random.uniform(0.2, 0.8)


@partial(jax.tree_util.register_dataclass, data_fields=["t", "r"], meta_fields=[])
@dataclass(frozen=True)
class MaskDraw:
    """Masks: the ratio ``t`` and the per-token draws ``r``. One device group's (``draw_masks``): ``t``
    ``[]``, ``r`` ``[C, T]``; every row of a batch (``group_masks``): ``t`` ``[B]``, ``r`` ``[B, T]``."""

    t: jax.Array  # float32
    r: jax.Array  # float32 in [0, 1)


def draw_masks(key: jax.Array, chunk: int, length: int) -> MaskDraw:
    """One device group's masks from ``key``: a ratio and ``[chunk, length]`` uniform draws."""
    k_t, k_r = jax.random.split(key)
    lo, hi = MASK_RATIO_RANGE
    t = jax.random.uniform(k_t, (), jnp.float32, minval=lo, maxval=hi)
    return MaskDraw(t, jax.random.uniform(k_r, (chunk, length), jnp.float32))


@partial(jax.jit, static_argnums=(1, 2, 3, 4))
def group_masks(key: jax.Array, groups: int, chunk: int, accumulation: int, length: int) -> MaskDraw:
    """Per-row masks of ``groups`` device groups of ``chunk x accumulation`` rows each, from mask seed
    ``key``: group ``g`` draws ``draw_masks(fold_in(key, g), chunk, length)``; its ``t`` holds for all its
    rows and its ``[chunk, length]`` draws repeat over its ``accumulation`` chunks (the published
    ``forward_process`` draws ``b // gradient_accumulation_steps`` rows and tiles them, so that each
    micro-batch, drawn again from the same seed in ``compute_loss``, sees the rows its old and reference
    log-probs were scored with)."""
    draws = jax.vmap(lambda g: draw_masks(jax.random.fold_in(key, g), chunk, length))(jnp.arange(groups))
    rows = chunk * accumulation
    t = jnp.repeat(draws.t, rows)  # [B]
    r = jnp.tile(draws.r, (1, accumulation, 1)).reshape(groups * rows, length)  # [B, T]
    return MaskDraw(t, r)


def coupled_logps(
    graphdef: nnx.GraphDef,
    params: nnx.State,
    ids: jax.Array,
    attention_mask: jax.Array | None,
    t: jax.Array,
    r: jax.Array,
    mask_id: int,
) -> jax.Array:
    """Per-token log-probabilities ``[B, T]`` (float32) of the completions in ``ids`` (``[B, L]``, the
    last ``T = r.shape[1]`` columns), by the three-pass estimate of the module docstring; ``t`` is ``[B]``
    and ``r`` ``[B, T]``, one row each (``group_masks``).

    ``attention_mask`` (``[B, L]``, True on a row's own tokens) hides each row's left padding: pads give no
    keys and positions count from the row's first real token, so every row scores exactly as it would
    alone, as a published device batch (one prompt's generations) holds no pads. None attends every
    column at positions ``0..L-1``, the published ``model(batch)`` call as it is.
    """
    b, n = ids.shape
    p = n - r.shape[1]
    comp = ids[:, p:]  # [B, T]
    ratio = t[:, None]  # [B, 1]
    hidden1 = r < ratio  # [B, T] masked in pass 1
    hidden2 = r > ratio  # masked in pass 2 (r == t: in neither, as published)
    passes = [
        jnp.full_like(comp, mask_id),
        jnp.where(hidden1, mask_id, comp),
        jnp.where(hidden2, mask_id, comp),
    ]
    x = jnp.concatenate([jnp.tile(ids[:, :p], (3, 1)), jnp.concatenate(passes, axis=0)], axis=1)  # [3B, L]
    attn = None if attention_mask is None else jnp.tile(attention_mask, (3, 1))
    model = nnx.merge(graphdef, params)
    hidden, _ = model.hidden(x, attn)  # [3B, L, D]
    # Dream's shift: the output at i - 1 predicts token i, so positions P-1 .. L-2 score the completion.
    logits = model.head(hidden[:, p - 1 : n - 1]).astype(jnp.float32)  # [3B, T, V]
    logp = jax.nn.log_softmax(logits, axis=-1)
    targets = jnp.tile(comp, (3, 1))[..., None]  # [3B, T, 1]
    lp = jnp.take_along_axis(logp, targets, axis=-1)[..., 0].reshape(3, b, -1)  # [3, B, T]
    # The published weights are [1, 1/t, 1/(1-t)] multiplied in (not divided): keep the same rounding.
    w1, w2 = 1.0 / ratio, 1.0 / (1.0 - ratio)
    return (lp[0] + jnp.where(hidden1, lp[1] * w1, lp[2] * w2)) / 2


@dataclass(frozen=True)
class LossSettings:
    """The clipped objective's constants (published recipe: epsilon 0.5 both ways, beta 0.01)."""

    epsilon_low: float = 0.5
    epsilon_high: float = 0.5
    beta: float = 0.01
    chunk: int = 5  # rows per token-level normalisation (published per_device_train_batch_size)


def _chunk_means(x: jax.Array, mask: jax.Array, chunk: int) -> jax.Array:
    """Per chunk of rows, ``sum(x * mask) / sum(mask)`` (the denominator at least 1): ``[B // chunk]``."""
    b, t = x.shape
    x = (x * mask).reshape(b // chunk, chunk * t)
    return jnp.sum(x, axis=-1) / jnp.maximum(jnp.sum(mask.reshape(b // chunk, chunk * t), axis=-1), 1.0)


def grpo_loss(
    logps: jax.Array,
    old_logps: jax.Array | None,
    ref_logps: jax.Array | None,
    advantages: jax.Array,
    completion_mask: jax.Array,
    settings: LossSettings,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The published ``compute_loss`` over a batch: ``(loss, metrics)``.

    ``old_logps`` None means ``num_iterations == 1``: the ratio is taken against the current values
    without gradient (exactly 1, with the policy gradient flowing through the numerator). Each chunk of
    ``settings.chunk`` rows is normalised by its own completion tokens and the chunks are averaged: the
    published loss is per micro-batch on each device, divided by the accumulation steps, averaged over
    devices by the gradient all-reduce.
    """
    old = jax.lax.stop_gradient(logps) if old_logps is None else old_logps
    ratio = jnp.exp(logps - old)  # [B, T]
    clipped = jnp.clip(ratio, 1 - settings.epsilon_low, 1 + settings.epsilon_high)
    a = advantages[:, None].astype(jnp.float32)  # [B, 1]
    per_token = -jnp.minimum(ratio * a, clipped * a)
    m = completion_mask.astype(jnp.float32)
    metrics = {}
    if settings.beta != 0.0:
        assert ref_logps is not None, "beta != 0 needs the reference log-probs"
        d = ref_logps - logps
        kl = jnp.exp(d) - d - 1  # k3: unbiased, always >= 0
        per_token = per_token + settings.beta * kl
        metrics["kl"] = jnp.mean(_chunk_means(kl, m, settings.chunk))
    loss = jnp.mean(_chunk_means(per_token, m, settings.chunk))
    low = (ratio < 1 - settings.epsilon_low) & (a < 0)
    high = (ratio > 1 + settings.epsilon_high) & (a > 0)
    metrics["clip_ratio_low"] = jnp.mean(_chunk_means(low.astype(jnp.float32), m, settings.chunk))
    metrics["clip_ratio_high"] = jnp.mean(_chunk_means(high.astype(jnp.float32), m, settings.chunk))
    metrics["clip_ratio"] = jnp.mean(_chunk_means((low | high).astype(jnp.float32), m, settings.chunk))
    return loss, metrics


# -- host-side pieces (numpy) ---------------------------------------------------------------------------


def leave_one_out(rewards: np.ndarray, group: int) -> np.ndarray:
    """Advantages ``r_i - mean_{j != i} r_j`` within each group of ``group`` consecutive completions.

    Not divided by the group's standard deviation (the recipe's ``scale_rewards: false``). float32, as
    the published tensors.
    """
    r = np.asarray(rewards, np.float32).reshape(-1, group)  # [N, G]
    baseline = (r.sum(axis=1, keepdims=True) - r) / np.float32(group - 1)
    return (r - baseline).reshape(-1)


def group_std(rewards: np.ndarray, group: int) -> np.ndarray:
    """Each group's sample standard deviation (torch's unbiased ``std``), ``[N]``."""
    return np.asarray(rewards, np.float64).reshape(-1, group).std(axis=1, ddof=1)


def completion_mask(completion_ids: np.ndarray, eos_id: int) -> np.ndarray:
    """1 up to and including the first ``eos_id`` (``<|im_end|>``) of each row, 0 after; all 1 without."""
    ids = np.asarray(completion_ids)
    is_eos = ids == eos_id
    first = np.where(is_eos.any(axis=1), is_eos.argmax(axis=1), ids.shape[1])
    return (np.arange(ids.shape[1])[None, :] <= first[:, None]).astype(np.int32)
