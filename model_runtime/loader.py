"""Loading a DiffuCoder/Dream checkpoint onto a device or a mesh: ``load(model) -> Runtime``.

Tensors are read one at a time from memory-mapped safetensors through the one fail-loud name map
(``checkpoint.py``, ``weights.py``), converted (or quantized) on the host and placed straight into their
shards. No code from the model directory runs.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from model_runtime import compile_cache, generation_config, programs, quant, sharding
from model_runtime.checkpoint import (
    TensorInfo,
    check_names,
    list_tensors,
    read_tensors,
    refuse_pickle_only,
    resolve_model_dir,
)
from model_runtime.config import DreamConfig, load_config
from model_runtime.errors import InputError, ModelError
from model_runtime.model import DreamModel
from model_runtime.params import DEFAULT_MAX_PROGRAMS
from model_runtime.runtime import DEFAULT_BATCH_BUCKETS, DEFAULT_LENGTH_BUCKETS, Runtime
from model_runtime.tokenizer import load_tokenizer
from model_runtime.weights import ParamSpec, by_path

Progress = Callable[[str, float], None]


def default_dtype() -> str:
    return "float32" if jax.default_backend() == "cpu" else "bfloat16"


def _dtype(name: str | None) -> jnp.dtype:
    name = name or default_dtype()
    table = {
        "float32": jnp.float32,
        "fp32": jnp.float32,
        "bfloat16": jnp.bfloat16,
        "bf16": jnp.bfloat16,
        "float16": jnp.float16,
        "fp16": jnp.float16,
    }
    if name not in table:
        raise InputError(f"dtype: expected one of float32, bfloat16, float16; got {name!r}")
    return table[name]


def daemon_batch_buckets() -> tuple[int, ...]:
    """The batch buckets a daemon compiles unless told: (1, 2, 4) on CPU, where a 2-core machine runs few
    requests at once and a forward's time grows with its rows (two chats at once and an editor's two
    sampled candidates run 2 rows, not 4 of which 2 are padding), (1, 4, 16) on accelerators."""
    return (1, 2, 4) if jax.default_backend() == "cpu" else (1, 4, 16)


def load(
    model: str | os.PathLike[str] | None = None,
    *,
    dtype: str | None = None,
    max_context: int | None = None,
    length_buckets: Sequence[int] = DEFAULT_LENGTH_BUCKETS,
    batch_buckets: Sequence[int] | None = DEFAULT_BATCH_BUCKETS,
    progress: Progress | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    tp: int = 1,
    dp: int | None = None,
    quantize: str | quant.QuantSpec | None = None,
    max_programs: int = DEFAULT_MAX_PROGRAMS,
) -> Runtime:
    """Load a DiffuCoder/Dream checkpoint (directory or hub id) onto the default device, or with ``tp``
    (tensor parallel) / ``dp`` (data parallel) onto a device mesh. ``batch_buckets`` None: what a daemon
    uses on this platform (:func:`daemon_batch_buckets`).

    Tensors are read from memory-mapped safetensors one at a time, converted to ``dtype`` (float32 on
    CPU, bfloat16 on accelerators by default) and placed; on a mesh each device receives only its shard
    of a sharded weight. ``quantize`` (``"int8"``, ``"int4"`` or a ``quant.QuantSpec``) stores the
    projection matrices and ``lm_head`` as integers with scales, each quantized on the host as it is
    read (see ``quant.py``). No code from the model directory runs. At most ``max_programs`` compiled
    programs are kept (least recently used evicted; ``programs.py``).
    """
    qspec = quantize if isinstance(quantize, quant.QuantSpec) else quant.parse(quantize)
    programs.row_buckets()  # a bad DIFFU_ROW_BUCKETS is refused before anything is read
    if batch_buckets is None:
        batch_buckets = daemon_batch_buckets()
    compile_cache.enable(cache_dir)
    mesh = _mesh(tp, dp, qspec)
    report = progress or (lambda stage, frac: None)
    model_dir = _model_dir(model, report)
    report("reading config", 0.0)
    cfg = load_config(model_dir)
    tokenizer = load_tokenizer(
        model_dir, mask_id=cfg.mask_token_id, pad_id=cfg.pad_token_id, eos_id=cfg.eos_token_id
    )
    if tokenizer.vocab_size > cfg.vocab_size:
        raise ModelError(
            f"the tokenizer has {tokenizer.vocab_size} tokens but config.json vocab_size is {cfg.vocab_size}"
        )
    tensors = list_tensors(model_dir)
    targets = check_names(cfg, tensors)
    jdtype = _dtype(dtype)
    if qspec is not None:
        # Which matmul runs the quantized products decides how int4 is stored: settle it now.
        qspec = qspec.resolved(1 if mesh is None else int(mesh.devices.size))
        for spec in targets.values():
            if qspec.applies(spec):
                qspec.scale_shape(spec)  # a dimension the int4 group does not divide: refused up front
    graphdef, state = _place_weights(tensors, targets, cfg, jdtype, qspec, mesh, report)
    report("ready", 1.0)
    return Runtime(
        cfg,
        tokenizer,
        graphdef,
        state,
        model_name=str(model if model is not None else model_dir),
        model_dir=model_dir,
        dtype=jdtype,
        max_context=max_context,
        length_buckets=length_buckets,
        batch_buckets=batch_buckets,
        mesh=mesh,
        default_decoder=generation_config.recommended_decoder(model_dir),
        quantize=qspec,
        chat_defaults=generation_config.chat_defaults(model_dir),
        one_line_defaults=generation_config.one_line_defaults(model_dir),
        block_defaults=generation_config.block_defaults(model_dir),
        chat_decoder=generation_config.chat_decoder(model_dir),
        editor_context=generation_config.editor_context(model_dir),
        max_programs=max_programs,
    )


def _mesh(tp: int, dp: int | None, qspec: quant.QuantSpec | None) -> Mesh | None:
    """The tp x dp device mesh, or None for one device; refuses what the mesh cannot run."""
    mesh = sharding.MeshSpec(tp=tp, dp=dp).build() if tp > 1 or (dp or 1) > 1 else None
    if (
        qspec is not None
        and qspec.mode == "int4"
        and mesh is not None
        and mesh.devices.flat[0].platform == "cpu"
    ):
        # XLA's CPU client keeps sharded int4 arrays unpacked while compiled programs ask for the packed
        # layout, so every call would fail its layout check (jax 0.8, virtual CPU devices).
        raise InputError(
            "quantize int4: XLA's CPU backend cannot run int4 weights sharded over several devices; "
            "use --quantize int8, or one device (tp=1, dp=1)"
        )
    return mesh


def _model_dir(model: str | os.PathLike[str] | None, report: Progress) -> Path:
    """The checkpoint directory of ``model`` (downloaded if a hub id), or of the bundled demo model."""
    if model is None:
        # No model configured: the small demo model trained by `diffu train` that ships in the package.
        from model_runtime.bundled import bundled_model_dir

        model = bundled_model_dir()
        if not (model / "config.json").is_file():
            raise ModelError(
                "no model given and the bundled demo model is missing from this installation: "
                "pass --model PATH_OR_HUB_ID (a DiffuCoder/Dream checkpoint directory)"
            )
    model_dir = resolve_model_dir(model, progress=lambda msg: report(msg, 0.0))
    refuse_pickle_only(model_dir)  # the clearest message for such a directory comes first
    return model_dir


def _placed(
    target: ParamSpec, array: np.ndarray, dtype: Any, q: quant.QuantSpec | None, mesh: Mesh | None
) -> quant.Weight:
    """One checkpoint tensor converted alone (layout change and dtype cast, or quantization) on the host,
    then put onto its device, or its shards onto theirs."""

    def put(host: np.ndarray) -> jax.Array:
        if mesh is None:
            return jax.device_put(host)
        return sharding.place(host, sharding.param_sharding(target, host.shape, mesh))

    if q is None or not q.applies(target):
        return put(np.asarray(target.convert(array), dtype=dtype))
    host = quant.stored(*quant.quantize(target.convert(array), target, q, np.dtype(dtype)), target, q)
    return dataclasses.replace(host, values=put(host.values), scale=put(host.scale))


def _place_weights(
    tensors: dict[str, TensorInfo],
    targets: dict[str, ParamSpec],
    cfg: DreamConfig,
    jdtype: jnp.dtype,
    qspec: quant.QuantSpec | None,
    mesh: Mesh | None,
    report: Progress,
) -> tuple[nnx.GraphDef, nnx.State]:
    """The model's (graphdef, state) with every checkpoint tensor (``targets``: its parameter, by tensor
    name) converted (or quantized) on the host and placed on the device, or its shards on the mesh, one
    tensor at a time."""
    # Abstract shapes first (nothing allocated), then each tensor goes straight into its shards.
    abstract = nnx.eval_shape(lambda: DreamModel(cfg, dtype=jdtype, rngs=nnx.Rngs(0), quant=qspec))
    graphdef, state = nnx.split(abstract)
    pure = nnx.to_pure_dict(state)
    total = sum(int(np.prod(t.shape)) for t in tensors.values())
    done = 0
    for name, array in read_tensors(tensors):
        target = targets.get(name)
        if target is None:
            continue  # a recomputed buffer (rotary inv_freq)
        node: Any = pure
        for part in target.path[:-1]:
            node = node[part]
        node[target.path[-1]] = _placed(target, array, jdtype, qspec, mesh)
        done += int(np.prod(array.shape))
        report("loading weights", done / total)
    nnx.replace_by_pure_dict(state, pure)
    return graphdef, state


def quantize_state(
    state: nnx.State, cfg: DreamConfig, q: quant.QuantSpec, *, delete: bool = True
) -> tuple[nnx.GraphDef, nnx.State]:
    """A float model's NNX state -> (graphdef, state) of the same model quantized, tensor by tensor on
    its device (each float weight is deleted once quantized when ``delete``, so the peak is one tensor
    above the quantized model plus the float remainder). For models that exist only in memory: the
    random-weight benchmarks, a model just trained. ``q.kernel="auto"`` is settled for one device."""
    q = q.resolved(1)
    dtype = jax.tree.leaves(state)[0].dtype
    abstract = nnx.eval_shape(lambda: DreamModel(cfg, dtype=dtype, rngs=nnx.Rngs(0), quant=q))
    graphdef, out_state = nnx.split(abstract)
    src, out = nnx.to_pure_dict(state), nnx.to_pure_dict(out_state)
    fns: dict[tuple[Any, ...], Callable[[jax.Array], quant.QArray]] = {}
    for path, spec in by_path(cfg).items():
        s: Any = src
        o: Any = out
        for part in path[:-1]:
            s, o = s[part], o[part]
        w = s[path[-1]]
        if not q.applies(spec):
            o[path[-1]] = w
            continue
        key = (spec.shape, spec.contract, str(w.dtype))
        if key not in fns:
            fns[key] = jax.jit(lambda w, spec=spec: quant.stored(*quant.quantize_device(w, spec, q), spec, q))
        o[path[-1]] = fns[key](w)
        if delete:
            jax.block_until_ready(o[path[-1]])
            w.delete()
    nnx.replace_by_pure_dict(out_state, out)
    return graphdef, out_state
