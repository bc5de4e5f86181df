"""Export trained parameters to the published DiffuCoder directory layout.

The result is what ``model_runtime.load`` (and ``diffu serve --model OUT``) reads from a real
checkpoint: ``config.json`` with ``model_type: Dream`` and ``auto_map``, safetensors under the HF tensor
names and layouts (through ``checkpoint.hf_state_dict``, the inverse of the one name map), the Qwen2-style
tokenizer files, ``generation_config.json`` and ``special_tokens_map.json``. Unlike a hub download it
carries no custom-code ``*.py`` files: diffu never runs them, and an exported model may live inside a
Python package where such files would be importable.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx

from model_runtime.checkpoint import hf_state_dict
from model_runtime.checkpoint_writer import write_checkpoint, write_generation_files
from model_runtime.config import DreamConfig
from model_runtime.train.corpus import TOKENIZER_FILES

# Beyond this many bytes per file, split the weights into shards as the hub checkpoints do.
SHARD_BYTES = 2 << 30


def params_by_path(params: nnx.State) -> dict[tuple[str | int, ...], np.ndarray]:
    """Flatten an NNX state into ``{("layers", 0, "attn", "q_kernel"): array}`` (the name map's paths)."""
    flat, _ = jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(params))
    return {tuple(getattr(k, "key", getattr(k, "idx", k)) for k in path): np.asarray(v) for path, v in flat}


def export_model(
    out_dir: Path,
    cfg_dict: dict[str, Any],
    params: nnx.State,
    tokenizer_dir: Path,
    *,
    dtype: str = "bfloat16",
    extra_files: dict[str, Any] | None = None,
) -> Path:
    """Write ``params`` (an NNX state of ``cfg_dict``'s model) with the tokenizer of ``tokenizer_dir``.

    ``extra_files`` maps file names to JSON-serialisable objects written next to the weights
    (``metrics.json``, ...). Existing weight files in ``out_dir`` are replaced.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for old in list(out.glob("*.safetensors")) + list(out.glob("model.safetensors.index.json")):
        old.unlink()  # a previous export with another shard count must not leave strays behind
    cfg = DreamConfig.from_dict(cfg_dict)
    tensors = hf_state_dict(params_by_path(params), cfg)
    itemsize = 2 if dtype in ("bfloat16", "float16") else 4
    total = sum(t.size for t in tensors.values()) * itemsize
    shards = max(1, -(-total // SHARD_BYTES))
    write_checkpoint(out, cfg_dict, tensors, shards=shards, dtype=dtype)
    for name in TOKENIZER_FILES:
        src = Path(tokenizer_dir) / name
        if src.is_file() and src.resolve() != (out / name).resolve():
            shutil.copyfile(src, out / name)
    write_generation_files(out, cfg)
    for name, obj in (extra_files or {}).items():
        _write_json(out / name, obj)
    return out


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
