"""Flags for the model, its sampler and decoder, quantization and several hosts, shared by ``diffu
generate``, ``diffu bench``, ``diffu eval`` and ``diffu serve``, and what they become: SamplingParams, the
model's recommended decoder, a process group, a runtime loaded with a progress bar, or the running daemon
to ask instead (:func:`daemon_config`).

The sampler flags a model's ``generation_config.json`` also sets (``steps``, ``temperature``, ``top_p``,
``top_k``, ``alg``, ``alg_temp``, ``block_length``, ``threshold``, and the commands' ``max_new_tokens``)
are unset (None) unless given: :func:`sampling_params` layers the given ones over the model's, over the
built-in defaults, so ``diffu generate`` and ``diffu eval`` run the bundled model as the chat does.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from model_runtime.generation_config import CHAT_KEYS
from model_runtime.params import ALGS, DECODERS, DEFAULT_TOP_K, ParamError, SamplingParams

if TYPE_CHECKING:
    from assistant.config import Config
    from model_runtime.interface import RuntimeProtocol
    from model_runtime.runtime import Runtime


def add_sampling_options(p: argparse.ArgumentParser) -> None:
    """Model, sampler, decoder and device flags, shared by generate, bench generate and eval."""
    p.add_argument("--model", default=None, help="checkpoint directory or hub id (default: $DIFFU_MODEL)")
    p.add_argument(
        "--steps", type=int, default=None, help="denoising steps (default: the model's, else max new tokens)"
    )
    p.add_argument(
        "--alg",
        choices=ALGS,
        default=None,
        help=f"unmasking order (default: the model's, else {BUILTIN['alg']})",
    )
    p.add_argument(
        "--temperature", type=float, default=None, help="0 = greedy (default: the model's, else 0)"
    )
    p.add_argument(
        "--top-p", type=float, default=None, help="nucleus filtering (default: the model's, else off)"
    )
    p.add_argument(
        "--top-k",
        type=int,
        default=None,
        help=f"top-k filtering; unset means {DEFAULT_TOP_K}, as the published sampler inherits "
        "it from transformers' generation defaults; 0 switches it off",
    )
    p.add_argument(
        "--alg-temp", type=float, default=None, help="sample positions by confidence at this temperature"
    )
    p.add_argument("--eps", type=float, default=1e-3, help="final noise level of the schedule (default 1e-3)")
    p.add_argument("--seed", type=int, default=0)
    add_decoder_options(p)
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
        from model_runtime import distributed

        distributed.initialize(
            args.coordinator, args.num_processes, args.process_id, auto=args.multihost_auto
        )


def add_decoder_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--decoder",
        choices=DECODERS,
        default=None,
        help="reference: exact published sampler; fast: DualCache blocks with confidence-threshold "
        "parallel unmasking (default: the model's recommendation, reference unless its "
        "generation_config.json names diffu_decoder, as the bundled demo model's does)",
    )
    p.add_argument(
        "--block-length",
        type=int,
        default=None,
        help=f"fast decoder: block size (default: the model's, else {BUILTIN['block_length']})",
    )
    p.add_argument(
        "--threshold",
        type=float,
        default=None,
        help="fast decoder: commit every masked position at least this confident (default: the model's, "
        f"else {BUILTIN['threshold']})",
    )
    p.add_argument(
        "--factor",
        type=float,
        default=None,
        help="fast decoder: use the factor rule with this factor instead of the threshold",
    )


def model_decoder(args: argparse.Namespace, params: SamplingParams, rt: RuntimeProtocol) -> SamplingParams:
    """Without --decoder, the decoder the loaded model recommends (``Runtime.default_decoder``)."""
    return params if args.decoder else dataclasses.replace(params, decoder=rt.default_decoder)


# What an unset sampler flag is when the model's generation_config.json does not set it either.
BUILTIN: dict[str, Any] = {"max_new_tokens": 128, "alg": "entropy", "temperature": 0.0, "block_length": 32,
                           "threshold": 0.9}  # fmt: skip


def sampling_params(
    args: argparse.Namespace, max_new_tokens: int | None = None, model: Mapping[str, Any] | None = None
) -> SamplingParams:
    """The sampling flags as SamplingParams: the flags given, over ``model`` (the model's chat defaults,
    its generation_config.json), over :data:`BUILTIN`. ``max_new_tokens`` (a command's own canvas, e.g.
    an eval benchmark's) goes over the model's; the model's ``steps`` only go with its own canvas."""
    from assistant.errors import UsageError

    model = {k: v for k, v in (model or {}).items() if k in CHAT_KEYS}
    given = {k: getattr(args, k) for k in CHAT_KEYS if getattr(args, k, None) is not None}
    if getattr(args, "suffix", None) is not None and getattr(args, "infill_tokens", None):
        max_new_tokens = args.infill_tokens
    if max_new_tokens is not None or "max_new_tokens" in given:
        model.pop("steps", None)
    knobs = {**BUILTIN, **model, **given}
    if max_new_tokens is not None:
        knobs["max_new_tokens"] = max_new_tokens
    knobs.setdefault("steps", knobs["max_new_tokens"])
    try:
        return SamplingParams(
            **knobs,
            eps=args.eps,
            seed=args.seed,
            decoder=args.decoder or "reference",
            factor=args.factor,
        )
    except ParamError as exc:
        raise UsageError(f"--{exc.field.replace('_', '-')}: {str(exc).split(': ', 1)[1]}") from None


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
        raise UsageError(
            f"--daemon: --{flags[0].replace('_', '-')} works in this process only; leave one out"
        )
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

    ``options`` go to ``model_runtime.load`` (shape buckets, context).
    """
    import model_runtime
    from assistant.cli.progress import Progress

    with Progress() as progress:
        step = progress.step("loading the model", 1.0, fraction=True)

        def report(stage: str, fraction: float) -> None:
            step.note(stage)
            step.update(min(fraction, 0.99))  # done only when load returns

        rt = model_runtime.load(model, dtype=dtype, progress=report, tp=tp, dp=dp, **options)
        step.note("")
        step.update(1.0)
        return rt
