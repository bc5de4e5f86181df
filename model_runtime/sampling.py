"""The ``diffusion_generate`` sampler of Dream / DiffuCoder (``generation_utils.py``) as small pure functions.

One denoising step: forward over the whole canvas, shift the logits, turn them into a proposed token and a
confidence per position (``sample_tokens``), then commit some masked positions (``commit_*``). Everything
works on the full ``[B, L]`` canvas with non-mask positions carrying ``-inf`` confidence, which is the
reference's ``logits[mask_index]`` gather written with fixed shapes.

Randomness: every function takes one key, or one key per row or position (see :func:`draw`). The runtime
passes a key per position, derived from the request's seed, the step and the position's distance from the
end of its row (:func:`position_keys`), so a row draws the same numbers alone or in any batch, bucket or
gathered layout.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from model_runtime.specs import SamplerSpec

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


def draw(sampler: Callable[..., jax.Array], key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """``sampler(key, shape)`` (e.g. ``jax.random.gumbel``) where ``key`` is one key, or an array of keys
    whose shape is a prefix of ``shape``: each key then draws its own trailing block, so an entry's
    numbers depend on its key alone, never on the array's size or its neighbours."""
    if key.ndim == 0:
        return sampler(key, shape)
    tail = shape[key.ndim :]

    def one(k: jax.Array) -> jax.Array:
        return sampler(k, tail)

    f = one
    for _ in range(key.ndim):
        f = jax.vmap(f)
    return f(key)


def position_keys(row_keys: jax.Array, dist: jax.Array) -> jax.Array:
    """``[B]`` row keys and ``[B, M]`` positions (counted from the end of the row, which left padding and
    the bucket length leave unchanged) -> ``[B, M]`` keys, one per position."""
    return jax.vmap(lambda k, d: jax.vmap(lambda e: jax.random.fold_in(k, e))(d))(row_keys, dist)


def split_rows(row_keys: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Two independent keys per row (``[B]`` each): one to sample proposals, one to commit."""
    pairs = jax.vmap(jax.random.split)(row_keys)  # [B, 2]
    return pairs[:, 0], pairs[:, 1]


def _categorical(key: jax.Array, logits: jax.Array) -> jax.Array:
    """One draw from ``softmax(logits)`` over the last axis per entry (the Gumbel-max trick, as
    ``jax.random.categorical``), with ``key`` as in :func:`draw`."""
    noise = draw(jax.random.gumbel, key, logits.shape)
    return jnp.argmax(logits.astype(jnp.float32) + noise, axis=-1)


def sample_tokens(
    logits: jax.Array,
    key: jax.Array,
    spec: SamplerSpec,
    temperature: jax.Array,
    top_p: jax.Array,
    top_k: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Proposed token and confidence per position, ``logits`` ``[..., V]`` -> two ``[...]`` arrays.

    Everything stays in the logits dtype (bf16 for real checkpoints), as the reference computes
    confidences and picks by them in bf16; softmax is evaluated in float32 and rounded back, which is
    what torch does for a bf16 softmax. ``key``: one key, or one per position (``logits.shape[:-1]``).
    ``top_k``: a traced k in ``1..spec.top_k`` (then ``spec.top_k`` is the program's width), or None for
    ``k = spec.top_k``.
    """
    dtype = logits.dtype
    if spec.do_sample:
        logits = (logits / temperature).astype(dtype)
    if spec.top_k and (top_k is not None or spec.top_k < logits.shape[-1]):
        return _sample_top_k(logits, key, spec, top_p, spec.top_k if top_k is None else top_k)
    if spec.use_top_p:
        logits = top_p_logits(logits, top_p)
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1).astype(dtype)
    if spec.do_sample:
        x0 = _categorical(key, logits)
        confidence = jnp.take_along_axis(probs, x0[..., None], axis=-1)[..., 0]
    else:
        x0 = jnp.argmax(probs, axis=-1)
        confidence = jnp.max(probs, axis=-1)
    return CONFIDENCE[spec.alg](probs, confidence, None), x0.astype(jnp.int32)


def _neg_entropy(probs: jax.Array, extra: jax.Array | None = None) -> jax.Array:
    """``sum(p * log(p + 1e-10))`` as the reference writes it (higher = more confident); ``extra``
    (``[...]``) more tokens with the last entry's probability count too."""
    dtype = probs.dtype
    terms = probs * jnp.log(probs + jnp.asarray(1e-10, dtype))
    total = jnp.sum(terms.astype(jnp.float32), axis=-1)
    if extra is not None:
        total = total + extra.astype(jnp.float32) * terms[..., -1].astype(jnp.float32)
    return total.astype(dtype)


