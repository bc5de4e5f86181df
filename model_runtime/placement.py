"""Placing a compiled program's inputs on a device mesh, across one process or several.

Off a mesh a program runs on one device and JAX moves host arrays itself. On a mesh each input must
carry the sharding the program was compiled for; :class:`Placed` wraps a compiled program and moves its
inputs there (a no-op for arrays already in place), so callers pass host arrays and scalars as they are.
"""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from model_runtime import processes


class Placed:
    """A compiled program on a mesh: arguments are moved to the shardings it was compiled for (a no-op
    when they already are), so host arrays and single-device scalars can be passed as they are."""

    def __init__(self, compiled: jax.stages.Compiled) -> None:
        self.compiled = compiled
        self.shardings = compiled.input_shardings[0][1:]  # [0] positional args; state (first) is placed

    def __call__(self, state: nnx.State, *args: object) -> object:
        moved = [jax.tree.map(_put, a, s) for a, s in zip(args, self.shardings, strict=True)]
        return self.compiled(state, *moved)


def _put(value: object, target: NamedSharding | None) -> object:
    """``value`` with sharding ``target``. With several processes every process holds the same host value
    and contributes its own shards; arrays that already span the processes (program outputs) stay."""
    if target is None or isinstance(value, jax.Array) and not value.is_fully_addressable:
        return value  # an input the compiled program does not use (None), or one already in place
    if not processes.multi():
        return jax.device_put(value, target)
    if isinstance(value, jax.Array) and jax.dtypes.issubdtype(value.dtype, jax.dtypes.prng_key):
        data = np.asarray(jax.random.key_data(value))
        whole = NamedSharding(target.mesh, PartitionSpec())
        placed = jax.make_array_from_callback(data.shape, whole, lambda index: data[index])
        return jax.random.wrap_key_data(placed, impl=jax.random.key_impl(value))
    host = np.asarray(value)
    return jax.make_array_from_callback(host.shape, target, lambda index: host[index])


def output_shardings(program: object) -> object:
    """How a program on a mesh lays out its results (None off a mesh: one device, nothing to match)."""
    return program.compiled.output_shardings if isinstance(program, Placed) else None
