"""The decoder table (docs/performance.md): every decoder setting on the decision set, interleaved, resumable.

    python scripts/decoder_table.py OUT_DIR --lines LINES.jsonl --chat HELDOUT.jsonl [--model DIR]
        [--benchmarks humaneval,lines,chat] [--settings reference,fast,...] [--limit N] [--report]
        [--exclude TASKS.jsonl]

The decision set (issue #37):

- ``humaneval``: HumanEval's 1,033 single-line infills (the benchmark the speed goal is stated on), each
  answer one line (the editor's single-line path), pass@1 by the tests in the sandbox;
- ``lines``: the held-out single-line infills of ``scripts/heldout_lines.py`` (2,000 lines of files the
  model never saw), right when the line is the hidden one;
- ``chat``: the 200 held-out chat requests of ``scripts/sft_data.py`` with the model's chat settings
  (first decodes, no second decode), right when the answer holds a fenced block that parses and defines
  a function (``assistant/evals/instructions.py``);
- the editors' empty-line and block suggestions (issue #44): ``humaneval-multi``, a fixed sample of
  HumanEval's multi-line infills (pass@1 by the tests), and ``spans``, the held-out multi-line spans of
  ``scripts/heldout_lines.py --spans`` (right when the fill is the hidden lines); each asked as the editor
  asks it there, with its mode's canvas and its scope's end (``runner.editor_job``).

Every setting of ``SETTINGS`` answers every task in the same process, on the same machine, interleaved:
the tasks are cut into chunks and each chunk runs every setting back to back, in an order that rotates
from chunk to chunk, so a machine whose speed drifts (other work, thermal limits) slows every setting
alike. Each (benchmark, setting, chunk) result is appended to ``OUT_DIR/results.jsonl`` as soon as it is
done, with the load average at that moment; run the same command again to go on where it stopped. At
the end (and with ``--report`` alone) it writes ``OUT_DIR/table.json`` and ``OUT_DIR/table.md``: per
benchmark and setting the quality with its 95% interval, the paired difference from the reference
decoder with its 95% interval, generation seconds (compiling excluded) and the reference's time over it
(with the 95% interval of the chunks' paired ratios), tokens per second, tokens per forward and
forwards per answer. Tokens are the answers' own (each cut at its end of text, or its line's end), so
a decoder that stops early is not credited with tokens it never decoded; time decides.

The settings are frozen here: they were chosen on the last 200 held-out lines before this table was run
(docs/performance.md says how), never on HumanEval.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from assistant.evals import humaneval as he
from assistant.evals import instructions as ins
from assistant.evals import lines as line_tasks
from assistant.evals import runner
from assistant.evals.sandbox import Limits
from assistant.evals.stats import chunk_seconds, confidence_interval, paired, soft_scores, time_ratio


@dataclass(frozen=True)
class Setting:
    """A decoder setting: its knobs for the infills and for the chat (over the model's chat defaults),
    and the rows it generates together (None: the largest batch bucket, as diffu eval)."""

    infill: dict[str, Any]
    chat: dict[str, Any]
    batch: int | None = None


SETTINGS: dict[str, Setting] = {
    # The infills ask for one line (max_lines 1): every decoder, the reference's included, stops once the
    # line is written (a batch once every row's is).
    "reference": Setting({"decoder": "reference"}, {"decoder": "reference"}),
    "reference-1row": Setting({"decoder": "reference"}, {"decoder": "reference"}, batch=1),
    "fast": Setting({"decoder": "fast", "block_length": 32}, {"decoder": "fast"}),
    "fast-1row": Setting({"decoder": "fast", "block_length": 32}, {"decoder": "fast"}, batch=1),
    # Blocks of 8: the fast decoder's early stop after each block reaches the line's end sooner.
    "fast-b8": Setting(
        {"decoder": "fast", "block_length": 8}, {"decoder": "fast", "block_length": 8}, batch=1
    ),
    # The editors' multi-line suggestions before the table chose theirs: the model's own fast decoder,
    # its one block as long as the canvas (64 for a block, 32 for an empty line).
    "fast-b64": Setting({"decoder": "fast", "block_length": 64}, {"decoder": "fast"}, batch=1),
    "fast-b8-4rows": Setting({"decoder": "fast", "block_length": 8}, {"decoder": "fast", "block_length": 8}),
    # One row at a time: a batch runs until its slowest row ends its line, which doubled the sliding
    # decoder's forwards per answer at 4 rows on the held-out lines. A chat answer gets the chat's block
    # length as its window: windows of 16 broke the answers (30% good blocks on 100 validation requests,
    # 44% repeating a line, against 67% and 0% with 64).
    "sliding": Setting({"decoder": "sliding", "window": 8}, {"decoder": "sliding", "window": 64}, batch=1),
    "sliding-4rows": Setting({"decoder": "sliding", "window": 8}, {"decoder": "sliding", "window": 64}),
    # Wider windows, for the editors' multi-line suggestions.
    "sliding-w16": Setting(
        {"decoder": "sliding", "window": 16}, {"decoder": "sliding", "window": 64}, batch=1
    ),
    "sliding-w32": Setting(
        {"decoder": "sliding", "window": 32}, {"decoder": "sliding", "window": 64}, batch=1
    ),
    "sliding-credit": Setting(
        {"decoder": "sliding", "window": 8, "commit_rule": "credit"},
        {"decoder": "sliding", "window": 64, "commit_rule": "credit"},
        batch=1,
    ),
    "sliding-credit-4rows": Setting(
        {"decoder": "sliding", "window": 8, "commit_rule": "credit"},
        {"decoder": "sliding", "window": 64, "commit_rule": "credit"},
    ),
    "sliding-refresh4": Setting(
        {"decoder": "sliding", "window": 8, "refresh_every": 4},
        {"decoder": "sliding", "window": 64, "refresh_every": 16},
        batch=1,
    ),
}
BENCHMARKS = ("humaneval", "lines", "chat", "humaneval-multi", "spans")
MULTI_LINE = ("humaneval-multi", "spans")  # the editors' empty-line and block suggestions
INFILL_TOKENS = 32  # the editor's canvas for an empty line, as diffu eval's single-line infills
CHUNK = {"humaneval": 32, "lines": 32, "chat": 16, "humaneval-multi": 16, "spans": 16}
# HumanEval's 5,815 multi-line infills are drawn from (a fixed sample: the canonical solutions' spans of
# one problem are much alike); seed 0.
MULTI_SAMPLE = 400


def load_tasks(bench: str, args: argparse.Namespace) -> list[runner.Task]:
    if bench == "humaneval":
        items = he.infill_tasks(he.load_problems(), "single-line")
        return runner.infill_tasks(items, INFILL_TOKENS, single_line=True)
    if bench == "lines":
        return runner.line_tasks(line_tasks.read(args.lines), INFILL_TOKENS)
    if bench == "humaneval-multi":
        items = he.infill_tasks(he.load_problems(), "multi-line")
        items = random.Random(0).sample(items, min(MULTI_SAMPLE, len(items)))
        return runner.infill_tasks(items, None)  # each the editor's canvas for its mode, its scope's end
    if bench == "spans":
        return runner.line_tasks(line_tasks.read(args.spans), None, single_line=False)
    from model_runtime.tokenizer import chat_prompt

    with args.chat.open(encoding="utf-8") as f:
        requests = [json.loads(line) for line in f if line.strip()]
    return [
        runner.Task(
            f"chat/{i}",
            runner.Job(chat_prompt(r["messages"][:-1]), 0, chat=True),
            None,
            check=ins.has_good_block,
        )
        for i, r in enumerate(requests)
    ]


def params_for(bench: str, setting: str, chat_defaults: dict[str, Any]) -> Any:
    from model_runtime.params import SamplingParams

    s = SETTINGS[setting]
    if bench == "chat":
        knobs = {k: v for k, v in chat_defaults.items() if k != "retry_block"} | s.chat
        return SamplingParams(**knobs)
    if bench in MULTI_LINE:  # each job's canvas and scope are its own (runner.editor_job)
        return SamplingParams(max_new_tokens=INFILL_TOKENS, steps=INFILL_TOKENS, **s.infill)
    return SamplingParams(max_new_tokens=INFILL_TOKENS, steps=INFILL_TOKENS, max_lines=1, **s.infill)


def run_chunk(
    rt: Any, tasks: Sequence[runner.Task], params: Any, batch: int, limits: Limits
) -> list[dict[str, Any]]:
    """Answer and judge ``tasks`` with ``params``: one record per task."""
    tokens = params.max_new_tokens
    jobs = [runner.Job(t.job.prompt, t.job.tokens or tokens, t.job.suffix, t.job.chat) for t in tasks]
    out = runner.LocalGenerator(rt, params, batch).generate(jobs, lambda n: None)
    completions = [[t.completion(g.text)] for t, g in zip(tasks, out, strict=True)]
    report = runner.score(
        tasks,
        completions,
        ks=[1],
        sandbox_limits=limits,
        workers=None,
        advance=lambda n: None,
        errors=[[g.error] for g in out],
    )
    records = []
    for t, g, r in zip(tasks, out, report.results, strict=True):
        record = {
            "task_id": t.task_id,
            "passed": bool(r["passed"]),
            "status": r["status"],
            "seconds": g.seconds,
            "tokens": g.tokens,
            "forwards": g.forwards,
            "text": g.text,
        }
        if t.job.chat:
            record["repeats_line"] = ins.repeats_a_line(g.text)
        records.append(record)
    return records


def read_results(path: Path) -> dict[tuple[str, str, int], dict[str, Any]]:
    done: dict[tuple[str, str, int], dict[str, Any]] = {}
    if path.is_file():
        with path.open(encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    row = json.loads(line)
                    done[(row["benchmark"], row["setting"], row["chunk"])] = row
    return done


def measure(args: argparse.Namespace, out: Path, benchmarks: Sequence[str], settings: Sequence[str]) -> None:
    import model_runtime
    from assistant.config import load_config
    from model_runtime.generation_config import chat_defaults

    config = load_config({"model": str(args.model)})[0]
    # The daemon's shape buckets, as diffu eval loads the model.
    rt = model_runtime.load(
        args.model,
        length_buckets=config.length_buckets,
        batch_buckets=config.batch_buckets,
        max_context=config.max_context,
    )
    batch = args.batch or max(rt.batch_buckets)
    defaults = chat_defaults(args.model)
    path = out / "results.jsonl"
    done = read_results(path)
    limits = Limits(timeout=3.0)
    for bench in benchmarks:
        tasks = load_tasks(bench, args)[: args.limit]
        size = CHUNK[bench]
        chunks = [tasks[i : i + size] for i in range(0, len(tasks), size)]
        for c, chunk in enumerate(chunks):
            # A different setting goes first in each chunk: none always runs right after another.
            order = [settings[(c + k) % len(settings)] for k in range(len(settings))]
            for setting in order:
                if (bench, setting, c) in done:
                    continue
                params = params_for(bench, setting, defaults)
                load = os.getloadavg()[0]
                t0 = time.perf_counter()
                rows = args.batch or SETTINGS[setting].batch or batch
                records = run_chunk(rt, chunk, params, rows, limits)
                row = {
                    "benchmark": bench,
                    "setting": setting,
                    "chunk": c,
                    "tasks": records,
                    "load_average": round(load, 2),
                    "wall_seconds": round(time.perf_counter() - t0, 3),
                    "params": params.to_dict(),
                    "batch": rows,
                    "device": rt.info.device,
                }
                with path.open("a", encoding="utf-8") as f:
                    f.write(json.dumps(row) + "\n")
                done[(bench, setting, c)] = row
                gen = sum(r["seconds"] for r in records)
                print(
                    f"{bench} chunk {c + 1}/{len(chunks)} {setting}: {sum(r['passed'] for r in records)}"
                    f"/{len(records)} right, {gen:.1f} s of generation, load {load:.1f}",
                    file=sys.stderr,
                    flush=True,
                )


def report(
    out: Path,
    benchmarks: Sequence[str],
    settings: Sequence[str],
    exclude: frozenset[str] = frozenset(),
    baseline: str = "reference",
    tasks: dict[str, runner.Task] | None = None,
) -> dict[str, Any]:
    """Write the table of what is measured; tasks named in ``exclude`` (the set the settings were chosen
    on, say) are left out of it. Every setting's quality and time are set against ``baseline``'s; the
    multi-line benchmarks' answers are also scored softly against ``tasks``' hidden lines."""
    rows = read_results(out / "results.jsonl")
    table: dict[str, Any] = {"benchmarks": {}, "settings": {s: asdict(SETTINGS[s]) for s in settings}}
    table["excluded_tasks"] = len(exclude)
    table["baseline"] = baseline
    loads = [r["load_average"] for r in rows.values()]
    table["load_average"] = {
        "mean": round(sum(loads) / len(loads), 2) if loads else None,
        "max": max(loads, default=None),
    }
    table["device"] = next((r["device"] for r in rows.values()), None)
    for bench in benchmarks:
        per: dict[str, dict[str, dict[str, Any]]] = {}
        chunk_of: dict[str, int] = {}
        for (b, s, c), row in sorted(rows.items()):
            if b == bench and s in settings:
                per.setdefault(s, {}).update({t["task_id"]: t for t in row["tasks"]})
                chunk_of.update({t["task_id"]: c for t in row["tasks"]})
        if not per:
            continue
        # Only tasks every setting has answered: the comparison is paired.
        common = sorted(set.intersection(*(set(v) for v in per.values())) - exclude)
        entries: dict[str, Any] = {}
        for s in [s for s in settings if s in per]:  # in the order asked for: the reference first
            by_id = per[s]
            recs = [by_id[t] for t in common]
            passed = [r["passed"] for r in recs]
            gen = sum(r["seconds"] for r in recs)
            tokens = sum(r["tokens"] for r in recs)
            forwards = sum(r["forwards"] for r in recs)
            low, high = confidence_interval([float(p) for p in passed])
            entry = {
                "tasks": len(recs),
                "right": sum(passed),
                "quality": sum(passed) / max(len(recs), 1),
                "quality_ci95": [low, high],
                "generate_seconds": round(gen, 2),
                "tokens": tokens,
                "tokens_per_second": round(tokens / gen, 1) if gen else None,
                "tokens_per_forward": round(tokens / forwards, 3) if forwards else None,
                "forwards_per_answer": round(forwards / max(len(recs), 1), 2),
            }
            if bench == "chat":
                entry["repeats_line"] = sum(r.get("repeats_line", False) for r in recs) / max(len(recs), 1)
            entries[s] = entry
        if baseline in per:
            ref = [per[baseline][t]["passed"] for t in common]
            for s, entry in entries.items():
                mean, low, high = paired([per[s][t]["passed"] for t in common], ref)
                entry["minus_baseline"] = [mean, low, high]
                base = entries[baseline]["generate_seconds"]
                entry["baseline_time_over_this"] = (
                    round(base / entry["generate_seconds"], 2) if entry["generate_seconds"] else None
                )
                ratio = None
                if s != baseline:
                    ratio = time_ratio(chunk_seconds(common, chunk_of, per[baseline], per[s]))
                entry["baseline_time_over_this_ci95"] = (
                    [round(ratio[1], 2), round(ratio[2], 2)] if ratio else None
                )
        if tasks and bench in MULTI_LINE:
            fills = {s: [tasks[t].completion(per[s][t]["text"]) for t in common] for s in per}
            expected = [tasks[t].expected or "" for t in common]
            for s, entry in entries.items():
                entry.update(soft_scores(fills[s], expected, fills.get(baseline)))
        table["benchmarks"][bench] = entries
    (out / "table.json").write_text(json.dumps(table, indent=1) + "\n", encoding="utf-8")
    (out / "table.md").write_text(markdown(table), encoding="utf-8")
    return table


def speedup(entry: dict[str, Any]) -> str:
    """The baseline's time over this setting's, with the interval of the per-chunk ratios."""
    value = entry.get("baseline_time_over_this")
    ci = entry.get("baseline_time_over_this_ci95")
    return "-" if not value else f"{value} ({ci[0]}-{ci[1]})" if ci else f"{value}"


def markdown(table: dict[str, Any]) -> str:
    pct: Callable[[float], str] = lambda v: f"{100 * v:.1f}"  # noqa: E731
    base = table.get("baseline", "reference")
    lines = [
        f"| benchmark | setting | right | 95% CI | minus {base} (95% CI), points | generation s "
        f"| {base} time / this (95% CI) | tokens/s | tokens/forward | forwards/answer |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for bench, entries in table["benchmarks"].items():
        for s, e in entries.items():
            diff = e.get("minus_baseline")
            lines.append(
                f"| {bench} ({e['tasks']}) | {s} | {pct(e['quality'])}% ({e['right']}) "
                f"| {pct(e['quality_ci95'][0])}-{pct(e['quality_ci95'][1])}% "
                f"| {f'{pct(diff[0])} ({pct(diff[1])} to {pct(diff[2])})' if diff else '-'} "
                f"| {e['generate_seconds']} | {speedup(e)} "
                f"| {e['tokens_per_second']} | {e['tokens_per_forward']} | {e['forwards_per_answer']} |"
            )
    soft = [(b, s, e) for b, es in table["benchmarks"].items() for s, e in es.items() if "similarity" in e]
    if soft:
        lines += ["", f"| benchmark | setting | edit similarity (95% CI) | minus {base} | first line right "]
        lines[-1] += f"(95% CI) | minus {base}, points |\n|---|---|---|---|---|---|"
    for bench, s, e in soft:
        sim, first = e["similarity_ci95"], e["first_line_ci95"]
        ds, df = e.get("similarity_minus_baseline"), e.get("first_line_minus_baseline")
        lines.append(
            f"| {bench} ({e['tasks']}) | {s} | {e['similarity']:.3f} ({sim[0]:.3f}-{sim[1]:.3f}) "
            f"| {f'{ds[0]:+.3f} ({ds[1]:+.3f} to {ds[2]:+.3f})' if ds else '-'} "
            f"| {pct(e['first_line'])}% ({pct(first[0])}-{pct(first[1])}%) "
            f"| {f'{pct(df[0])} ({pct(df[1])} to {pct(df[2])})' if df else '-'} |"
        )
    load = table["load_average"]
    lines.append("")
    lines.append(f"Device: {table['device']}; load average {load['mean']} on average, {load['max']} at most.")
    if table.get("excluded_tasks"):
        lines.append(f"Left out: the {table['excluded_tasks']} tasks of the --exclude file.")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out", type=Path)
    parser.add_argument("--lines", type=Path, default=None, help="scripts/heldout_lines.py's tasks")
    parser.add_argument("--chat", type=Path, default=None, help="scripts/sft_data.py's heldout.jsonl")
    parser.add_argument("--spans", type=Path, default=None, help="scripts/heldout_lines.py --spans's tasks")
    parser.add_argument("--model", type=Path, default=None, help="default: the bundled model")
    parser.add_argument("--benchmarks", default=",".join(BENCHMARKS))
    parser.add_argument("--settings", default=",".join(SETTINGS), help="comma-separated names of SETTINGS")
    parser.add_argument("--limit", type=int, default=None, help="only the first N tasks of each benchmark")
    parser.add_argument(
        "--batch", type=int, default=None, help="rows per batch, every setting (default: each its own)"
    )
    parser.add_argument("--report", action="store_true", help="only write the table from what is measured")
    parser.add_argument(
        "--baseline",
        default="reference",
        help="the setting every other is compared with (default: reference)",
    )
    parser.add_argument(
        "--exclude",
        type=Path,
        default=None,
        help="a tasks file (JSON lines with task_id) whose tasks the table leaves out, e.g. the choosing set",
    )
    args = parser.parse_args(argv)
    benchmarks = [b for b in args.benchmarks.split(",") if b]
    settings = [s for s in args.settings.split(",") if s]
    unknown = sorted(set(benchmarks) - set(BENCHMARKS)) + sorted(
        set(settings + [args.baseline]) - set(SETTINGS)
    )
    if unknown:
        parser.error(f"unknown benchmark or setting: {', '.join(unknown)}")
    needs = (("lines", args.lines), ("chat", args.chat), ("spans", args.spans))
    if any(b in benchmarks and path is None for b, path in needs):
        parser.error("the lines, chat and spans benchmarks need --lines, --chat and --spans FILE")
    if args.model is None:
        from model_runtime.bundled import bundled_model_dir

        args.model = bundled_model_dir()
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.report:
        measure(args, args.out, benchmarks, settings)
    exclude: frozenset[str] = frozenset()
    if args.exclude is not None:
        with args.exclude.open(encoding="utf-8") as f:
            exclude = frozenset(json.loads(line)["task_id"] for line in f if line.strip())
    tasks = {t.task_id: t for b in benchmarks if b in MULTI_LINE for t in load_tasks(b, args)}
    report(args.out, benchmarks, settings, exclude, args.baseline, tasks)
    print((args.out / "table.md").read_text(encoding="utf-8"), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
