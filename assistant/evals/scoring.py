"""Scoring answers: each task's completions run in the sandbox and judged, then pass@k and its interval.

A task is judged outside the program wherever its tests allow (``assistant/evals/judge.py``): the
program runs its code and its function on the test's inputs, and the outputs are compared here with the
reference's. A task whose tests have another shape runs its tests in the program's own process, the
fallback; every result says which (``judge``: ``outside`` or ``in-process``) and the summary counts the
tasks on each path (``summary["judge"]``), with each fallback's reason. A task without tests judges the
answer itself (``check``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from assistant.evals import judge
from assistant.evals.sandbox import Calls, Limits, Sandbox
from assistant.evals.stats import confidence_interval, pass_at_k

Advance = Callable[[int], None]


class Scorable(Protocol):
    """What scoring needs of a task (``runner.Task``)."""

    task_id: str
    program: Callable[[str], str] | None  # the answer with its tests, for the fallback
    check: Callable[[str], bool] | None  # for tasks without tests
    code: Callable[[str], str] | None  # the answer's code alone, for the judge
    suite: judge.Suite | judge.Fallback | None


@dataclass
class Report:
    summary: dict[str, Any]
    results: list[dict[str, Any]]


def judging(tasks: Sequence[Scorable]) -> list[judge.Spec | judge.Fallback | None]:
    """Per task: its cases (judged outside), the reason it keeps the in-process harness, or None (no
    program: judged by ``check``)."""
    suites = [t.suite for t in tasks if t.program is not None and isinstance(t.suite, judge.Suite)]
    specs = judge.prepare(suites) if suites else {}
    out: list[judge.Spec | judge.Fallback | None] = []
    for t in tasks:
        if t.program is None:
            out.append(None)
        elif isinstance(t.suite, judge.Suite) and t.code is not None:
            out.append(specs[t.suite.key])
        else:
            out.append(t.suite if isinstance(t.suite, judge.Fallback) else judge.Fallback("no judge for it"))
    return out


def _run(
    tasks: Sequence[Scorable],
    flat: list[tuple[int, int, str]],
    specs: list[judge.Spec | judge.Fallback | None],
    limits: Limits,
    workers: int | None,
    advance: Advance,
) -> tuple[dict[int, tuple[str, str | None, float]], dict[str, Any]]:
    """Every sample with a program, run: ``{sample: (status, error, seconds)}`` and the isolation."""
    jobs: list[tuple[int, str, Calls | None]] = []
    for k, (ti, _, c) in enumerate(flat):
        spec, task = specs[ti], tasks[ti]
        if isinstance(spec, judge.Spec) and task.code is not None:
            jobs.append((k, task.code(c), spec.calls))
        elif task.program is not None:
            jobs.append((k, task.program(c), None))
    ran: dict[int, tuple[str, str | None, float]] = {}
    isolation: dict[str, Any] = {}
    if not jobs:
        return ran, isolation
    with Sandbox(limits, workers=workers) as sandbox:
        outcomes = sandbox.map([p for _, p, _ in jobs], advance, [c for _, _, c in jobs])
        for (k, _, calls), done in zip(jobs, outcomes, strict=True):
            spec = specs[flat[k][0]]
            if calls is not None and isinstance(spec, judge.Spec):
                ran[k] = (*judge.verdict(spec, done), done.seconds)
            else:
                ran[k] = (done.status, done.error, done.seconds)
            isolation = done.isolation or isolation
    return ran, isolation


def score(
    tasks: Sequence[Scorable],
    completions: Sequence[Sequence[str]],
    *,
    ks: Sequence[int],
    sandbox_limits: Limits,
    workers: int | None,
    advance: Advance,
    gen_seconds: Sequence[Sequence[float]] | None = None,
    errors: Sequence[Sequence[str | None]] | None = None,
) -> Report:
    """Run and judge every completion; per-sample results and pass@k (k at most the samples per task)."""
    flat = [(ti, j, c) for ti, cs in enumerate(completions) for j, c in enumerate(cs)]
    specs = judging(tasks)
    ran, isolation = _run(tasks, flat, specs, sandbox_limits, workers, advance)
    results: list[dict[str, Any]] = []
    for k, (ti, j, c) in enumerate(flat):
        gen_error = errors[ti][j] if errors is not None else None
        spec = specs[ti]
        if k in ran:
            status, error, seconds = ran[k]
        else:  # judged by the task itself (no tests to run)
            check = tasks[ti].check
            status, error, seconds = ("passed" if check is not None and check(c) else "wrong"), None, 0.0
            advance(1)
        results.append(
            {
                "task_id": tasks[ti].task_id,
                "sample": j,
                "passed": status == "passed" and gen_error is None,
                "status": "generation_error" if gen_error else status,
                "error": gen_error or error,
                "judge": None
                if spec is None
                else "outside"
                if isinstance(spec, judge.Spec)
                else "in-process",
                "completion": c,
                "generate_seconds": round(gen_seconds[ti][j], 4) if gen_seconds is not None else None,
                "exec_seconds": round(seconds, 4),
            }
        )
    summary = _summary(results, ks)
    if any(s is not None for s in specs):
        fallback = {
            t.task_id: s.reason for t, s in zip(tasks, specs, strict=True) if isinstance(s, judge.Fallback)
        }
        outside = sum(isinstance(s, judge.Spec) for s in specs)
        summary["judge"] = {"outside": outside, "in_process": len(fallback), "fallback": fallback}
    summary["isolation"] = isolation
    return Report(summary, results)


def judge_line(summary: dict[str, Any]) -> str | None:
    """One line for a report's reader: how many tasks were judged outside the programs, how many by the
    in-process fallback (the first few named); None when no task ran a program."""
    judged = summary.get("judge")
    if not judged:
        return None
    fallback = sorted(judged["fallback"])
    named = f" ({', '.join(fallback[:5])}{', ...' if len(fallback) > 5 else ''})" if fallback else ""
    return (
        f"judge: {judged['outside']} tasks judged outside the program (outputs compared with the "
        f"reference's), {judged['in_process']} by the in-process harness{named}"
    )


def _path(spec: judge.Spec | judge.Fallback | None) -> str | None:
    """Where a sample was judged: ``outside`` the program, ``in-process`` (the fallback), or None."""
    if spec is None:
        return None
    return "outside" if isinstance(spec, judge.Spec) else "in-process"


def _summary(results: list[dict[str, Any]], ks: Sequence[int]) -> dict[str, Any]:
    by_task: dict[str, list[bool]] = {}
    for r in results:
        by_task.setdefault(r["task_id"], []).append(r["passed"])
    n = min(len(v) for v in by_task.values())
    summary: dict[str, Any] = {
        "tasks": len(by_task),
        "samples_per_task": n,
        "passed_samples": sum(r["passed"] for r in results),
    }
    for k in ks:
        if k <= n:
            rates = [pass_at_k(len(v), sum(v), k) for v in by_task.values()]
            summary[f"pass@{k}"] = sum(rates) / len(rates)
            if k == 1:
                summary["pass@1_ci95"] = list(confidence_interval(rates))
    statuses: dict[str, int] = {}
    for r in results:
        statuses[r["status"]] = statuses.get(r["status"], 0) + 1
    summary["statuses"] = dict(sorted(statuses.items()))
    return summary
