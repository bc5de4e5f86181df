"""Flags for the model, its sampler and decoder, quantization and several hosts, shared by ``diffu
generate``, ``diffu bench``, ``diffu eval`` and ``diffu serve``, and what they become: SamplingParams, the
model's recommended decoder, a process group, a runtime loaded with a progress bar.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from typing import TYPE_CHECKING, Any

from model_runtime.params import ALGS, DECODERS, DEFAULT_TOP_K, ParamError, SamplingParams

if TYPE_CHECKING:
    from model_runtime.interface import RuntimeProtocol
    from model_runtime.runtime import Runtime


def add_sampling_options(p: argparse.ArgumentParser) -> None:
    """Model, sampler, decoder and device flags, shared by generate, bench generate and eval."""
    p.add_argument("--model", default=None, help="checkpoint directory or hub id (default: $DIFFU_MODEL)")
    p.add_argument("--steps", type=int, default=None, help="denoising steps (default: max new tokens)")
    p.add_argument("--alg", choices=ALGS, default="entropy", help="unmasking order (default entropy)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default 0)")
    p.add_argument("--top-p", type=float, default=None, help="nucleus filtering (default off)")
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
        from model_runtime import processes

        processes.initialize(args.coordinator, args.num_processes, args.process_id, auto=args.multihost_auto)


def add_decoder_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--decoder",
        choices=DECODERS,
        default=None,
        help="reference: exact published sampler; fast: DualCache blocks with confidence-threshold "
        "parallel unmasking (default: the model's recommendation, reference unless its "
        "generation_config.json names diffu_decoder, as the bundled demo model's does)",
    )
    p.add_argument("--block-length", type=int, default=32, help="fast decoder: block size (default 32)")
    p.add_argument(
        "--threshold",
        type=float,
        default=0.9,
        help="fast decoder: commit every masked position at least this confident (default 0.9)",
    )
    p.add_argument(
        "--factor",
        type=float,
        default=None,
        help="fast decoder: use the factor rule with this factor instead of the threshold",
    )


def model_decoder(args: argparse.Namespace, params: SamplingParams, rt: RuntimeProtocol) -> SamplingParams:
    """Without --decoder, the decoder the loaded model recommends (``RuntimeInfo.default_decoder``)."""
    return params if args.decoder else dataclasses.replace(params, decoder=rt.info.default_decoder)


def sampling_params(args: argparse.Namespace, max_new_tokens: int | None = None) -> SamplingParams:
    """The sampling flags as SamplingParams; ``max_new_tokens`` overrides the prompt flags' canvas size."""
    from assistant.errors import UsageError

    if max_new_tokens is not None:
        max_new = max_new_tokens
    elif args.suffix is not None and args.infill_tokens:
        max_new = args.infill_tokens
    else:
        max_new = args.max_new_tokens
    try:
        return SamplingParams(
            max_new_tokens=max_new,
            steps=args.steps if args.steps is not None else max_new,
            alg=args.alg,
            alg_temp=args.alg_temp,
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            eps=args.eps,
            seed=args.seed,
            decoder=args.decoder or "reference",
            block_length=args.block_length,
            threshold=args.threshold,
            factor=args.factor,
        )
    except ParamError as exc:
        raise UsageError(f"--{exc.field.replace('_', '-')}: {str(exc).split(': ', 1)[1]}") from None


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
