"""The Dream / DiffuCoder transformer in Flax NNX: a Qwen2 decoder stack with bidirectional attention.

Shapes: B batch, L canvas length, D hidden, H query heads, K kv heads, G = H // K query heads per kv head,
E head dim, F MLP hidden, V vocabulary. Parameters are kept in the layout the einsums want
(``[D, H, E]`` for q), so the checkpoint converter transposes/reshapes PyTorch's ``[out, in]`` once.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from model_runtime import quant as q
from model_runtime.config import DreamConfig
from model_runtime.weights import Path_, by_path

KV = tuple[jax.Array, jax.Array]  # one layer's keys and values, [B, K, L, E] each, after RoPE


class _Params:
    """Creates a module's parameters from the parameter table (``weights.py``): shape and initialiser,
    or, for a weight under quantization, a ``quant.QArray`` placeholder (integers and scales as one
    value) to be filled by the loader."""

    def __init__(self, cfg: DreamConfig, dtype: jnp.dtype, rngs: nnx.Rngs, quant: q.QuantSpec | None):
        self.table, self.dtype, self.rngs, self.quant = by_path(cfg), dtype, rngs, quant

    def param(self, path: Path_) -> nnx.Param[jax.Array]:
        """A float parameter (norms and biases are never quantized)."""
        spec = self.table[path]
        if spec.init == "normal":
            value = nnx.initializers.normal(0.02)(self.rngs.params(), spec.shape, self.dtype)
        else:
            value = (jnp.zeros if spec.init == "zeros" else jnp.ones)(spec.shape, self.dtype)
        return nnx.Param(value)

    def weight(self, path: Path_) -> nnx.Param[q.Weight]:
        """A matmul weight: float, or quantized when the spec covers it."""
        spec = self.table[path]
        value: q.Weight
        if self.quant is not None and self.quant.applies(spec):
            # Placeholders of the right shapes and dtypes: only ever built abstractly, then loaded.
            value = q.placeholder(spec, self.quant, self.dtype)
        else:
            value = self.param(path).get_value()
        return nnx.Param(value)


def shift_logits(logits: jax.Array) -> jax.Array:
    """Dream's one-position logit shift: the prediction for position i is the output at i - 1.

    Dream was adapted from an autoregressive model and kept next-token prediction (the
    ``torch.cat([logits[:, :1], logits[:, :-1]], dim=1)`` in its ``_sample``); position 0 reuses its own
    output (it is always a prompt token, never a mask).
    """
    return jnp.concatenate([logits[:, :1], logits[:, :-1]], axis=1)


def read_block(a: jax.Array, start: jax.Array, n: int) -> jax.Array:
    """``a[:, start : start + n]`` for ``a`` ``[B, L, ...]``; ``start`` a scalar or ``[B]`` (one per row)."""
    if jnp.ndim(start) == 0:
        return jax.lax.dynamic_slice_in_dim(a, start, n, axis=1)
    return jax.vmap(lambda row, s: jax.lax.dynamic_slice_in_dim(row, s, n, axis=0))(a, start)


def write_block(cache: jax.Array, new: jax.Array, start: jax.Array) -> jax.Array:
    """``cache[:, :, start : start + n] = new`` for ``[B, K, L, E]`` keys or values (``new``
    ``[B, K, n, E]``); ``start`` a scalar or ``[B]``. A scalar stays one ``dynamic_update_slice``; per-row
    columns become a scatter."""
    new = new.astype(cache.dtype)
    if jnp.ndim(start) == 0:
        return jax.lax.dynamic_update_slice(cache, new, (0, 0, start, 0))
    return jax.vmap(lambda c, u, s: jax.lax.dynamic_update_slice(c, u, (0, s, 0)))(cache, new, start)


def positions_and_mask(attention_mask: jax.Array) -> jax.Array:
    """Position ids for a left-padded batch as the reference computes them (``tok_idx``).

    Real tokens count 0, 1, 2, ... from the first non-pad token; pads get position 1.
    """
    m = attention_mask.astype(jnp.int32)
    pos = jnp.cumsum(m, axis=-1) - 1
    return jnp.where(attention_mask, pos, 1)


def _canvas_mask(
    input_ids: jax.Array, attention_mask: jax.Array | None, positions: jax.Array | None
) -> tuple[jax.Array, jax.Array]:
    """The ``[B, L]`` padding mask (all True by default) and the positions that go with it."""
    if attention_mask is None:
        attention_mask = jnp.ones(input_ids.shape, dtype=bool)
    attention_mask = attention_mask.astype(bool)
    return attention_mask, positions_and_mask(attention_mask) if positions is None else positions


class RMSNorm(nnx.Module):
    weight: nnx.Param[jax.Array]

    def __init__(self, params: _Params, path: Path_, eps: float) -> None:
        self.weight = params.param(path + ("weight",))
        self.eps = eps

    def __call__(self, x: jax.Array) -> jax.Array:
        # As Qwen2RMSNorm: normalise in float32, cast back to the input dtype, *then* scale (a bf16 x bf16
        # product for bf16 weights). Scaling before the cast would round differently.
        h = x.astype(jnp.float32)
        h = h * jax.lax.rsqrt(jnp.mean(h * h, axis=-1, keepdims=True) + self.eps)
        return self.weight[...] * h.astype(x.dtype)


def rope(x: jax.Array, positions: jax.Array, theta: float) -> jax.Array:
    """Half-split (not interleaved) rotary embedding; ``x`` is ``[B, N, L, E]``, heads first."""
    e = x.shape[-1]
    inv_freq = 1.0 / (theta ** (jnp.arange(0, e, 2, dtype=jnp.float32) / e))  # [E/2]
    freqs = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, L, E/2], float32 as the reference
    emb = jnp.concatenate([freqs, freqs], axis=-1)[:, None, :, :]  # [B, 1, L, E]
    cos, sin = jnp.cos(emb).astype(x.dtype), jnp.sin(emb).astype(x.dtype)
    half = e // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


class Attention(nnx.Module):
    q_kernel: nnx.Param[q.Weight]  # [D, H, E]
    k_kernel: nnx.Param[q.Weight]  # [D, K, E]
    v_kernel: nnx.Param[q.Weight]  # [D, K, E]
    o_kernel: nnx.Param[q.Weight]  # [H, E, D]
    q_bias: nnx.Param[jax.Array]  # [H, E]
    k_bias: nnx.Param[jax.Array]  # [K, E]
    v_bias: nnx.Param[jax.Array]  # [K, E]

    def __init__(self, cfg: DreamConfig, params: _Params, path: Path_) -> None:
        self.q_kernel = params.weight(path + ("q_kernel",))
        self.q_bias = params.param(path + ("q_bias",))
        self.k_kernel = params.weight(path + ("k_kernel",))
        self.k_bias = params.param(path + ("k_bias",))
        self.v_kernel = params.weight(path + ("v_kernel",))
        self.v_bias = params.param(path + ("v_bias",))
        self.o_kernel = params.weight(path + ("o_kernel",))
        self.theta = cfg.rope_theta
        self.groups = cfg.num_groups

    def __call__(
        self,
        x: jax.Array,
        positions: jax.Array,
        mask: jax.Array,
        cache: KV | None = None,
        start: jax.Array | None = None,
        rows: jax.Array | None = None,
    ) -> tuple[jax.Array, KV]:
        """Attention of the ``Lq`` queries in ``x`` over ``Lk`` keys; returns (output, (k, v) of all keys).

        ``mask`` is ``[B, Lq, Lk]`` (True = may attend). With ``cache`` (keys/values ``[B, K, Lk, E]`` of the
        whole canvas, after RoPE), this block's fresh k/v are written at ``start`` (a scalar, or ``[B]``: one
        column per row) and the queries attend over the updated cache: the DualCache step of the fast
        decoders. With ``rows`` (``[B, M]`` indices),
        only those positions of ``x`` ask queries; all of them give keys and values.
        """
        xq, qpos = x, positions
        if rows is not None:
            xq = jnp.take_along_axis(x, rows[..., None], axis=1)
            qpos = jnp.take_along_axis(positions, rows, axis=1)
            mask = jnp.take_along_axis(mask, rows[..., None], axis=1)
        b, n, _ = xq.shape
        # Heads-first layout ([B, N, L, E]) for attention: the score and mixing products are then plain
        # batched matmuls; with heads in the middle XLA's CPU backend ran attention about 2x slower. The
        # projections themselves produce [B, L, N, E] and the swap rides along with the bias add: asked for
        # [B, N, L, E] directly, XLA's CPU backend transposed the weights on every step (whole reference
        # generations ran 6-10% slower).
        q = jnp.swapaxes(dense("bld,dhe->blhe", xq, self.q_kernel) + self.q_bias[...], 1, 2)
        k = jnp.swapaxes(dense("bld,dke->blke", x, self.k_kernel) + self.k_bias[...], 1, 2)
        v = jnp.swapaxes(dense("bld,dke->blke", x, self.v_kernel) + self.v_bias[...], 1, 2)
        q, k = rope(q, qpos, self.theta), rope(k, positions, self.theta)
        if cache is not None:
            assert start is not None, "a cached block step needs its start"
            k, v = write_block(cache[0], k, start), write_block(cache[1], v, start)
        # GQA: query head h uses kv head h // G (repeat_kv repeats each kv head G times consecutively).
        q = q.reshape(b, k.shape[1], self.groups, n, q.shape[-1])  # [B, K, G, Lq, E]
        scale = q.shape[-1] ** -0.5
        scores = jnp.einsum("bkgle,bkme->bkglm", q, k, preferred_element_type=jnp.float32) * scale
        # Bidirectional: no causal term anywhere, only padding.
        valid = mask[:, None, None, :, :]
        scores = jnp.where(valid, scores, jnp.finfo(jnp.float32).min)
        probs = jax.nn.softmax(scores, axis=-1)
        # A pad query row is fully masked; PyTorch's safe softmax gives it zeros, and so do we (instead of
        # the uniform average finfo.min would give). NaN must never reach the V mixing: one NaN
        # there poisons the whole batch's next layer.
        probs = jnp.where(jnp.any(valid, axis=-1, keepdims=True), probs, 0.0).astype(x.dtype)
        out = jnp.einsum("bkglm,bkme->bkgle", probs, v).reshape(b, -1, n, q.shape[-1])  # [B, H, Lq, E]
        return dense("bhle,hed->bld", out, self.o_kernel), (k, v)


class MLP(nnx.Module):
    gate_kernel: nnx.Param[q.Weight]  # [D, F]
    up_kernel: nnx.Param[q.Weight]  # [D, F]
    down_kernel: nnx.Param[q.Weight]  # [F, D]

    def __init__(self, params: _Params, path: Path_) -> None:
        self.gate_kernel = params.weight(path + ("gate_kernel",))
        self.up_kernel = params.weight(path + ("up_kernel",))
        self.down_kernel = params.weight(path + ("down_kernel",))

    def __call__(self, x: jax.Array) -> jax.Array:
        gate = jax.nn.silu(dense("bld,df->blf", x, self.gate_kernel))
        up = dense("bld,df->blf", x, self.up_kernel)
        return dense("blf,fd->bld", gate * up, self.down_kernel)


class Block(nnx.Module):
    input_layernorm: RMSNorm
    attn: Attention
    post_attention_layernorm: RMSNorm
    mlp: MLP

    def __init__(self, cfg: DreamConfig, params: _Params, n: int) -> None:
        path: Path_ = ("layers", n)
        self.input_layernorm = RMSNorm(params, path + ("input_layernorm",), cfg.rms_norm_eps)
        self.attn = Attention(cfg, params, path + ("attn",))
        self.post_attention_layernorm = RMSNorm(
            params, path + ("post_attention_layernorm",), cfg.rms_norm_eps
        )
        self.mlp = MLP(params, path + ("mlp",))

    def __call__(
        self,
        x: jax.Array,
        positions: jax.Array,
        mask: jax.Array,
        cache: KV | None = None,
        start: jax.Array | None = None,
        rows: jax.Array | None = None,
    ) -> tuple[jax.Array, KV]:
        """``rows`` (``[B, M]``): compute only those positions' outputs (their keys still see all of x)."""
        h, kv = self.attn(self.input_layernorm(x), positions, mask, cache, start, rows)
        if rows is not None:
            x = jnp.take_along_axis(x, rows[..., None], axis=1)
        x = x + h
        return x + self.mlp(self.post_attention_layernorm(x)), kv


