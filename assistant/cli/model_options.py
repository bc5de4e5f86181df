"""Flags for the model, its sampler and decoder, quantization and several hosts, shared by ``diffu
generate``, ``diffu bench``, ``diffu eval`` and ``diffu serve``, and what they become: SamplingParams, the
model's recommended decoder, a process group, a runtime loaded with a progress bar.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from typing import TYPE_CHECKING, Any

from assistant.cli.flags import add_flag, flag_error
from model_runtime.options import options
from model_runtime.params import ParamError, SamplingParams

if TYPE_CHECKING:
    from model_runtime.interface import RuntimeProtocol
    from model_runtime.runtime import Runtime


SAMPLING = options(SamplingParams)
# The sampling flags: every knob but max_new_tokens, which each command names its own way (the prompt
# flags' --max-new-tokens and --infill-tokens, eval's per-benchmark default).
SAMPLING_FLAGS = tuple(name for name in SAMPLING if name != "max_new_tokens")
# Flags whose "not given" leaves the knob to a later layer rather than to the declared default.
_LATER = {
    "steps": "one per new token",
    "decoder": "the model's recommendation: reference unless its generation_config.json names "
    "diffu_decoder, as the bundled demo model's does",
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
        from model_runtime import distributed

        distributed.initialize(
            args.coordinator, args.num_processes, args.process_id, auto=args.multihost_auto
        )


def model_decoder(args: argparse.Namespace, params: SamplingParams, rt: RuntimeProtocol) -> SamplingParams:
    """Without --decoder, the decoder the loaded model recommends (``Runtime.default_decoder``)."""
    return params if args.decoder else dataclasses.replace(params, decoder=rt.default_decoder)


def sampling_params(args: argparse.Namespace, max_new_tokens: int | None = None) -> SamplingParams:
    """The sampling flags as SamplingParams; ``max_new_tokens`` overrides the prompt flags' canvas size."""
    from assistant.errors import UsageError

    if max_new_tokens is not None:
        max_new = max_new_tokens
    elif args.suffix is not None and args.infill_tokens:
        max_new = args.infill_tokens
    else:
        max_new = args.max_new_tokens
    knobs = {name: getattr(args, name) for name in SAMPLING_FLAGS}
    if knobs["steps"] is None:
        knobs["steps"] = max_new
    knobs["decoder"] = knobs["decoder"] or "reference"  # model_decoder() puts the model's in its place
    try:
        return SamplingParams(max_new_tokens=max_new, **knobs)
    except ParamError as exc:
        raise UsageError(flag_error(exc)) from None


def load_with_progress(
    model: str | None, dtype: str | None, *, tp: int = 1, dp: int | None = None, **options: Any
) -> Runtime:
    """Load with a rich progress bar on stderr when it is a terminal (piped output stays clean).

    ``options`` go to ``model_runtime.load`` (shape buckets, context).
    """
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    import model_runtime

    console = Console(stderr=True)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    ) as progress:
        task = progress.add_task("loading model", total=1.0)

        def report(stage: str, fraction: float) -> None:
            progress.update(task, description=stage, completed=fraction)

        return model_runtime.load(model, dtype=dtype, progress=report, tp=tp, dp=dp, **options)
