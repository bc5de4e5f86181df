"""The bundled demo model: a small DiffuCoder-architecture model trained by ``diffu train``.

It is a demonstration of the system, not DiffuCoder-7B: 10.0 million parameters (hidden 256, 8 layers,
vocabulary 4096), trained on one NVIDIA H100 for about eight minutes on 95 MB of permissively licensed
Python (``scripts/train_bundled.sh`` is the exact recipe; docs/training.md has the figures and the
held-out metrics are in ``model/metrics.json``). It ships inside the package so that ``diffu generate``,
``chat``, ``serve`` and ``lsp`` work on a fresh clone with no download. The directory holds only data
files in the published layout (config, safetensors, tokenizer); no Python code is read from it.
"""

from __future__ import annotations

from pathlib import Path

# The name clients see for it (its directory is called ``model``, which says nothing).
BUNDLED_MODEL_NAME = "diffu-demo"


def bundled_model_dir() -> Path:
    """The directory of the bundled model, loadable with ``model_runtime.load(path)``."""
    return Path(__file__).resolve().parent / "model"
