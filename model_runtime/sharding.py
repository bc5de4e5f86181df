"""Device meshes and parameter shardings: tensor parallel over heads, MLP hidden and vocabulary, data
parallel over the batch, with JAX's own SPMD partitioner doing the rest.

Every parameter names its dimensions with logical axes; one rules table maps logical axes to mesh axes
(``"tp"`` for tensor parallel, ``"dp"`` for data parallel). A dimension that the mesh axis does not
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

# Parameter name (last path element) -> logical axes of its dimensions.
PARAM_AXES: dict[str, tuple[str, ...]] = {
    "embed": ("vocab", "embed"),
    "lm_head": ("embed", "vocab"),
    "weight": ("embed",),  # RMSNorm scales
    "q_kernel": ("embed", "heads", "head_dim"),
    "q_bias": ("heads", "head_dim"),
    "k_kernel": ("embed", "kv_heads", "head_dim"),
    "k_bias": ("kv_heads", "head_dim"),
    "v_kernel": ("embed", "kv_heads", "head_dim"),
    "v_bias": ("kv_heads", "head_dim"),
    "o_kernel": ("heads", "head_dim", "embed"),
    "gate_kernel": ("embed", "mlp"),
    "up_kernel": ("embed", "mlp"),
    "down_kernel": ("mlp", "embed"),
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
    spec = []
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


def param_sharding(path: Sequence[str | int], shape: Sequence[int], mesh: Mesh) -> NamedSharding:
    """The sharding of the parameter at ``path`` (its last element names it, see PARAM_AXES)."""
    name = str(path[-1])
    axes = PARAM_AXES.get(name)
    if axes is None or len(axes) != len(shape):
        raise ValueError(f"no sharding rule for parameter {'/'.join(map(str, path))} of shape {tuple(shape)}")
    return NamedSharding(mesh, logical_to_spec(axes, shape, mesh))


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


def weight_bytes_per_device(cfg, tp: int, itemsize: int = 2) -> int:
    """Bytes of weights one device holds at tensor-parallel degree ``tp`` under these rules.

    Same divisibility rule as the placement: a dimension is split only when ``tp`` divides it.
    """
    from model_runtime.checkpoint import name_map

    total = 0
    for target in name_map(cfg).values():
        shape = target.convert(np.empty(target.hf_shape, np.int8)).shape  # our layout of the tensor
        axes = PARAM_AXES[str(target.path[-1])]
        n = int(np.prod(shape))
        split = [
            size for axis, size in zip(axes, shape, strict=True) if RULES.get(axis) == "tp" and size % tp == 0
        ]
        total += n // tp if split and tp > 1 else n
    return total * itemsize
