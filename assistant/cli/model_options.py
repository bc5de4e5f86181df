"""Flags for the model, its sampler and decoder, quantization and several hosts, shared by ``diffu
generate``, ``diffu bench``, ``diffu eval`` and ``diffu serve``, and what they become: SamplingParams, the
model's recommended decoder, a process group, a runtime loaded with a progress bar, or the running daemon
to ask instead (:func:`daemon_config`).

The sampler flags a model's ``generation_config.json`` also sets (``CHAT_KEYS``: ``steps``,
``temperature``, ``top_p``, ``top_k``, ``alg``, ``alg_temp``, ``block_length``, ``threshold``, and the
commands' ``max_new_tokens``) are unset (None) unless given: :func:`sampling_params` layers the given ones
over the model's, over the declared defaults, so ``diffu generate`` and ``diffu eval`` run the bundled
model as the chat does.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from assistant.cli.flags import add_flag, flag, flag_error
from model_runtime.generation_config import CHAT_KEYS
from model_runtime.options import OptionError, options
from model_runtime.params import ParamError, SamplingParams

if TYPE_CHECKING:
    from assistant.config import Config
    from model_runtime.interface import RuntimeProtocol
    from model_runtime.runtime import Runtime


SAMPLING = options(SamplingParams)
# The sampling flags: every knob but max_new_tokens, which each command names its own way (the prompt
# flags' --max-new-tokens and --infill-tokens, eval's per-benchmark default).
SAMPLING_FLAGS = tuple(name for name in SAMPLING if name != "max_new_tokens")
# Flags whose "not given" leaves the knob to a later layer rather than to the declared default: the
# model's generation_config.json for the chat's knobs (then the declared default), the model's
# recommendation for the decoder.
_LATER = {
    "steps": "the model's, else one per new token",
    "decoder": "the model's recommendation: reference unless its generation_config.json names "
    "diffu_decoder, as the bundled demo model's does",
    **{
        name: f"the model's generation_config.json, else {SAMPLING[name].default}"
        for name in CHAT_KEYS
        if name not in ("steps", "max_new_tokens")
    },
}


def add_sampling_options(p: argparse.ArgumentParser) -> None:
    """Model, sampler, decoder and device flags, shared by generate, bench generate and eval."""
    p.add_argument("--model", default=None, help="checkpoint directory or hub id (default: $DIFFU_MODEL)")
    for name in SAMPLING_FLAGS:
        if name in _LATER:
            add_flag(p, SAMPLING[name], default=None, default_text=_LATER[name])
        else:
            add_flag(p, SAMPLING[name])
    p.add_argument(
        "--dtype",
        default=None,
        choices=("float32", "bfloat16", "float16"),
        help="parameter dtype (default: float32 on CPU, bfloat16 on accelerators)",
    )
    add_quantize_option(p)
    p.add_argument(
        "--tp", type=int, default=1, help="tensor parallel degree: devices per model copy (default 1)"
    )
    p.add_argument(
        "--dp", type=int, default=None, help="data parallel replicas (default: the remaining devices)"
    )


def add_max_new_tokens(p: argparse.ArgumentParser, **changes: Any) -> None:
    """``--max-new-tokens``, as declared (``changes``: another default, its meaning, a metavar)."""
    add_flag(p, SAMPLING["max_new_tokens"], **changes)


def add_quantize_option(p: argparse.ArgumentParser) -> None:
    # No argparse choices: the runtime's own check gives the one-line error every entry point shares.
    p.add_argument(
        "--quantize",
        default=None,
        metavar="int8|int4",
        help="weight-only quantization of the projections and lm_head at load time: int8 (half the "
        "bf16 weight memory) or int4 (a quarter; groups of 128 inputs); default $DIFFU_QUANTIZE, else none",
    )


def quantize_of(args: argparse.Namespace) -> str | None:
    """--quantize, else ``DIFFU_QUANTIZE`` (the config key's variable), else None."""
    return getattr(args, "quantize", None) or os.environ.get("DIFFU_QUANTIZE") or None


def add_multihost_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("several hosts (jax.distributed); every process runs the same command")
    g.add_argument("--coordinator", default=None, metavar="HOST:PORT", help="process 0's address")
    g.add_argument("--num-processes", type=int, default=None)
    g.add_argument("--process-id", type=int, default=None)
    g.add_argument(
        "--multihost-auto",
        action="store_true",
        help="let JAX find the other hosts itself (TPU pod slices, SLURM)",
    )


def init_multihost(args: argparse.Namespace) -> None:
    """Join the process group before the first device is touched (no-op without the options)."""
    if args.coordinator or args.multihost_auto:
        from model_runtime import processes

        processes.initialize(args.coordinator, args.num_processes, args.process_id, auto=args.multihost_auto)


def model_decoder(args: argparse.Namespace, params: SamplingParams, rt: RuntimeProtocol) -> SamplingParams:
    """Without --decoder, the decoder the loaded model recommends (``RuntimeInfo.default_decoder``), and
    for a one-line answer (``--max-lines 1``) the model's one-line knobs (``RuntimeInfo.one_line_defaults``):
    name a decoder to set its knobs yourself."""
    if args.decoder:
        return params
    one_line = rt.info.one_line_defaults if params.max_lines == 1 else {}
    return dataclasses.replace(params, **{"decoder": rt.info.default_decoder, **one_line})


def check_sampling_flags(args: argparse.Namespace) -> None:
    """Refuse a sampling flag's value that its option refuses (bounds, choices), with the option's one
    line, before any model loads or any daemon is reached; what depends on the model (steps within its
    canvas) is checked once its settings are known (:func:`sampling_params`)."""
    from assistant.errors import UsageError

    for name in SAMPLING_FLAGS:
        value = getattr(args, name, None)
        if value is None:
            continue
        problem = SAMPLING[name].problem(value)
        if problem:
            raise UsageError(flag_error(OptionError(name, problem)))


def sampling_params(
    args: argparse.Namespace, max_new_tokens: int | None = None, model: Mapping[str, Any] | None = None
) -> SamplingParams:
    """The sampling flags as SamplingParams: the flags given, over ``model`` (the model's chat defaults,
    its generation_config.json), over the declared defaults. ``max_new_tokens`` (a command's own canvas,
    e.g. an eval benchmark's) goes over the model's; the model's ``steps`` only go with its own canvas."""
    from assistant.errors import UsageError

    model = {k: v for k, v in (model or {}).items() if k in CHAT_KEYS}
    if getattr(args, "suffix", None) is not None and getattr(args, "infill_tokens", None):
        max_new_tokens = args.infill_tokens
    if max_new_tokens is None and getattr(args, "max_new_tokens", None) is not None:
        max_new_tokens = args.max_new_tokens
    if max_new_tokens is not None:
        model.pop("steps", None)
    knobs = {name: getattr(args, name) for name in SAMPLING_FLAGS}
    for name in knobs:
        if knobs[name] is None and name in model:
            knobs[name] = model[name]
        elif knobs[name] is None and name in _LATER and name not in ("steps", "decoder"):
            knobs[name] = SAMPLING[name].default
    max_new = max_new_tokens if max_new_tokens is not None else model.get("max_new_tokens")
    max_new = max_new if max_new is not None else SAMPLING["max_new_tokens"].default
    if knobs["steps"] is None:
        knobs["steps"] = max_new
    knobs["decoder"] = knobs["decoder"] or "reference"  # model_decoder() puts the model's in its place
    knobs.pop("max_new_tokens", None)
    try:
        return SamplingParams(max_new_tokens=max_new, **knobs)
    except ParamError as exc:
        raise UsageError(flag_error(exc)) from None


def add_where_options(p: argparse.ArgumentParser) -> None:
    """--local / --daemon: in this process, or through the resident daemon (see :func:`daemon_config`)."""
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--local",
        action="store_true",
        help="load the model in this process even when a daemon for it is running",
    )
    where.add_argument(
        "--daemon",
        action="store_true",
        help="ask the resident daemon (DIFFU_URL, the discovery file), starting one for --model if none "
        "runs (default: a running one is used, else the model is loaded in this process)",
    )