def _sample_top_k(
    logits: jax.Array, key: jax.Array, spec: SamplerSpec, top_p: jax.Array, k: jax.Array | int
) -> tuple[jax.Array, jax.Array]:
    """``sample_tokens`` when top-k filtering is on (the reference default, k = 50), on a few values only.

    The reference keeps every logit >= the k-th largest (``logits < topk(...)[..., -1]`` is dropped), so
    a tie at the k-th value keeps more than k tokens. We rank the ``spec.top_k + 1`` largest logits (one
    more than k can be) and keep those >= the k-th; every other logit is ``finfo.min`` in the reference,
    so its probability is exactly 0 and it adds nothing to the softmax, the sample, the margin or the
    entropy (``0 * log(1e-10) = 0``). Working on the ranked candidates instead of the vocabulary gives
    the same numbers at a fraction of the cost: this is most of a step's sampling time on a 152k
    vocabulary.

    When even the last candidate is kept, more tokens may tie with it beyond the ranked ones (bf16 logits
    tie often). They are counted (``_ties_beyond``): the softmax and the entropy include them, and a sample
    draws among the candidates plus one entry for the whole tie class at the k-th value (its total weight:
    logit ``kth + log(count)``), which then takes one of those tokens uniformly (``_tied_token``).
    """
    dtype = logits.dtype
    v = logits.shape[-1]
    n = min(spec.top_k + 1, v)
    vals, idx = top_k_values(logits, n)  # [..., n], sorted descending
    # The k-th largest value (k traced or static); k >= n (only when n == v) keeps every candidate.
    kth = jax.lax.dynamic_index_in_dim(vals, jnp.clip(k, 1, n) - 1, axis=-1, keepdims=True)
    keep = vals >= kth
    lse = cum = None
    if spec.use_top_p:
        # The reference applies top-p first, on the full distribution. Its kept set is a prefix of the
        # sorted order, so intersecting it with the top k only needs the first n full-softmax
        # probabilities: p_i = exp(l_i - logsumexp(l)). (Fewer than k kept by top-p: the reference's
        # k-th largest is then finfo.min and the top-k filter keeps them all, as ``&`` does here.)
        lse = jax.nn.logsumexp(logits.astype(jnp.float32), axis=-1, keepdims=True)
        cum = jnp.cumsum(jnp.exp(vals.astype(jnp.float32) - lse).astype(dtype), axis=-1)
        keep &= jnp.concatenate([jnp.ones_like(cum[..., :1], bool), cum[..., :-1] <= top_p], axis=-1)
    kept = jnp.where(keep, vals, jnp.finfo(dtype).min).astype(jnp.float32)
    if n < v:
        extra = _ties_beyond(logits, vals, kth, keep, lse, cum, top_p)  # [...] int32
    else:
        extra = jnp.zeros(vals.shape[:-1], jnp.int32)
    # The softmax over the kept tokens: the candidates, and the tied ones past them (weight extra * e^kth;
    # log(0) = -inf for none). A tied token's probability is the last candidate's, probs[..., -1].
    tail = kth.astype(jnp.float32) + jnp.log(extra.astype(jnp.float32))[..., None]
    probs = jax.nn.softmax(jnp.concatenate([kept, tail], axis=-1), axis=-1)[..., :n].astype(dtype)
    if spec.do_sample:
        pick, x0 = _sample_kept(logits, key, vals, idx, kth, keep, kept, extra if n < v else None)
    else:
        pick = jnp.argmax(probs, axis=-1)  # never a tied token past the candidates: the best is one
        x0 = jnp.take_along_axis(idx, pick[..., None], axis=-1)[..., 0]
    confidence = jnp.take_along_axis(probs, pick[..., None], axis=-1)[..., 0]
    return CONFIDENCE[spec.alg](probs, confidence, extra), x0.astype(jnp.int32)


