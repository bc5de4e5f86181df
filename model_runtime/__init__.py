"""DiffuCoder (Dream architecture) inference in JAX/Flax.

Library use::

    import model_runtime
    rt = model_runtime.load("path/to/DiffuCoder-7B-Instruct")       # or a hub id, or None (bundled)
    ids = rt.encode_chat([{"role": "user", "content": "Write quicksort"}])
    for event in rt.generate([ids], model_runtime.SamplingParams(max_new_tokens=256, steps=256)):
        ...   # StepEvent per denoising step, then one DoneEvent

This package's ``__init__`` imports no JAX: ``SamplingParams`` and the event types come from
``model_runtime.params`` and are safe for clients; ``load`` and ``Runtime`` import JAX on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from model_runtime.params import (
    ALGS,
    DEFAULT_TOP_K,
    DoneEvent,
    ErrorEvent,
    GenerationStats,
    ParamError,
    SamplingParams,
    StepEvent,
)

if TYPE_CHECKING:
    from model_runtime.engine import Runtime, load

__all__ = [
    "ALGS",
    "DEFAULT_TOP_K",
    "DoneEvent",
    "ErrorEvent",
    "GenerationStats",
    "ParamError",
    "Runtime",
    "SamplingParams",
    "StepEvent",
    "load",
]


def __getattr__(name: str) -> Any:
    if name in ("load", "Runtime"):
        from model_runtime import engine

        return getattr(engine, name)
    raise AttributeError(f"module 'model_runtime' has no attribute {name!r}")
