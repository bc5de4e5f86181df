"""How a reference step commits its proposals, per ``alg``: the schedule's count of masks, most
confident first (or sampled by ``alg_temp``), or, for ``origin``, every mask independently with the
schedule's probability. Small pure functions, as ``sampling.py`` (which scores the proposals).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from model_runtime.sampling import draw, transfer_counts
from model_runtime.specs import SamplerSpec


def commit_by_confidence(
    x: jax.Array,
    mask_index: jax.Array,
    x0: jax.Array,
    confidence: jax.Array,
    counts: jax.Array,
    key: jax.Array,
    spec: SamplerSpec,
    alg_temp: jax.Array,
) -> jax.Array:
    """Commit, per row, the ``counts[b]`` masked positions with the highest confidence (maskgit_plus,
    topk_margin, entropy), or a sample of them without replacement from ``softmax(conf / alg_temp)``.
    ``key``: one key, or one per position (``[B, L]``)."""
    score = jnp.where(mask_index, confidence.astype(jnp.float32), -jnp.inf)  # [B, L]
    if spec.use_alg_temp:
        # Sampling k positions without replacement from softmax(score / alg_temp) is the top-k of the
        # Gumbel-perturbed log-probabilities (the Gumbel-top-k trick); -inf stays -inf.
        logp = jax.nn.log_softmax(score / alg_temp, axis=-1)
        score = logp + draw(jax.random.gumbel, key, score.shape)
    # Rank positions by score, ties to the lower index (as lax.top_k); commit ranks < count.
    order = jnp.argsort(-score, axis=-1, stable=True)
    ranks = jnp.argsort(order, axis=-1)
    chosen = (ranks < counts[:, None]) & mask_index
    return jnp.where(chosen, x0, x)


def commit_origin(
    x: jax.Array, mask_index: jax.Array, x0: jax.Array, ratio: jax.Array, key: jax.Array
) -> jax.Array:
    """``origin``: every masked position is revealed independently with probability ``1 - s/t``; ``key``:
    one key, or one per position (``[B, L]``)."""
    chosen = (draw(jax.random.uniform, key, x.shape) < ratio) & mask_index
    return jnp.where(chosen, x0, x)


def _commit_ranked(
    x: jax.Array,
    mask_index: jax.Array,
    x0: jax.Array,
    confidence: jax.Array,
    ratio: jax.Array,
    is_last: jax.Array,
    key: jax.Array,
    spec: SamplerSpec,
    alg_temp: jax.Array,
) -> jax.Array:
    """The schedule's count of masks per row, the most confident first (or sampled by ``alg_temp``)."""
    counts = transfer_counts(jnp.sum(mask_index, axis=-1), ratio, is_last)
    return commit_by_confidence(x, mask_index, x0, confidence, counts, key, spec, alg_temp)


def _commit_independently(
    x: jax.Array,
    mask_index: jax.Array,
    x0: jax.Array,
    confidence: jax.Array,
    ratio: jax.Array,
    is_last: jax.Array,
    key: jax.Array,
    spec: SamplerSpec,
    alg_temp: jax.Array,
) -> jax.Array:
    return commit_origin(x, mask_index, x0, ratio, key)


@dataclass(frozen=True)
class Commit:
    """How a reference step commits under one ``alg``; ``keyed`` when it draws a number per position (its
    keys are then built: a greedy ranked commit never builds them)."""

    commit: Callable[..., jax.Array]
    keyed: Callable[[SamplerSpec], bool]


_RANKED = Commit(_commit_ranked, keyed=lambda spec: spec.use_alg_temp)
COMMITS: dict[str, Commit] = {
    # Every masked position revealed independently with probability 1 - s/t.
    "origin": Commit(_commit_independently, keyed=lambda spec: True),
    "maskgit_plus": _RANKED,
    "topk_margin": _RANKED,
    "entropy": _RANKED,
}
