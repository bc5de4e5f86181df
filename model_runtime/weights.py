"""The one table of parameters: every weight of a Dream model described once.

Each ``ParamSpec`` gives a parameter's checkpoint tensor name and HF shape, its path and shape in our
layout, the logical axes of that layout (which the sharding rules map to mesh axes), the layout change
both ways, how it is initialised, and which of its dimensions a matmul contracts (which tells weight-only
quantization where the output channels and the groups are). Initialisation (``model.py``), loading and
name checking (``checkpoint.py``, ``loader.load``), sharding and the memory table (``sharding.py``),
export (``checkpoint.hf_state_dict``) and quantization (``quant.py``) all read this table and nothing
else, so a parameter cannot be described two ways.

Plain numpy: no JAX import, so the table can be built and checked anywhere.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from model_runtime.config import DreamConfig

Path_ = tuple[str | int, ...]
Convert = Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True)
class ParamSpec:
    """One parameter.

    ``contract`` lists the dimensions (of our layout) a matmul sums over: the others are output
    channels. For the embedding it is the hidden dimension, because the tied head (and the per-row
    scales of a quantized table) treat each vocabulary row as one channel. ``quantizable`` is True for
    the projection matrices and ``lm_head``; the embedding is quantized only when asked for
    (``quant.QuantSpec.embedding``); norms and biases never are.
    """

    name: str  # checkpoint tensor name
    path: Path_  # where it lives in the NNX state
    hf_shape: tuple[int, ...]
    shape: tuple[int, ...]  # our layout, the one the einsums want
    axes: tuple[str, ...]  # logical axis of each dimension of ``shape``
    convert: Convert  # HF layout -> ours
    invert: Convert  # ours -> HF layout
    init: str = "normal"  # "normal" (std 0.02), "zeros" or "ones"
    contract: tuple[int, ...] = ()
    quantizable: bool = False

    @property
    def is_embedding(self) -> bool:
        return self.path == ("embed",)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))


def _same(w: np.ndarray) -> np.ndarray:
    return w


def _t(w: np.ndarray) -> np.ndarray:
    return w.T  # PyTorch Linear weights are [out, in]; our kernels are [in, out]


@lru_cache(maxsize=8)
def _table(cfg: DreamConfig) -> tuple[ParamSpec, ...]:
    d, v = cfg.hidden_size, cfg.vocab_size
    specs = [
        ParamSpec(
            "model.embed_tokens.weight", ("embed",), (v, d), (v, d), ("vocab", "embed"), _same, _same,
            contract=(1,),
        ),
        _norm("model.norm.weight", ("norm", "weight"), d),
    ]  # fmt: skip
    if not cfg.tie_word_embeddings:
        specs.append(
            ParamSpec(
                "lm_head.weight", ("lm_head",), (v, d), (d, v), ("embed", "vocab"), _t, _t,
                contract=(0,), quantizable=True,
            )
        )  # fmt: skip
    for n in range(cfg.num_hidden_layers):
        specs += _layer(cfg, n)
    return tuple(specs)


def _norm(name: str, path: Path_, d: int) -> ParamSpec:
    return ParamSpec(name, path, (d,), (d,), ("embed",), _same, _same, init="ones")


def _layer(cfg: DreamConfig, n: int) -> list[ParamSpec]:
    """Decoder layer ``n``'s tensors. Table order is the order tensors are drawn (tiny.random_tensors),
    checked and exported in; it is the old name map's, so seeded tiny checkpoints keep their weights."""
    d, f = cfg.hidden_size, cfg.intermediate_size
    h, k, e = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim

    def heads_in(heads: int) -> tuple[Convert, Convert]:  # q/k/v: [N*E, D] <-> [D, N, E]
        return (lambda w: w.T.reshape(d, heads, e)), (lambda w: w.reshape(d, heads * e).T)

    def bias(heads: int) -> tuple[Convert, Convert]:  # [N*E] <-> [N, E]
        return (lambda w: w.reshape(heads, e)), (lambda w: w.reshape(heads * e))

    o_in: Convert = lambda w: w.T.reshape(h, e, d)  # noqa: E731  [D, H*E] -> [H, E, D]
    o_out: Convert = lambda w: w.reshape(h * e, d).T  # noqa: E731
    p = f"model.layers.{n}."
    a: Path_ = ("layers", n, "attn")
    mlp: Path_ = ("layers", n, "mlp")
    return [
        _norm(p + "input_layernorm.weight", ("layers", n, "input_layernorm", "weight"), d),
        _norm(p + "post_attention_layernorm.weight", ("layers", n, "post_attention_layernorm", "weight"), d),
        ParamSpec(
            p + "self_attn.q_proj.weight", a + ("q_kernel",), (h * e, d), (d, h, e),
            ("embed", "heads", "head_dim"), *heads_in(h), contract=(0,), quantizable=True,
        ),
        ParamSpec(
            p + "self_attn.q_proj.bias", a + ("q_bias",), (h * e,), (h, e), ("heads", "head_dim"),
            *bias(h), init="zeros",
        ),
        ParamSpec(
            p + "self_attn.k_proj.weight", a + ("k_kernel",), (k * e, d), (d, k, e),
            ("embed", "kv_heads", "head_dim"), *heads_in(k), contract=(0,), quantizable=True,
        ),
        ParamSpec(
            p + "self_attn.k_proj.bias", a + ("k_bias",), (k * e,), (k, e), ("kv_heads", "head_dim"),
            *bias(k), init="zeros",
        ),
        ParamSpec(
            p + "self_attn.v_proj.weight", a + ("v_kernel",), (k * e, d), (d, k, e),
            ("embed", "kv_heads", "head_dim"), *heads_in(k), contract=(0,), quantizable=True,
        ),
        ParamSpec(
            p + "self_attn.v_proj.bias", a + ("v_bias",), (k * e,), (k, e), ("kv_heads", "head_dim"),
            *bias(k), init="zeros",
        ),
        # No o_proj bias in Qwen2.
        ParamSpec(
            p + "self_attn.o_proj.weight", a + ("o_kernel",), (d, h * e), (h, e, d),
            ("heads", "head_dim", "embed"), o_in, o_out, contract=(0, 1), quantizable=True,
        ),
        ParamSpec(
            p + "mlp.gate_proj.weight", mlp + ("gate_kernel",), (f, d), (d, f), ("embed", "mlp"),
            _t, _t, contract=(0,), quantizable=True,
        ),
        ParamSpec(
            p + "mlp.up_proj.weight", mlp + ("up_kernel",), (f, d), (d, f), ("embed", "mlp"),
            _t, _t, contract=(0,), quantizable=True,
        ),
        ParamSpec(
            p + "mlp.down_proj.weight", mlp + ("down_kernel",), (d, f), (f, d), ("mlp", "embed"),
            _t, _t, contract=(0,), quantizable=True,
        ),
    ]  # fmt: skip


def param_table(cfg: DreamConfig) -> dict[str, ParamSpec]:
    """Checkpoint tensor name -> spec, for exactly the tensors a checkpoint of ``cfg`` must have."""
    return {s.name: s for s in _table(cfg)}


def by_path(cfg: DreamConfig) -> dict[Path_, ParamSpec]:
    """Parameter path -> spec (what the model constructors and the sharding rules look up)."""
    return {s.path: s for s in _table(cfg)}
