"""DiffuCoder (Dream architecture) inference in JAX/Flax.

Library use::

    import model_runtime
    rt = model_runtime.load("path/to/DiffuCoder-7B-Instruct")       # or a hub id, or None (bundled)
    ids = rt.rows.encode_chat([{"role": "user", "content": "Write quicksort"}])
    for event in rt.generate([ids], model_runtime.SamplingParams(max_new_tokens=256, steps=256)):
        ...   # BatchStep per denoising step, then one BatchDone

This package's ``__init__`` imports no JAX: ``SamplingParams``, ``CanvasRow``, the event types,
``RuntimeProtocol`` and ``RuntimeInfo`` come from plain-Python modules and are safe for clients; ``load``
and ``Runtime`` import JAX on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from model_runtime.interface import (
    BatchDone,
    BatchStep,
    CanvasRow,
    GenerationStats,
    RuntimeInfo,
    RuntimeProtocol,
)
from model_runtime.params import ALGS, DEFAULT_TOP_K, ParamError, SamplingParams

if TYPE_CHECKING:
    from model_runtime.loader import load
    from model_runtime.runtime import Runtime

__all__ = [
    "ALGS",
    "DEFAULT_TOP_K",
    "BatchDone",
    "BatchStep",
    "CanvasRow",
    "GenerationStats",
    "ParamError",
    "Runtime",
    "RuntimeInfo",
    "RuntimeProtocol",
    "SamplingParams",
    "load",
]


def __getattr__(name: str) -> Any:
    if name == "load":
        from model_runtime.loader import load

        return load
    if name == "Runtime":
        from model_runtime.runtime import Runtime

        return Runtime
    raise AttributeError(f"module 'model_runtime' has no attribute {name!r}")
