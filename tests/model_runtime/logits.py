"""The model's logits, for tests that compare them: one jitted forward, as the runtime runs its programs.

Called op by op (``nnx.merge(graphdef, state)(ids)`` outside ``jit``) every operation of the forward
compiles a program of its own, for every new shape: the forward and coupled-GRPO parity files took 36-40 s
of CPU that way, 19-20 s jitted. The graph is a static argument, so a runtime's forward of one shape
compiles once, whatever calls it.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx


@partial(jax.jit, static_argnums=0)
def _forward(graphdef: nnx.GraphDef, state: nnx.State, ids: jax.Array, mask: jax.Array | None) -> jax.Array:
    return nnx.merge(graphdef, state)(ids, mask)


def logits(rt: Any, ids: Any, attn: Any = None) -> np.ndarray:
    """``rt``'s logits ``[B, L, V]`` for token ids ``[B, L]`` (``attn``: which positions are real)."""
    mask = None if attn is None else jnp.asarray(attn)
    return np.asarray(_forward(rt.graphdef, rt.state, jnp.asarray(ids), mask))
