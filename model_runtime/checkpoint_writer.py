"""Writing a model in the published DiffuCoder directory layout: sharded safetensors and their index under
the Hugging Face tensor names, ``config.json``, ``generation_config.json`` and ``special_tokens_map.json``.

``diffu train`` exports trained weights with it (``train/export.py``), and the tiny test checkpoints
(``tiny.py``) are written by the same code, so the loader's tests read exactly what an export produces.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path

import ml_dtypes
import numpy as np

from model_runtime.config import DreamConfig


def write_checkpoint(
    out_dir: str | Path,
    cfg_dict: Mapping[str, object],
    tensors: dict[str, np.ndarray],
    *,
    shards: int = 2,
    dtype: str = "float32",
) -> Path:
    """Write ``tensors`` (HF names and layouts) as sharded safetensors with an index, plus config.json."""
    from safetensors.numpy import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    np_dtype = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}[dtype]
    names = list(tensors)
    per = math.ceil(len(names) / shards)
    weight_map, total = {}, 0
    for s in range(shards):
        chunk = names[s * per : (s + 1) * per]
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors" if shards > 1 else "model.safetensors"
        arrays = {n: np.ascontiguousarray(tensors[n]).astype(np_dtype) for n in chunk}
        if dtype == "bfloat16":
            _save_bf16(out / fname, arrays)
        else:
            save_file(arrays, str(out / fname), metadata={"format": "pt"})
        for n in chunk:
            weight_map[n] = fname
            total += arrays[n].nbytes
    if shards > 1:
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    cfg = dict(cfg_dict, torch_dtype=dtype)
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return out


def _save_bf16(path: Path, arrays: dict[str, np.ndarray]) -> None:
    # safetensors.numpy does not know bfloat16; the format is simple enough to write directly.
    header, offset, blobs = {}, 0, []
    for name, arr in arrays.items():
        data = arr.tobytes()
        header[name] = {
            "dtype": "BF16",
            "shape": list(arr.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        offset += len(data)
        blobs.append(data)
    header["__metadata__"] = {"format": "pt"}
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with path.open("wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for blob in blobs:
            f.write(blob)


def write_generation_files(out_dir: str | Path, cfg: DreamConfig) -> None:
    """``generation_config.json`` and ``special_tokens_map.json`` as a published Dream directory has them.

    They are written so an exported directory looks like the real thing to other tools. diffu reads its
    own ``diffu_decoder`` and the chat defaults from generation_config.json (``generation_config.py``); the
    reference's diffusion_generate ignores the file altogether.
    """
    out = Path(out_dir)
    gen = {
        "_from_model_config": True,
        "bos_token_id": cfg.bos_token_id if cfg.bos_token_id is not None else cfg.eos_token_id,
        "eos_token_id": cfg.eos_token_id,
        "pad_token_id": cfg.pad_token_id,
    }
    special = {
        "bos_token": "<|beginoftext|>",
        "eos_token": "<|endoftext|>",
        "mask_token": "<|mask|>",
        "pad_token": "<|endoftext|>",
    }
    for name, obj in (("generation_config.json", gen), ("special_tokens_map.json", special)):
        (out / name).write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
