"""Device meshes and parameter shardings: tensor parallel over heads, MLP hidden and vocabulary, data
parallel over the batch, with JAX's own SPMD partitioner doing the rest.

Every parameter names its dimensions with logical axes (in the parameter table, ``weights.py``); one
rules table maps logical axes to mesh axes (``"tp"`` for tensor parallel, ``"dp"`` for data parallel),
and quantization scales take their weight's axes. A dimension that the mesh axis does not
divide is replicated instead (e.g. the 4 KV heads of the 7B model at tp=8), and the table rejects a
mapping that would use one mesh axis twice in a tensor.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from model_runtime.errors import InputError
from model_runtime.weights import ParamSpec, param_table

# Logical axis -> mesh axis (None: replicated).
RULES: dict[str, str | None] = {
    "batch": "dp",
    "vocab": "tp",
    "heads": "tp",
    "kv_heads": "tp",
    "mlp": "tp",
    "embed": None,
    "head_dim": None,
    "length": None,
}


@dataclass(frozen=True)
class MeshSpec:
    """``tp`` devices per model replica; ``dp`` replicas (default: all remaining devices)."""

    tp: int = 1
    dp: int | None = None

    def build(self, devices: Sequence[jax.Device] | None = None) -> Mesh:
        devices = list(devices if devices is not None else jax.devices())
        if self.tp < 1 or (self.dp is not None and self.dp < 1):
            raise InputError(f"tp and dp must be >= 1, got tp={self.tp} dp={self.dp}")
        if len(devices) % self.tp:
            raise InputError(f"tp={self.tp} does not divide the {len(devices)} available devices")
        dp = self.dp if self.dp is not None else len(devices) // self.tp
        if dp * self.tp > len(devices):
            raise InputError(
                f"dp={dp} x tp={self.tp} needs {dp * self.tp} devices; {len(devices)} are available"
            )
        grid = np.array(devices[: dp * self.tp]).reshape(dp, self.tp)
        return Mesh(grid, ("dp", "tp"))


def logical_to_spec(axes: Sequence[str], shape: Sequence[int], mesh: Mesh) -> PartitionSpec:
    """PartitionSpec for a tensor with these logical axes; undivisible dimensions are replicated."""
    used: set[str] = set()
    spec: list[str | None] = []
    for axis, size in zip(axes, shape, strict=True):
        target = RULES.get(axis)
        if target is not None and target in used:
            raise ValueError(f"logical axes {tuple(axes)} map mesh axis {target!r} twice")
        if target is not None:
            used.add(target)
        if target is not None and size % mesh.shape[target] == 0 and mesh.shape[target] > 1:
            spec.append(target)
        else:
            spec.append(None)
    return PartitionSpec(*spec)


def param_sharding(spec: ParamSpec, shape: Sequence[int], mesh: Mesh) -> NamedSharding:
    """The sharding of a parameter (its logical axes from the parameter table) or of its quantization
    scales (same axes, ``shape`` the scales'; their size-1 dimensions are replicated)."""
    return NamedSharding(mesh, logical_to_spec(spec.axes, shape, mesh))


def batch_sharding(mesh: Mesh, batch: int) -> NamedSharding:
    """Canvas arrays ``[B, L]``: rows spread over the data-parallel axis when it divides the batch."""
    return NamedSharding(mesh, logical_to_spec(("batch", "length"), (batch, 1), mesh))


def describe(mesh: Mesh | None) -> dict[str, object]:
    """A JSON-friendly description for status reports."""
    if mesh is None:
        devices = jax.devices()
        return {
            "dp": 1,
            "tp": 1,
            "devices": 1,
            "platform": devices[0].platform,
            "processes": jax.process_count(),
        }
    return {
        "dp": int(mesh.shape["dp"]),
        "tp": int(mesh.shape["tp"]),
        "devices": int(mesh.devices.size),
        "platform": mesh.devices.flat[0].platform,
        "processes": jax.process_count(),
    }


def place(array: np.ndarray, sharding: NamedSharding) -> jax.Array:
    """Put a host array onto its devices, each device receiving only its own slice of it."""
    return jax.make_array_from_callback(array.shape, sharding, lambda index: array[index])


def _per_device(axes: Sequence[str], shape: Sequence[int], tp: int) -> int:
    """Elements of a tensor one device holds: the placement's rule, a dimension split only when ``tp``
    divides it."""
    n = int(np.prod(shape))
    split = [
        size for axis, size in zip(axes, shape, strict=True) if RULES.get(axis) == "tp" and size % tp == 0
    ]
    return n // tp if split and tp > 1 else n


def weight_bytes_per_device(cfg, tp: int, itemsize: int = 2, quantize=None) -> int:
    """Bytes of weights one device holds at tensor-parallel degree ``tp`` under these rules.

    ``quantize`` (a ``quant.QuantSpec``) counts the quantized parameters as their integer values (int4
    two to a byte, as accelerators store them) plus their scales (``itemsize`` each).
    """
    total = 0
    for spec in param_table(cfg).values():
        if quantize is not None and quantize.applies(spec):
            total += -(-_per_device(spec.axes, spec.shape, tp) * quantize.bits // 8)
            total += _per_device(spec.axes, quantize.scale_shape(spec), tp) * itemsize
        else:
            total += _per_device(spec.axes, spec.shape, tp) * itemsize
    return total
