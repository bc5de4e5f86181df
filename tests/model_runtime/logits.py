"""The model's logits (and its other passes), for tests that compare them: jitted, as the runtime runs its
programs.

Called op by op (``nnx.merge(graphdef, state)(ids)`` outside ``jit``) every operation of the forward
compiles a program of its own, for every new shape: the forward and coupled-GRPO parity files took 36-40 s
of CPU that way, 19-20 s jitted. The graph is a static argument, so a runtime's forward of one shape
compiles once, whatever calls it.
"""

from __future__ import annotations

from functools import partial
from types import SimpleNamespace
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx


@partial(jax.jit, static_argnums=(0, 1))
def _call(graphdef: nnx.GraphDef, method: str, state: nnx.State, *args: Any, **kw: Any) -> Any:
    return getattr(nnx.merge(graphdef, state), method)(*args, **kw)


def logits(rt: Any, ids: Any, attn: Any = None) -> np.ndarray:
    """``rt``'s logits ``[B, L, V]`` for token ids ``[B, L]`` (``attn``: which positions are real)."""
    mask = None if attn is None else jnp.asarray(attn)
    return np.asarray(_call(rt.graphdef, "__call__", rt.state, jnp.asarray(ids), mask))


def jitted_model(rt: Any, *methods: str) -> SimpleNamespace:
    """``rt``'s model with ``methods`` (``hidden``, ``hidden_at``, ...) jitted the same way."""
    return SimpleNamespace(**{m: partial(_call, rt.graphdef, m, rt.state) for m in methods})
