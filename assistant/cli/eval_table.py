"""``diffu eval``'s results on stderr: one table row per setting, then what its columns and failure
statuses mean, and where each task's details are."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from model_runtime import decoders
from model_runtime.params import SamplingParams

if TYPE_CHECKING:
    from assistant.evals.runner import Report


def print_table(name: str, reports: list[Report], labels: list[str], *, json_out: bool) -> None:
    """The results on stderr: one row per setting, then what its columns mean."""
    from rich.console import Console
    from rich.table import Table

    first = reports[0].summary
    table = Table(title=f"{name}: {first['tasks']} tasks x {first['samples_per_task']} sample(s)")
    passes = [k for k in first if k.startswith("pass@") and not k.endswith("_ci95")]
    table.add_column("setting")
    for k in passes:
        table.add_column(k, justify="right")
    table.add_column("95% CI", justify="right")
    table.add_column("passed", justify="right")
    table.add_column("tokens/s", justify="right")
    table.add_column("tokens/forward", justify="right")
    table.add_column("forwards", justify="right")
    table.add_column("generate s", justify="right")
    table.add_column("wall s", justify="right")
    table.add_column("failures", justify="left")
    for report, label in zip(reports, labels, strict=True):
        s = report.summary
        total = s["tasks"] * s["samples_per_task"]
        fails = ", ".join(f"{k} {v}" for k, v in s["statuses"].items() if k != "passed")
        wall = s.get("wall_seconds", 0.0) + s.get("test_seconds", 0.0)
        table.add_row(
            label,
            *(f"{100 * s[k]:.1f}%" for k in passes),
            "{:.1f}-{:.1f}%".format(*(100 * v for v in s["pass@1_ci95"])) if "pass@1_ci95" in s else "-",
            f"{s['passed_samples']}/{total}",
            f"{s['tokens_per_second']:.1f}" if "tokens_per_second" in s else "-",
            f"{s['tokens_per_forward']:.2f}" if "tokens_per_forward" in s else "-",
            f"{s['forwards_per_answer']:.1f}" if "forwards_per_answer" in s else "-",
            f"{s['generate_seconds']:.1f}" if "generate_seconds" in s else "-",
            f"{wall:.1f}" if wall else "-",
            fails or "-",
        )
    console = Console(stderr=True, width=max(100, Console(stderr=True).width))
    console.print(table)
    for line in _legend(reports, json_out=json_out):
        console.print(line, highlight=False)
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


# What each failure status in the table means (the sandbox's Outcome statuses, and the runner's own).
STATUS_WORDS = {
    "failed": "a test's assert failed",
    "error": "the program raised before its tests passed",
    "timeout": "it ran past --timeout",
    "killed": "a limit of the sandbox stopped it",
    "exit": "it exited non-zero without an exception",
    "generation_error": "no answer was generated (the prompt did not fit, say)",
}


def _legend(reports: list[Report], *, json_out: bool) -> list[str]:
    """What the columns say: the time columns, every failure status seen (errors by exception), and
    where the per-task details are."""
    lines = []
    if "generate_seconds" in reports[0].summary:
        lines.append(
            "generate s: the model's forwards only; wall s: the whole setting, compiles, queueing and the "
            "tests included (tokens/s divides by generate s); tokens/forward: the answers' tokens (cut at "
            "their end of text) over the model's forwards; forwards: per answer; 95% CI: pass@1's (Wilson)"
        )
    seen: dict[str, int] = {}
    kinds: dict[str, int] = {}
    for report in reports:
        for k, v in report.summary["statuses"].items():
            seen[k] = seen.get(k, 0) + v
        for r in report.results:
            if r["status"] == "error" and r.get("error"):
                kind = str(r["error"]).split(":", 1)[0].strip()
                kinds[kind] = kinds.get(kind, 0) + 1
    words = []
    for status in (s for s in seen if s != "passed"):
        word = f"{status}: {STATUS_WORDS.get(status, status)}"
        if status == "error" and kinds:
            top = sorted(kinds.items(), key=lambda kv: -kv[1])[:3]
            word += f" ({', '.join(f'{k} {v}' for k, v in top)})"
        words.append(word)
    if words:
        lines.append("; ".join(words))
    if not json_out:
        lines.append("each task's status, error and completion: add --json")
    return lines


def setting_label(params: SamplingParams, model_default: bool) -> str:
    """A setting's row name: the decoder and what sets it apart."""
    if model_default:
        return "model's default decoder"
    return decoders.get(params.decoder).label(params)
