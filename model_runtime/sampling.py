"""The ``diffusion_generate`` sampler of Dream / DiffuCoder (``generation_utils.py``) as small pure functions.

One denoising step: forward over the whole canvas, shift the logits, turn them into a proposed token and a
confidence per position (``sample_tokens``), then commit some masked positions (``commit_*``). Everything
works on the full ``[B, L]`` canvas with non-mask positions carrying ``-inf`` confidence, which is the
reference's ``logits[mask_index]`` gather written with fixed shapes.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

# -- the schedule ---------------------------------------------------------------------------------------


def timesteps(steps: int, eps: float) -> np.ndarray:
    """``torch.linspace(1, eps, steps + 1)`` in float32, with torch's two-sided formula.

    torch fills the first half as ``start + i * step`` and the second half as ``end - (n - 1 - i) * step``
    (the CUDA kernel and the CPU scalar path; the CPU SIMD path may differ in the last bit). numpy's
    one-sided formula differs more often, and a last-bit change can move the ``int()`` of a count.
    """
    n = steps + 1
    start, end = np.float32(1.0), np.float32(eps)
    if n == 1:
        return np.array([start], np.float32)
    step = (end - start) / np.float32(n - 1)
    i = np.arange(n, dtype=np.float32)
    half = n // 2
    out = np.where(np.arange(n) < half, start + i * step, end - (np.float32(n - 1) - i) * step)
    return out.astype(np.float32)


def transfer_ratios(steps: int, eps: float) -> np.ndarray:
    """Per step, the float32 factor ``1 - s / t`` of the reference (1.0 at the last step)."""
    ts = timesteps(steps, eps)
    ratios = (np.float32(1.0) - ts[1:] / ts[:-1]).astype(np.float32)
    ratios[-1] = np.float32(1.0)
    return ratios


def transfer_counts(n_masks: jax.Array, ratio: jax.Array, is_last: jax.Array) -> jax.Array:
    """Tokens to commit per row: ``int(n * (1 - s/t))``, or all of them at the last step.

    The reference uses one batch-averaged ``n`` (``mask_index.sum() / B``); with rows holding different
    numbers of masks (infill, hooks) that makes rows with fewer masks than ``k`` overwrite prompt tokens
    with ``<|mask|>`` (docs/reference.md; ``tests/model_runtime/test_sampler.py`` shows it). We count per
    row: identical whenever the counts are equal (plain left-padded generation), and never commits a
    position that is not a mask.
    """
    n = n_masks.astype(jnp.float32)
    k = jnp.floor(n * ratio).astype(jnp.int32)  # one f32 multiply then truncation, as float32 int()
    return jnp.where(is_last, n_masks.astype(jnp.int32), k)


def schedule_counts(n_masks: int, steps: int, eps: float) -> list[int]:
    """Host-side simulation of the per-step counts for a row starting with ``n_masks`` masks."""
    ratios = transfer_ratios(steps, eps)
    counts, left = [], n_masks
    for i, r in enumerate(ratios):
        k = left if i == steps - 1 else int(np.float32(left) * r)
        counts.append(k)
        left -= k
    return counts


# -- turning logits into proposals and confidences -------------------------------------------------------


def top_p_logits(logits: jax.Array, top_p: jax.Array) -> jax.Array:
    """Nucleus filtering as the reference: drop tokens once the cumulative probability before them
    exceeds ``top_p`` (the first token crossing it is kept); dropped logits become ``finfo.min``."""
    sorted_logits = -jnp.sort(-logits, axis=-1)
    cum = jnp.cumsum(jax.nn.softmax(sorted_logits.astype(jnp.float32), axis=-1).astype(logits.dtype), axis=-1)
    # The kept set is a prefix of the sorted order: position j is kept iff cum[j - 1] <= top_p.
    keep = jnp.concatenate([jnp.ones_like(cum[..., :1], bool), cum[..., :-1] <= top_p], axis=-1)
    n_keep = jnp.sum(keep, axis=-1, keepdims=True)
    threshold = jnp.take_along_axis(sorted_logits, n_keep - 1, axis=-1)
    return jnp.where(logits < threshold, jnp.finfo(logits.dtype).min, logits)


def _chunk_for(v: int, k: int) -> int | None:
    """The chunk size ``top_k_values`` splits a ``v``-wide axis into, or None for a plain ``lax.top_k``.

    Chunks must tile the axis exactly (no padding entries that could be picked), and leave at least
    ``2k`` chunk maxima so that the k best chunks are a small part of the axis.
    """
    return next((c for c in (16, 8, 4) if v % c == 0 and v // c >= 2 * k), None)


def top_k_values(x: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    """The ``k`` largest entries of the last axis, descending, and their indices, as ``lax.top_k``.

    The k largest entries lie in the k chunks with the largest maxima (any other chunk has k chunks whose
    maxima beat everything in it). So: chunk maxima, their top k (recursively), then one ``lax.top_k``
    over those k chunks with each chunk's maximum moved to the front. XLA's CPU TopK is a per-row partial
    sort whose cost is mostly heap insertions; starting from the k chunk maxima, which are already the
    best k candidates in order, few entries get in. On CPU that is about 2x faster than ``lax.top_k`` on
    an 8k vocabulary and 5x on 152k.

    The values are those of ``lax.top_k``; indices may come in another order only among equal values (the
    first index is still the lowest position of the maximum), which nothing downstream depends on: the
    confidences depend on values only and a greedy pick takes the first.
    """
    lead, v = x.shape[:-1], x.shape[-1]
    chunk = _chunk_for(v, k)
    if chunk is None:
        return jax.lax.top_k(x, k)
    chunks = x.reshape(*lead, v // chunk, chunk)
    top, best = top_k_values(jnp.max(chunks, axis=-1), k)  # [..., k] chunk maxima and chunk ids
    cand = jnp.take_along_axis(chunks, best[..., None], axis=-2)  # [..., k, chunk]
    lane = jnp.arange(chunk, dtype=jnp.int32)
    # Each chunk's maximum (its first occurrence) goes to the front; -inf takes its place in the chunk.
    first = jnp.min(jnp.where(cand == top[..., None], lane, chunk), axis=-1)  # [..., k]
    rest = jnp.where(lane == first[..., None], -jnp.inf, cand).reshape(*lead, k * chunk)
    values, pos = jax.lax.top_k(jnp.concatenate([top, rest], axis=-1), k)
    front = pos < k
    rest_pos = jnp.maximum(pos - k, 0)
    which = jnp.where(front, pos, rest_pos // chunk)  # index into the k chunks
    lanes = jnp.where(front, jnp.take_along_axis(first, which, axis=-1), rest_pos % chunk)
    return values, jnp.take_along_axis(best, which, axis=-1) * chunk + lanes


def top2_margin(probs: jax.Array) -> jax.Array:
    """``sorted_probs[..., 0] - sorted_probs[..., 1]`` without a sort: the max minus the max of the rest."""
    best = jnp.argmax(probs, axis=-1)
    first = jnp.max(probs, axis=-1)
    others = jnp.where(jnp.arange(probs.shape[-1]) == best[..., None], -jnp.inf, probs)
    return first - jnp.max(others, axis=-1)


@dataclass(frozen=True)
class SamplerSpec:
    """The static part of a sampling configuration: what changes the compiled program.

    Values that can vary without recompiling (temperature, top_p, alg_temp, the step's ratio) are traced
    arguments; the switches that pick code paths, and ``top_k`` (``lax.top_k`` needs a static k), live here.
    """

    alg: str = "entropy"
    do_sample: bool = False  # temperature > 0
    use_top_p: bool = False  # top_p is set and < 1
    top_k: int = 50  # 0 = off
    use_alg_temp: bool = False  # alg_temp is set and > 0

    @classmethod
    def from_params(cls, params) -> SamplerSpec:  # params: model_runtime.params.SamplingParams
        return cls(
            alg=params.alg,
            do_sample=params.temperature > 0,
            use_top_p=params.effective_top_p < 1.0,
            top_k=params.effective_top_k,
            use_alg_temp=bool(params.alg_temp),
        )


def sample_tokens(
    logits: jax.Array, key: jax.Array, spec: SamplerSpec, temperature: jax.Array, top_p: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Proposed token and confidence per position, ``logits`` ``[..., V]`` -> two ``[...]`` arrays.

    Everything stays in the logits dtype (bf16 for real checkpoints), as the reference computes
    confidences and picks by them in bf16; softmax is evaluated in float32 and rounded back, which is
    what torch does for a bf16 softmax.
    """
    dtype = logits.dtype
    if spec.do_sample:
        logits = (logits / temperature).astype(dtype)
    if spec.top_k and spec.top_k < logits.shape[-1]:
        return _sample_top_k(logits, key, spec, top_p)
    if spec.use_top_p:
        logits = top_p_logits(logits, top_p)
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1).astype(dtype)
    if spec.do_sample:
        x0 = jax.random.categorical(key, logits.astype(jnp.float32), axis=-1)
        confidence = jnp.take_along_axis(probs, x0[..., None], axis=-1)[..., 0]
    else:
        x0 = jnp.argmax(probs, axis=-1)
        confidence = jnp.max(probs, axis=-1)
    if spec.alg == "topk_margin":
        confidence = top2_margin(probs)
    elif spec.alg == "entropy":
        confidence = _neg_entropy(probs)
    return confidence, x0.astype(jnp.int32)


