"""Tiny random Dream checkpoints written in exactly the published DiffuCoder directory layout (test fixtures).

The real 7B weights cannot be fetched on test machines, so tests (and anyone trying the loader) use a
tiny model with the same files: ``config.json`` with ``model_type: Dream`` and ``auto_map``, sharded
safetensors under the real tensor names with ``model.safetensors.index.json``, and the Qwen2-style
tokenizer files naming the custom ``DreamTokenizer``. The directory also carries the custom-code files
the real repos ship; ours raise if anyone imports them, which is how tests prove we never do. The files
are written by ``checkpoint_writer``, the same code ``diffu train`` exports a trained model with.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from model_runtime.checkpoint_writer import write_checkpoint, write_generation_files
from model_runtime.config import DreamConfig
from model_runtime.tokenizer import save_published_layout, train_bpe
from model_runtime.weights import param_table

_CUSTOM_CODE = ("configuration_dream.py", "modeling_dream.py", "generation_utils.py", "tokenization_dream.py")
_TRAP = '''"""Stand-in for the published custom code: diffu must never import it."""
import os, pathlib
_marker = os.environ.get("DIFFU_CODE_EXECUTED_MARKER")
if _marker:
    pathlib.Path(_marker).write_text(__file__)
raise RuntimeError("custom code from the model directory was executed: " + __file__)
'''


def default_corpus() -> list[str]:
    """Python source shipped with the interpreter: deterministic for a given Python version."""
    import bisect
    import colorsys
    import fnmatch
    import heapq
    import textwrap

    return [inspect.getsource(m) for m in (textwrap, heapq, bisect, fnmatch, colorsys)]


def tiny_config(vocab_size: int, eos_id: int, mask_id: int, **overrides: object) -> dict[str, Any]:
    cfg = {
        "architectures": ["DreamModel"],
        "attention_dropout": 0.0,
        "auto_map": {
            "AutoConfig": "configuration_dream.DreamConfig",
            "AutoModel": "modeling_dream.DreamModel",
        },
        "bos_token_id": eos_id,
        "eos_token_id": eos_id,
        "hidden_act": "silu",
        "hidden_size": 64,
        "initializer_range": 0.02,
        "intermediate_size": 128,
        "mask_token_id": mask_id,
        "max_position_embeddings": 1024,
        "max_window_layers": 2,
        "model_type": "Dream",
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "num_key_value_heads": 2,
        "pad_token_id": eos_id,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 10000.0,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "transformers_version": "4.51.3",
        "use_cache": False,
        "use_mrope": False,
        "use_sliding_window": False,
        "vocab_size": vocab_size,
    }
    cfg.update(overrides)
    return cfg


def random_tensors(cfg: DreamConfig, seed: int = 0, scale: float = 1.0) -> dict[str, np.ndarray]:
    """Random weights under the real names and HF layouts.

    Weights are larger than a trained model's init (std ~ 1/sqrt(fan_in), embeddings std 1) so that a
    random model still has peaked, distinct predictions: with tiny std every masked position looks the
    same and the sampler's choices become ties.
    """
    rng = np.random.default_rng(seed)
    out = {}
    for name, target in param_table(cfg).items():
        shape = target.hf_shape
        if name.endswith("norm.weight"):
            w = 1.0 + 0.1 * rng.standard_normal(shape)
        elif name.endswith(".bias"):
            w = 0.1 * rng.standard_normal(shape)
        elif name == "model.embed_tokens.weight":
            w = rng.standard_normal(shape)
        else:
            w = rng.standard_normal(shape) * scale / math.sqrt(shape[-1])
        out[name] = w.astype(np.float32)
    return out


def write_tiny_checkpoint(
    out_dir: str | Path,
    *,
    seed: int = 0,
    vocab: int = 600,
    shards: int = 2,
    dtype: str = "float32",
    corpus: Iterable[str] | None = None,
    instruct: bool = True,
    **config_overrides: object,
) -> Path:
    """A complete tiny DiffuCoder-layout directory (tokenizer, config, sharded weights, decoy code)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = train_bpe(corpus if corpus is not None else default_corpus(), vocab, instruct=instruct)
    save_published_layout(tok, out)
    n_tokens = tok.get_vocab_size(with_added_tokens=True)
    vocab_size = int(math.ceil(n_tokens / 64) * 64)  # padded like the real 152064-row embedding
    eos_id, mask_id = tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|mask|>")
    assert eos_id is not None and mask_id is not None  # train_bpe always adds both
    cfg_dict = tiny_config(vocab_size, eos_id, mask_id, **config_overrides)
    cfg = DreamConfig.from_dict(cfg_dict)
    write_checkpoint(out, cfg_dict, random_tensors(cfg, seed), shards=shards, dtype=dtype)
    write_generation_files(out, cfg)
    for name in _CUSTOM_CODE:
        (out / name).write_text(_TRAP)
    return out
