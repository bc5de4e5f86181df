"""Runtimes with random weights in any config: the accelerator benchmarks' models, since speed depends
on the shapes, not on the values (``scripts/device_check.py`` builds DiffuCoder-7B's on the device).
``small_config`` is the tiny model the scripts' CPU modes share."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from model_runtime import quant
from model_runtime.bundled import bundled_model_dir
from model_runtime.config import DreamConfig
from model_runtime.loader import quantize_state
from model_runtime.model import DreamModel
from model_runtime.runtime import Runtime
from model_runtime.tokenizer import DreamTokenizer, load_tokenizer


def random_state(cfg: DreamConfig, dtype: Any, seed: int = 0) -> tuple[nnx.GraphDef, nnx.State]:
    """A model of ``cfg`` with normal(0, 0.02) weights (norm scales 1, as trained models roughly are),
    drawn on the device one compiled fill per distinct shape (28 layers repeat the same dozen)."""
    abstract = nnx.eval_shape(lambda: DreamModel(cfg, dtype=dtype, rngs=nnx.Rngs(seed)))
    graphdef, state = nnx.split(abstract)
    flat, treedef = jax.tree_util.tree_flatten_with_path(state)
    fills: dict[tuple[Any, ...], Callable[[jax.Array], jax.Array]] = {}

    def draw(i: int, path: str, leaf: jax.ShapeDtypeStruct) -> jax.Array:
        if "norm" in path:
            return jnp.ones(leaf.shape, leaf.dtype)
        key = (leaf.shape, leaf.dtype)
        if key not in fills:
            shape, dt = key
            fills[key] = jax.jit(lambda k: (0.02 * jax.random.normal(k, shape, jnp.float32)).astype(dt))
        return fills[key](jax.random.key(seed * 100_003 + i))

    leaves = [draw(i, jax.tree_util.keystr(p), leaf) for i, (p, leaf) in enumerate(flat)]
    return graphdef, jax.tree.unflatten(treedef, leaves)


def small_config() -> DreamConfig:
    """A 1-layer, 64-wide model with the bundled vocabulary and special ids: the tiny modes of the
    accelerator scripts, which run it on a CPU to check the scripts themselves (the same programs in
    each, so with the persistent compilation cache on they compile once)."""
    raw = json.loads((bundled_model_dir() / "config.json").read_text())
    raw.update(
        num_hidden_layers=1, max_window_layers=1, hidden_size=64, intermediate_size=128,
        num_attention_heads=4, num_key_value_heads=2,
    )  # fmt: skip
    return DreamConfig.from_dict(raw)


def tokenizer_for(cfg: DreamConfig) -> DreamTokenizer:
    """The bundled BPE with its special tokens moved to ``cfg``'s ids (``<|endoftext|>`` at the eos id,
    the others after it, as in DiffuCoder: 151643, mask 151666): any byte-level BPE encodes a prompt,
    the ids must match the config's."""
    src = bundled_model_dir()
    added = json.loads((src / "added_tokens.json").read_text())
    base = min(added.values())
    out = Path(tempfile.mkdtemp(prefix="diffu-random-tok-"))
    vocab = {t: i for t, i in json.loads((src / "vocab.json").read_text()).items() if t not in added}
    (out / "vocab.json").write_text(json.dumps(vocab))
    moved = {t: i - base + cfg.eos_token_id for t, i in added.items()}
    (out / "added_tokens.json").write_text(json.dumps(moved))
    for name in ("merges.txt", "tokenizer_config.json"):
        (out / name).write_bytes((src / name).read_bytes())
    return load_tokenizer(out, mask_id=cfg.mask_token_id, pad_id=cfg.pad_token_id, eos_id=cfg.eos_token_id)


def random_runtime(
    cfg: DreamConfig,
    *,
    dtype: Any = jnp.bfloat16,
    quantize: quant.QuantSpec | None = None,
    length_buckets: Sequence[int] = (512, 1024),
    batch_buckets: Sequence[int] = (1,),
    tokenizer: DreamTokenizer | None = None,
    seed: int = 0,
) -> Runtime:
    """A Runtime of ``cfg`` with random weights drawn on the default device, optionally quantized there
    (``loader.quantize_state``: the loader's rounding and layout)."""
    graphdef, state = random_state(cfg, dtype, seed)
    if quantize is not None:
        quantize = quantize.resolved(1)
        graphdef, state = quantize_state(state, cfg, quantize)
    weights = jnp.dtype(dtype).name + (f", {quantize.mode}" if quantize else "")
    return Runtime(
        cfg,
        tokenizer if tokenizer is not None else tokenizer_for(cfg),
        graphdef,
        state,
        model_name=f"random {weights} weights ({cfg.num_hidden_layers} layers, hidden {cfg.hidden_size})",
        model_dir=bundled_model_dir(),
        dtype=dtype,
        length_buckets=length_buckets,
        batch_buckets=batch_buckets,
        quantize=quantize,
    )
