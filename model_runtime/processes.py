"""The process group of several hosts (a TPU pod slice, a multi-node GPU job): joining ``jax.distributed``
and reading a result whole on one host.

JAX is multi-controller: every process runs the same program on its own devices, and the jitted steps
span the global device mesh. ``diffu generate`` and ``diffu bench`` run that way: every process runs the
same command and process 0 prints. The runtime and the placement of inputs use these helpers; the
daemon's leader and followers (``model_runtime.distributed``) build on them.
"""

from __future__ import annotations

import jax
import numpy as np

from model_runtime.errors import InputError

_initialized = False


def initialize(
    coordinator: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    auto: bool = False,
) -> None:
    """Join the process group (idempotent). ``auto`` lets JAX detect a TPU pod or cluster itself.

    Must run before anything touches a device. On CPU the cross-process collectives go through gloo.
    """
    global _initialized
    if _initialized:
        return
    if not auto and coordinator is None:
        return
    if not auto and (num_processes is None or process_id is None):
        raise InputError(
            "multi-host needs --coordinator, --num-processes and --process-id together "
            "(or --multihost-auto on a TPU pod slice)"
        )
    if (
        not auto
        and num_processes is not None
        and process_id is not None
        and not 0 <= process_id < num_processes
    ):
        raise InputError(f"--process-id must be in 0..{num_processes - 1}, got {process_id}")
    # Cross-process collectives of the CPU backend (harmless where the devices are accelerators).
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if auto:
        jax.distributed.initialize()
    else:
        jax.distributed.initialize(
            coordinator_address=coordinator, num_processes=num_processes, process_id=process_id
        )
    _initialized = True


def multi() -> bool:
    return jax.process_count() > 1


def host(x: jax.Array) -> np.ndarray:
    """A device array on this host, whole: gathered from the other processes when it spans them."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)
