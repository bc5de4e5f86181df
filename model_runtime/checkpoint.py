"""Finding a checkpoint, reading its safetensors, and the one name map from HF tensors to our parameters.

Safetensors only: ``.bin``/``.pt``/``.pkl`` weights are refused because unpickling runs code. Files are
memory-mapped and each tensor is converted to the target dtype and placed on the device on its own, so
the host never holds a second full copy of the model.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from model_runtime.config import DreamConfig
from model_runtime.errors import ModelError, WeightsError
from model_runtime.model_ref import local_problem, one_line
from model_runtime.weights import ParamSpec, Path_, param_table

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".ckpt")

_DTYPES = {
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F64": np.dtype(np.float64),
}
# What a published DiffuCoder directory holds besides weights; fetched from the hub with them.
_HUB_PATTERNS = ["*.json", "*.safetensors", "merges.txt", "vocab.json", "*.jinja"]


def resolve_model_dir(
    model: str | os.PathLike[str], *, progress: Callable[[str], None] | None = None
) -> Path:
    """A local directory as is; otherwise a hub id (``apple/DiffuCoder-7B-Instruct``) downloaded to the
    hub cache. Offline, or with no such id, the error names the id and how to pass a local path."""
    problem = local_problem(model)
    if problem:
        raise ModelError(problem)
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    text = str(model)
    if progress:
        progress(f"downloading {text} from the Hugging Face hub")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(text, allow_patterns=_HUB_PATTERNS))
    except Exception as exc:  # offline, unknown repo, gated repo, ... all end the same way for the user
        raise ModelError(
            f"cannot fetch {text!r} from the Hugging Face hub ({type(exc).__name__}: {one_line(str(exc))}). "
            f"Download it on a machine with access (huggingface-cli download {text} --local-dir DIR) "
            "and pass --model DIR"
        ) from None


@dataclass(frozen=True)
class TensorInfo:
    name: str
    file: Path
    dtype: np.dtype
    shape: tuple[int, ...]
    start: int
    end: int


def _read_header(path: Path) -> tuple[dict[str, Any], int]:
    try:
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) != 8:
                raise ModelError(f"{path.name}: truncated safetensors file (no header)")
            (n,) = struct.unpack("<Q", head)
            if n > 100_000_000:
                raise ModelError(
                    f"{path.name}: safetensors header of {n} bytes is implausible; file corrupt?"
                )
            header = json.loads(f.read(n))
    except OSError as exc:
        raise ModelError(f"{path.name}: cannot read ({exc.strerror})") from None
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError, ValueError):
        raise ModelError(
            f"{path.name}: malformed safetensors header (not valid JSON); file corrupt?"
        ) from None
    if not isinstance(header, dict) or not all(isinstance(m, dict) for m in header.values()):
        raise ModelError(
            f"{path.name}: malformed safetensors header (expected a JSON object of tensor entries, got "
            f"{type(header).__name__}); file corrupt?"
        )
    return header, 8 + n


def refuse_pickle_only(model_dir: Path) -> None:
    """A directory whose only weights are pickles is refused first, before anything else is read."""
    if (model_dir / "model.safetensors").is_file() or (model_dir / "model.safetensors.index.json").is_file():
        return
    pickles = sorted(p.name for p in model_dir.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise ModelError(
            f"{model_dir} has only pickle-based weights ({', '.join(pickles)}); they are refused "
            "because unpickling runs arbitrary code. Convert them to safetensors first."
        )


def list_tensors(model_dir: Path) -> dict[str, TensorInfo]:
    """Every tensor of the checkpoint: from ``model.safetensors.index.json`` shards, else one file.

    A tensor listed twice (in two shards, or in the index but found elsewhere) is an error naming it.
    """
    index_path = model_dir / "model.safetensors.index.json"
    if index_path.is_file():
        try:
            weight_map = json.loads(index_path.read_text(encoding="utf-8"))["weight_map"]
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError, KeyError, TypeError):
            raise ModelError(f"{index_path.name}: expected a JSON object with a weight_map") from None
        if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
            raise ModelError(f"{index_path.name}: weight_map must map tensor names to file names")
        files = sorted(set(weight_map.values()))
        for fname in files:
            # Only files of the model directory itself: an index must not make us read elsewhere.
            if Path(fname).name != fname or fname in (".", ".."):
                raise ModelError(
                    f"{index_path.name}: weight file {fname!r} is outside the model directory (the index "
                    "may name only files next to it)"
                )
    elif (model_dir / "model.safetensors").is_file():
        weight_map, files = None, ["model.safetensors"]
    else:
        refuse_pickle_only(model_dir)
        raise ModelError(
            f"no weights in {model_dir}: expected model.safetensors or model.safetensors.index.json"
        )
    tensors: dict[str, TensorInfo] = {}
    for fname in files:
        path = model_dir / fname
        if not path.is_file():
            raise ModelError(f"weight file {fname} (named in the index) is missing from {model_dir}")
        header, base = _read_header(path)
        size = path.stat().st_size
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            if name in tensors:
                raise WeightsError(name, f"appears twice (in {tensors[name].file.name} and {fname})")
            if weight_map is not None and weight_map.get(name) != fname:
                raise WeightsError(name, f"is in {fname} but the index says {weight_map.get(name)!r}")
            try:
                dtype = _DTYPES[meta["dtype"]]
                start, end = (base + int(o) for o in meta["data_offsets"])
                shape = tuple(int(s) for s in meta["shape"])
            except KeyError:
                if str(meta.get("dtype", "")).startswith(("I", "U")):
                    # Someone else's quantized export: we quantize float weights ourselves instead.
                    raise WeightsError(
                        name,
                        f"is an integer tensor ({meta['dtype']}) in {fname}: diffu reads floating-point "
                        "checkpoints (F32, BF16, F16) and quantizes them itself (--quantize int8|int4)",
                    ) from None
                raise WeightsError(
                    name, f"unsupported or missing dtype {meta.get('dtype')!r} in {fname}"
                ) from None
            except (TypeError, ValueError):
                raise WeightsError(name, f"malformed header entry in {fname}") from None
            if end > size or end - start != dtype.itemsize * int(np.prod(shape)):
                raise WeightsError(
                    name, f"data in {fname} does not match its shape {shape} / dtype; file truncated?"
                )
            tensors[name] = TensorInfo(name, path, dtype, shape, start, end)
    if weight_map is not None:
        for name, fname in weight_map.items():
            if name not in tensors:
                raise WeightsError(name, f"listed in the index (in {fname}) but not found in that file")
    return tensors


def read_tensors(tensors: dict[str, TensorInfo]) -> Iterator[tuple[str, np.ndarray]]:
    """Yield (name, array) one at a time; arrays are read-only views of memory-mapped files."""
    by_file: dict[Path, list[TensorInfo]] = {}
    for info in tensors.values():
        by_file.setdefault(info.file, []).append(info)
    for path, infos in by_file.items():
        # np.memmap ties the mapping's lifetime to the arrays viewing it, so a consumer may keep one.
        raw = np.memmap(path, dtype=np.uint8, mode="r")
        for info in sorted(infos, key=lambda i: i.start):
            yield info.name, raw[info.start : info.end].view(info.dtype).reshape(info.shape)
        del raw


# -- names, checked against the parameter table ---------------------------------------------------------


def check_names(cfg: DreamConfig, tensors: dict[str, TensorInfo]) -> dict[str, ParamSpec]:
    """Fail loudly on unknown, missing or mis-shaped tensors, naming the first offender."""
    targets = param_table(cfg)
    for name, info in tensors.items():
        target = targets.get(name)
        if target is None:
            if name.endswith("rotary_emb.inv_freq"):
                continue  # a non-persistent buffer some exporters still write; it is recomputed
            raise WeightsError(name, "unknown tensor: not part of a Dream model with this config.json")
        if info.shape != target.hf_shape:
            raise WeightsError(
                name, f"shape {list(info.shape)} does not match config.json, expected {list(target.hf_shape)}"
            )
    missing = [n for n in targets if n not in tensors]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise WeightsError(missing[0], f"missing from the checkpoint{more}")
    return targets


def hf_state_dict(params: dict[Path_, np.ndarray], cfg: DreamConfig) -> dict[str, np.ndarray]:
    """The inverse map: our parameters back to HF tensor names and layouts (to export checkpoints)."""
    out: dict[str, np.ndarray] = {}
    for name, target in param_table(cfg).items():
        w = target.invert(np.asarray(params[target.path]))
        if w.shape != target.hf_shape:
            raise WeightsError(
                name, f"export produced shape {list(w.shape)}, expected {list(target.hf_shape)}"
            )
        out[name] = np.ascontiguousarray(w)
    return out