class DreamModel(nnx.Module):
    """Embedding, ``num_hidden_layers`` pre-norm blocks, final norm, untied ``lm_head``.

    Every parameter's shape and initialiser come from the parameter table (``weights.py``). With
    ``quant`` the quantizable weights are integer placeholders plus scales, to be filled by the loader
    (``loader.load``); such a model is only ever built under ``nnx.eval_shape``.
    """

    embed: nnx.Param[q.Weight]  # [V, D]
    lm_head: nnx.Param[q.Weight]  # [D, V]; absent with tied embeddings
    layers: nnx.List[Block]
    norm: RMSNorm

    def __init__(
        self,
        cfg: DreamConfig,
        *,
        dtype: jnp.dtype = jnp.float32,
        rngs: nnx.Rngs,
        quant: q.QuantSpec | None = None,
    ) -> None:
        self.cfg = cfg
        params = _Params(cfg, dtype, rngs, quant)
        self.embed = params.weight(("embed",))
        self.layers = nnx.List([Block(cfg, params, n) for n in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(params, ("norm",), cfg.rms_norm_eps)
        if not cfg.tie_word_embeddings:  # the state holds what the checkpoint holds
            self.lm_head = params.weight(("lm_head",))

    def __call__(
        self,
        input_ids: jax.Array,
        attention_mask: jax.Array | None = None,
        positions: jax.Array | None = None,
    ) -> jax.Array:
        """Unshifted logits ``[B, L, V]`` in the parameter dtype (the reference does not upcast).

        ``attention_mask`` is the 2-D ``[B, L]`` padding mask (True = real token); it is made symmetric,
        ``m[i] & m[j]``, as in ``_sample``. ``positions`` defaults to the reference's ``tok_idx`` rule.
        """
        hidden, _ = self.hidden(input_ids, attention_mask, positions)
        return self.head(hidden)

    def hidden(
        self,
        input_ids: jax.Array,
        attention_mask: jax.Array | None = None,
        positions: jax.Array | None = None,
        *,
        caches: list[KV] | None = None,
        start: jax.Array | None = None,
    ) -> tuple[jax.Array, list[KV]]:
        """Final-norm hidden states of ``input_ids`` and every layer's (k, v) over the whole canvas.

        Without ``caches`` the input is the whole canvas. With ``caches`` it is a block of the canvas
        starting at ``start`` (a scalar, or ``[B]``: each row's block at its own column):
        ``attention_mask`` and ``positions`` still describe the whole canvas, the block's rows are sliced
        out of them, and its keys/values replace the cached ones in place.
        """
        attention_mask, positions = _canvas_mask(input_ids, attention_mask, positions)
        if caches is None:
            query_mask, query_pos = attention_mask, positions
        else:
            assert start is not None, "a cached block needs its start"
            n = input_ids.shape[1]
            query_mask = read_block(attention_mask, start, n)
            query_pos = read_block(positions, start, n)
        mask = query_mask[:, :, None] & attention_mask[:, None, :]  # [B, Lq, Lk]
        x = self.embed_tokens(input_ids)  # [B, Lq, D]
        new_caches = []
        for i, layer in enumerate(self.layers):
            x, kv = layer(x, query_pos, mask, None if caches is None else caches[i], start)
            new_caches.append(kv)
        return self.norm(x), new_caches

    def hidden_at(
        self, input_ids: jax.Array, attention_mask: jax.Array, rows: jax.Array
    ) -> tuple[jax.Array, list[KV]]:
        """The whole canvas's keys/values in every layer, and the final-norm hidden states of positions
        ``rows`` (``[B, M]``) only: ``[B, M, D]``, equal to those rows of ``hidden``. The last layer's
        queries and MLP run for those rows alone (a fast decoder's refresh needs a window's outputs)."""
        attention_mask, positions = _canvas_mask(input_ids, attention_mask, None)
        mask = attention_mask[:, :, None] & attention_mask[:, None, :]
        x = self.embed_tokens(input_ids)
        caches = []
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            x, kv = layer(x, positions, mask, rows=rows if i == last else None)
            caches.append(kv)
        return self.norm(x), caches

    def trunk(
        self, input_ids: jax.Array, attention_mask: jax.Array | None = None
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """The whole canvas through every layer but the last: (residual stream ``[B, L, D]``, positions,
        ``[B, L, L]`` mask), for ``finish``."""
        attention_mask, positions = _canvas_mask(input_ids, attention_mask, None)
        mask = attention_mask[:, :, None] & attention_mask[:, None, :]
        x = self.embed_tokens(input_ids)
        for layer in list(self.layers)[:-1]:
            x, _ = layer(x, positions, mask)
        return x, positions, mask

    def finish(self, x: jax.Array, positions: jax.Array, mask: jax.Array, rows: jax.Array) -> jax.Array:
        """The last layer and the final norm for the positions ``rows`` (``[B, M]``) only: their hidden
        states ``[B, M, D]``, equal to those rows of ``hidden``. Every position still gives keys and
        values; a sampler that needs a few rows' logits skips the queries and MLP of the others."""
        x, _ = self.layers[-1](x, positions, mask, rows=rows)
        return self.norm(x)

    def embed_tokens(self, input_ids: jax.Array) -> jax.Array:
        """The embedding rows of ``input_ids`` (``[B, L]`` -> ``[B, L, D]``); a quantized table gathers
        the integer rows and their scales and dequantizes only those."""
        table = self.embed.get_value()
        if not isinstance(table, q.QArray):
            return jnp.take(table, input_ids, axis=0)
        rows = jnp.take(table.ints(), input_ids, axis=0)
        return q.dequantize_jax(rows, jnp.take(table.scale, input_ids, axis=0), table.scale.dtype)

    def head(self, hidden: jax.Array) -> jax.Array:
        """``lm_head`` (or the tied embedding) over hidden states ``[..., D]`` -> logits ``[..., V]``."""
        if not self.cfg.tie_word_embeddings:
            return dense("...d,dv->...v", hidden, self.lm_head)
        return dense("...d,vd->...v", hidden, self.embed)


def dense(subscripts: str, x: jax.Array, w: nnx.Param[q.Weight]) -> jax.Array:
    """``einsum(subscripts, x, w)`` for a float or a quantized weight parameter (``quant.dense``)."""
    return q.dense(subscripts, x, w.get_value())


def named_arrays(state: nnx.State) -> dict[str, jax.Array]:
    """Every array of a model's state by its parameter path (``layers/0/attn/q_kernel``); a quantized
    weight's integers under its own path and its scales under ``<path>_scale``."""
    out = {}
    for path, arr in jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(state))[0]:
        parts: list[str] = []
        for p in path:
            attr = getattr(p, "name", None)  # a QArray's .values / .scale
            if attr == "scale":
                parts[-1] += "_scale"
            elif attr is None:
                parts.append(str(getattr(p, "key", getattr(p, "idx", p))))
        out["/".join(parts)] = arr
    return out
