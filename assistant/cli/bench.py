"""``diffu bench``: the benchmark suite, and ``diffu bench generate`` for one generation setting.

Figures are medians after a warm-up run; the JAX compilation cache is pointed at a fresh temporary
directory (unless ``--keep-cache``) so that compile times are real compiles.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Any

from assistant.cli.generate import add_generation_options, build_rows, check_prompt_args
from assistant.cli.model_options import add_quantize_option, model_decoder, sampling_params


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _pair(text: str) -> tuple[int, int]:
    try:
        new, steps = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected NEWxSTEPS such as 128x128, got {text!r}") from None
    if new < 1 or steps < 1:
        raise argparse.ArgumentTypeError(f"expected positive numbers, got {text!r}")
    return new, steps


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "bench",
        help="benchmark the model in this process",
        description="Load, compile, forward latency/throughput over batch sizes and canvas lengths, "
        "generation tokens/s for both decoders, batch scaling, against the machine's own matmul rate.",
    )
    p.add_argument("--model", default=None, help="checkpoint directory or hub id (default: $DIFFU_MODEL)")
    p.add_argument("--dtype", default=None, choices=("float32", "bfloat16", "float16"))
    add_quantize_option(p)
    p.add_argument("--tp", type=int, default=1, help="tensor parallel degree (default 1)")
    p.add_argument("--dp", type=int, default=None, help="data parallel replicas (default: remaining devices)")
    p.add_argument("--batches", type=_ints, default=[1, 2, 4, 8], help="batch sizes (default 1,2,4,8)")
    p.add_argument(
        "--lengths", type=_ints, default=[128, 256, 512], help="canvas lengths (default 128,256,512)"
    )
    p.add_argument(
        "--generate",
        type=_pair,
        action="append",
        default=None,
        metavar="NEWxSTEPS",
        help="generation settings, repeatable (default 128x128)",
    )
    p.add_argument("--repeat", type=int, default=3, help="timed repeats per figure (default 3)")
    p.add_argument("--keep-cache", action="store_true", help="use the persistent compilation cache")
    p.add_argument("--json", action="store_true", help="print the results as one JSON object")
    p.add_argument("--plot", metavar="FILE.png", help="also draw the results (needs matplotlib)")
    p.set_defaults(func=run_suite)
    sub = p.add_subparsers(dest="bench_command", metavar="generate")
    g = sub.add_parser(
        "generate",
        help="time one generation setting",
        description="Time generations with the diffu generate options.",
    )
    add_generation_options(g)
    g.add_argument("--repeat", type=int, default=5, help="timed repeats (default 5)")
    g.add_argument(
        "--stream",
        action="store_true",
        help="an event per forward, as the daemon runs every job, instead of one call per generation",
    )
    g.add_argument("--keep-cache", action="store_true", help="use the persistent compilation cache")
    g.add_argument("--json", action="store_true", help="print the results as one JSON object")
    g.set_defaults(func=run_generate)


def _fresh_cache(args: argparse.Namespace) -> None:
    if not args.keep_cache:
        os.environ["DIFFU_JAX_CACHE_DIR"] = tempfile.mkdtemp(prefix="diffu-bench-cache-")


def _load(args: argparse.Namespace):
    from assistant.cli.model_options import init_multihost, load_with_progress, quantize_of

    if hasattr(args, "coordinator"):  # bench generate takes the generate options, several hosts included
        init_multihost(args)
    t0 = time.perf_counter()
    rt = load_with_progress(
        args.model or os.environ.get("DIFFU_MODEL"),
        args.dtype,
        tp=args.tp,
        dp=args.dp,
        quantize=quantize_of(args),
    )
    return rt, time.perf_counter() - t0


def run_suite(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import Progress

    from assistant.errors import UsageError
    from model_runtime import bench
    from model_runtime.errors import DiffuError

    if args.repeat < 1:
        raise UsageError("--repeat: must be >= 1")
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise UsageError("--plot needs matplotlib: pip install -e '.[plot]' in the clone") from None
    _fresh_cache(args)
    generate = args.generate or [(128, 128)]
    console = Console(stderr=True, soft_wrap=True)
    try:
        rt, load_seconds = _load(args)
        longest = max(args.lengths + [n + 16 for n, _ in generate])
        context = rt.info.max_context
        if longest > context:
            raise UsageError(f"a canvas of {longest} tokens exceeds the model's context of {context}")
        total = 1 + len(args.lengths) * len(args.batches) + 2 * len(generate) + len(args.batches)
        with Progress(console=console, transient=True, disable=not console.is_terminal) as progress:
            task = progress.add_task("benchmark", total=total)

            def tick(label: str) -> None:
                progress.update(task, description=label, advance=1)

            result = bench.suite(
                rt,
                batches=args.batches,
                lengths=args.lengths,
                generate=generate,
                repeat=args.repeat,
                tick=tick,
                load_seconds=load_seconds,
            )
    except DiffuError as exc:
        raise UsageError(str(exc)) from None
    if args.plot:
        bench.plot(result, args.plot)
    if args.json:
        print(json.dumps(result))
    else:
        _print_suite(result)
    return 0


def _print_suite(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(soft_wrap=True)
    env = result["environment"]
    weights = result["dtype"] + (f", {result['quantize']} weights" if result.get("quantize") else "")
    console.print(
        f"[bold]{result['model']}[/] ({weights}) on {env['device']}, {env['cpu']}; "
        f"jax {env['jax']}; load {result.get('load_seconds', 0):.2f}s; "
        f"matmul ceiling {result['matmul_gflops']:.1f} GFLOP/s"
    )
    table = Table("batch", "length", "ms / forward", "tokens/s", "GFLOP/s", title="forward")
    for f in result["forward"]:
        table.add_row(
            str(f["batch"]),
            str(f["length"]),
            f"{f['median_seconds'] * 1e3:.1f}",
            f"{f['tokens_per_second']:.0f}",
            f"{f['gflops_per_second']:.1f}",
        )
    console.print(table)
    table = Table(
        "decoder", "batch", "new/steps", "forwards", "seconds", "tokens/s", "compile s", title="generation"
    )
    for g in result["generation"] + result["batch_scaling"]:
        table.add_row(
            g["decoder"],
            str(g["batch"]),
            f"{g['max_new_tokens']}/{g['steps']}",
            str(g["forwards"]),
            f"{g['median_seconds']:.3f}",
            f"{g['tokens_per_second']:.1f}",
            f"{g['compile_seconds']:.2f}",
        )
    console.print(table)


def run_generate(args: argparse.Namespace) -> int:
    from assistant.errors import UsageError
    from model_runtime import bench
    from model_runtime.errors import DiffuError

    if args.repeat < 1:
        raise UsageError("--repeat: must be >= 1")
    check_prompt_args(args)
    _fresh_cache(args)
    try:
        rt, load_seconds = _load(args)
        # The model's own settings where no flag is given, as diffu generate runs it.
        params = model_decoder(args, sampling_params(args, model=rt.info.chat_defaults), rt)
        rows = build_rows(rt, args, params)
        prompts = [list(r.ids[: r.region[0]]) for r in rows]
        if args.suffix is not None:
            raise UsageError("bench generate times plain generation; drop --suffix")
        result = bench.generation(
            rt, prompts, params, chat=not args.raw, repeat=args.repeat, stream=args.stream
        )
    except DiffuError as exc:
        raise UsageError(str(exc)) from None
    result.pop("generated")
    result.update(
        load_seconds=load_seconds,
        model=rt.info.model_name,
        dtype=rt.info.dtype,
        quantize=rt.info.quantize_mode,
        environment=bench.environment(),
    )
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"{result['decoder']} decoder{', streamed' if args.stream else ''}, batch {result['batch']}, "
            f"{result['max_new_tokens']} tokens, "
            f"{result['forwards']} forwards: median {result['median_seconds']:.3f}s, "
            f"{result['tokens_per_second']:.1f} tokens/s, compile {result['compile_seconds']:.2f}s",
            file=sys.stdout,
        )
    return 0