# Flags that shape an in-process load: given one, the command loads the model itself.
_LOAD_FLAGS = ("dtype", "quantize", "coordinator", "num_processes", "process_id", "multihost_auto", "dp")


def daemon_config(args: argparse.Namespace, *, local_only: Sequence[str] = ()) -> Config | None:
    """The config to reach the daemon with, or None to run in this process: with --local, with a flag
    that shapes an in-process load (or one of ``local_only``, the command's own), or when no daemon for
    the model runs (and no DIFFU_URL is set) and --daemon was not given."""
    from assistant.client import resolve_endpoint
    from assistant.config import ConfigError, load_config
    from assistant.errors import UsageError

    flags = [n for n in (*_LOAD_FLAGS, *local_only) if getattr(args, n, None)]
    flags += ["tp"] if getattr(args, "tp", 1) != 1 else []
    if args.daemon and flags:
        raise UsageError(f"--daemon: {flag(flags[0])} works in this process only; leave one of them out")
    if args.local or flags:
        return None
    try:
        config = load_config({"model": args.model} if args.model else None)[0]
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    return config if args.daemon or resolve_endpoint(config) is not None else None


def load_with_progress(
    model: str | None, dtype: str | None, *, tp: int = 1, dp: int | None = None, **options: Any
) -> Runtime:
    """Load with progress on stderr (``assistant.cli.progress``: a bar on a terminal, a few lines when
    piped; stdout stays clean).

    ``options`` go to ``model_runtime.load`` (shape buckets, context). The model is found first (a local
    directory, or a hub id fetched to the hub's cache with its own progress), before JAX is imported: one
    that cannot be had is said at once, however busy the machine.
    """
    import model_runtime
    from assistant.cli.progress import Progress
    from model_runtime.checkpoint import resolve_model_dir
    from model_runtime.model_ref import is_fake_spec

    if model is not None and not is_fake_spec(model):
        model = str(resolve_model_dir(model))
    with Progress() as progress:
        step = progress.step("loading the model", 1.0, fraction=True)

        def report(stage: str, fraction: float) -> None:
            step.note(stage)
            step.update(min(fraction, 0.99))  # done only when load returns

        rt = model_runtime.load(model, dtype=dtype, progress=report, tp=tp, dp=dp, **options)
        step.note("")
        step.update(1.0)
        return rt