def _sample_kept(
    logits: jax.Array,
    key: jax.Array,
    vals: jax.Array,
    idx: jax.Array,
    kth: jax.Array,
    keep: jax.Array,
    kept: jax.Array,
    extra: jax.Array | None,
) -> tuple[jax.Array, jax.Array]:
    """A sampled token among the kept ones: (its candidate index for its probability, token id).

    Without ties past the candidates (``extra`` None: every token is a candidate, or 0 for a position)
    this is a categorical draw over them. With ties, the whole tie class
    at the k-th value is one entry of weight ``count * e^kth`` (its candidates leave their own places),
    and a draw of it takes one member uniformly: together, a draw of one token from the kept ones.
    """
    n = vals.shape[-1]
    if extra is None:
        pick = _categorical(key, kept)
        return pick, jnp.take_along_axis(idx, pick[..., None], axis=-1)[..., 0]
    in_class = (vals == kth) & keep & (extra > 0)[..., None]
    ties = jnp.sum(in_class, axis=-1) + extra
    cands = jnp.concatenate(
        [
            jnp.where(in_class, -jnp.inf, kept),
            kth.astype(jnp.float32) + jnp.log(ties.astype(jnp.float32))[..., None],
        ],
        axis=-1,
    )
    pick = _categorical(key, cands)  # n: the tie class (drawn only when it reaches past the candidates)
    at = jnp.minimum(pick, n - 1)  # a tied token's probability is the last candidate's
    x0 = jnp.take_along_axis(idx, at[..., None], axis=-1)[..., 0]
    drawn = pick == n

    def resolve() -> jax.Array:
        return jnp.where(drawn, _tied_token(logits, kth, key), x0)

    # Rare (ties past the candidates, and a draw landing on them): the vocabulary-wide pick only then.
    return at, jax.lax.cond(jnp.any(drawn), resolve, lambda: x0)


def _ties_beyond(
    logits: jax.Array,
    vals: jax.Array,
    kth: jax.Array,
    keep: jax.Array,
    lse: jax.Array | None,
    cum: jax.Array | None,
    top_p: jax.Array,
) -> jax.Array:
    """How many tokens past the ranked candidates ``vals`` the reference also keeps: those tied with the
    k-th value when every candidate is kept, as far as top-p lets the kept prefix go on. ``[...]`` int32."""
    total = jnp.sum(logits >= kth, axis=-1, dtype=jnp.int32)
    beyond = jnp.where(keep[..., -1], total - jnp.sum(vals >= kth, axis=-1, dtype=jnp.int32), 0)
    if cum is None or lse is None:
        return beyond
    # Top-p keeps the next tied token while the cumulative probability before it is <= top_p; each adds
    # the same probability p.
    p = jnp.exp(kth[..., 0].astype(jnp.float32) - lse[..., 0])
    room = jnp.floor((top_p - cum[..., -1].astype(jnp.float32)) / p) + 1
    room = jnp.where(cum[..., -1] <= top_p, jnp.clip(room, 0, beyond), 0)
    return jnp.minimum(beyond, room.astype(jnp.int32))


def _tied_token(logits: jax.Array, kth: jax.Array, key: jax.Array) -> jax.Array:
    """Uniformly one of the tokens whose logit equals ``kth`` (``[..., 1]``): the one with the largest
    random priority drawn from the position's key for every vocabulary entry. (Where top-p keeps only some
    of a tie class, which ones the reference keeps depends on its unstable sort; here each is as likely.)"""
    priority = draw(_token_priority, key, logits.shape)  # [..., V] in [0, 1)
    return jnp.argmax(jnp.where(logits == kth, priority, -1.0), axis=-1).astype(jnp.int32)


def _token_priority(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """Random priorities for ``_tied_token``, independent of the Gumbel noise the same key gives
    ``_categorical`` (uniform floats: equal draws, one chance in millions, go to the lower index)."""
    return jax.random.uniform(jax.random.fold_in(key, 1), shape)


# -- the reference's algorithms: how each scores a proposal --------------------------------------------


def _drawn(probs: jax.Array, picked: jax.Array, extra: jax.Array | None) -> jax.Array:
    """The proposal's own probability (``origin``, ``maskgit_plus``)."""
    return picked


def _margin(probs: jax.Array, picked: jax.Array, extra: jax.Array | None) -> jax.Array:
    return top2_margin(probs)


def _entropy(probs: jax.Array, picked: jax.Array, extra: jax.Array | None) -> jax.Array:
    return _neg_entropy(probs, extra)


# A proposal's confidence per ``alg``, from the kept tokens' probabilities ``[..., K]``, the proposal's own
# probability and the count of tied tokens past the ranked ones (``commit.COMMITS`` has how each commits).
CONFIDENCE: dict[str, Callable[[jax.Array, jax.Array, jax.Array | None], jax.Array]] = {
    "origin": _drawn,
    "maskgit_plus": _drawn,
    "topk_margin": _margin,
    "entropy": _entropy,
}