def _neg_entropy(probs: jax.Array) -> jax.Array:
    """``sum(p * log(p + 1e-10))`` as the reference writes it (higher = more confident)."""
    dtype = probs.dtype
    terms = probs * jnp.log(probs + jnp.asarray(1e-10, dtype))
    return jnp.sum(terms.astype(jnp.float32), axis=-1).astype(dtype)


def _sample_top_k(
    logits: jax.Array, key: jax.Array, spec: SamplerSpec, top_p: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """``sample_tokens`` when top-k filtering is on (the reference default, k = 50), on k values only.

    After top-k every other logit is ``finfo.min``, so its probability is exactly 0 and it contributes
    nothing to the softmax, the sample, the margin or the entropy (``0 * log(1e-10) = 0``). Working on
    the sorted top k instead of the vocabulary gives the same numbers at a fraction of the cost; this is
    most of a step's sampling time on a 152k vocabulary. (A tie at the k-th logit would keep extra tokens
    in the reference; with continuous logits that does not happen.)
    """
    dtype = logits.dtype
    vals, idx = top_k_values(logits, spec.top_k)  # [..., k], sorted descending
    if spec.use_top_p:
        # The reference applies top-p first, on the full distribution. Its kept set is a prefix of the
        # sorted order, so intersecting it with the top k only needs the first k full-softmax
        # probabilities: p_i = exp(l_i - logsumexp(l)).
        lse = jax.nn.logsumexp(logits.astype(jnp.float32), axis=-1, keepdims=True)
        cum = jnp.cumsum(jnp.exp(vals.astype(jnp.float32) - lse).astype(dtype), axis=-1)
        keep = jnp.concatenate([jnp.ones_like(cum[..., :1], bool), cum[..., :-1] <= top_p], axis=-1)
        vals = jnp.where(keep, vals, jnp.finfo(dtype).min)
    probs = jax.nn.softmax(vals.astype(jnp.float32), axis=-1).astype(dtype)  # [..., k]
    if spec.do_sample:
        pick = jax.random.categorical(key, vals.astype(jnp.float32), axis=-1)[..., None]
    else:
        pick = jnp.argmax(probs, axis=-1)[..., None]
    x0 = jnp.take_along_axis(idx, pick, axis=-1)[..., 0]
    confidence = jnp.take_along_axis(probs, pick, axis=-1)[..., 0]
    if spec.alg == "topk_margin":
        confidence = top2_margin(probs)
    elif spec.alg == "entropy":
        confidence = _neg_entropy(probs)
    return confidence, x0.astype(jnp.int32)


# -- committing ------------------------------------------------------------------------------------------


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
    topk_margin, entropy), or a sample of them without replacement from ``softmax(conf / alg_temp)``."""
    score = jnp.where(mask_index, confidence.astype(jnp.float32), -jnp.inf)  # [B, L]
    if spec.use_alg_temp:
        # Sampling k positions without replacement from softmax(score / alg_temp) is the top-k of the
        # Gumbel-perturbed log-probabilities (the Gumbel-top-k trick); -inf stays -inf.
        logp = jax.nn.log_softmax(score / alg_temp, axis=-1)
        score = logp + jax.random.gumbel(key, score.shape, jnp.float32)
    # Rank positions by score, ties to the lower index (as lax.top_k); commit ranks < count.
    order = jnp.argsort(-score, axis=-1, stable=True)
    ranks = jnp.argsort(order, axis=-1)
    chosen = (ranks < counts[:, None]) & mask_index
    return jnp.where(chosen, x0, x)


def commit_origin(
    x: jax.Array, mask_index: jax.Array, x0: jax.Array, ratio: jax.Array, key: jax.Array
) -> jax.Array:
    """``origin``: every masked position is revealed independently with probability ``1 - s/t``."""
    chosen = (jax.random.uniform(key, x.shape) < ratio) & mask_index
    return jnp.where(chosen, x0, x)
