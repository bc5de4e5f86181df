"""The decoders, as values found by name: ``get(params.decoder)``.

Every place that needs a decoder's behaviour (the runtime's compile and run, the fake runtime's program
keys, the job builder's checks, the evaluation's grouping, the tables' labels, the benchmarks' cost
models, the chat's settings) asks the decoder value; no code outside this package compares a decoder's
name. Adding a decoder is one module here and one line in ``REGISTRY`` (its name is also one of
``SamplingParams.decoder``'s choices, which this module checks on import): docs/architecture.md has a
worked example.
"""

from __future__ import annotations

from model_runtime.decoders.base import Decoder, Device, Layout, ProgramKey
from model_runtime.decoders.fast import FAST
from model_runtime.decoders.reference import REFERENCE
from model_runtime.decoders.sliding import SLIDING
from model_runtime.params import DECODERS

__all__ = ["REGISTRY", "Decoder", "Device", "Layout", "ProgramKey", "get"]

REGISTRY: dict[str, Decoder] = {d.name: d for d in (REFERENCE, FAST, SLIDING)}

if tuple(REGISTRY) != DECODERS:
    # The option's choices (params.py, below this package) and the registry name the same decoders.
    raise ImportError(
        f"SamplingParams.decoder's choices {DECODERS} are not the registered decoders {tuple(REGISTRY)}"
    )


def get(name: str) -> Decoder:
    """The decoder called ``name`` (a ``SamplingParams`` has already checked it is one)."""
    return REGISTRY[name]
