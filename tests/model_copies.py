"""Variants of a test checkpoint without copying its weights."""

from __future__ import annotations

import json
from pathlib import Path


def with_generation_config(model_dir: Path, out: Path, **keys: object) -> Path:
    """``out``: every file of ``model_dir`` symlinked, but a ``generation_config.json`` holding ``keys``."""
    out.mkdir()
    for f in model_dir.iterdir():
        if f.is_file() and f.name != "generation_config.json":
            (out / f.name).symlink_to(f)
    (out / "generation_config.json").write_text(json.dumps(keys))
    return out
