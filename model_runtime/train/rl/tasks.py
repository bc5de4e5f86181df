"""Task files for coupled-GRPO and ``diffu eval tasks``: AceCode's format, validated, and its chat prompt.

One JSON object per line, as TIGER-Lab/AceCode-89K (the published recipe's data)::

    {"id": "add_3", "question": "Write a Python function ...", "test_cases": ["assert add_3(1) == 4", ...]}

``question`` and ``test_cases`` are required (other keys are kept and passed to reward functions, as
TRL passes a dataset's columns); ``id`` names the task in messages and reports (default: ``line N``).
Every test case must parse as Python: a test that cannot run would score every answer 0 and teach
nothing, so a file holding one is refused with the line and the task named.

The prompt is the published ``make_conversation`` (``grpo.py``): the recipe's system prompt, then the
question followed by ``"\\nTest cases: "`` and the first test, unless the question already shows code in
a fence. No JAX here: ``diffu eval`` reads task files through this module.
"""

from __future__ import annotations

import ast
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from model_runtime.errors import InputError

SYSTEM_PROMPT = "You are a helpful assistant."  # recipes/config_coupled_code.yaml system_prompt


@dataclass(frozen=True)
class Task:
    """One task: what is asked, the asserts that check an answer, and any other columns of its line."""

    task_id: str
    question: str
    test_cases: tuple[str, ...]
    extra: dict[str, Any] = field(default_factory=dict)

    def messages(self) -> list[dict[str, str]]:
        """The chat the model answers (published ``make_conversation``)."""
        content = self.question
        if "\n```\n" not in self.question:
            content += "\nTest cases: " + self.test_cases[0]
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": content}]

    def columns(self) -> dict[str, Any]:
        """The line's columns as a reward function receives them (one value per task)."""
        tests = list(self.test_cases)
        return {**self.extra, "id": self.task_id, "question": self.question, "test_cases": tests}


def parse_task(row: object, where: str) -> Task:
    """Validate one decoded line; ``where`` (``file:line``) starts every message."""
    if not isinstance(row, dict):
        raise InputError(f"{where}: expected a JSON object with question and test_cases")
    tid = row.get("id", where.rsplit(":", 1)[-1])
    name = f"{where} (task {tid!r})"
    if not isinstance(tid, str | int) or isinstance(tid, bool) or str(tid) == "":
        raise InputError(f"{where}: id must be a non-empty string")
    question = row.get("question")
    if not isinstance(question, str) or not question.strip():
        raise InputError(f"{name}: question must be a non-empty string")
    tests = row.get("test_cases")
    if tests is None or tests == []:
        raise InputError(f"{name}: the task has no test cases (test_cases: a list of assert statements)")
    if not isinstance(tests, list) or not all(isinstance(t, str) for t in tests):
        raise InputError(f"{name}: test_cases must be a list of strings")
    for i, test in enumerate(tests, 1):
        if not test.strip():
            raise InputError(f"{name}: test {i} is empty")
        try:
            ast.parse(test)
        except SyntaxError as exc:
            raise InputError(f"{name}: test {i} does not parse ({exc.msg}): {test[:80]!r}") from None
    extra = {k: v for k, v in row.items() if k not in ("id", "question", "test_cases")}
    return Task(str(tid), question, tuple(tests), extra)


def read_tasks(path: str | os.PathLike[str]) -> list[Task]:
    """Every task of a JSONL file, in file order; the first bad line raises InputError naming it."""
    path = Path(path)
    try:
        handle = path.open(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"{path}: cannot read the task file ({exc.strerror})") from None
    tasks: list[Task] = []
    seen: dict[str, int] = {}
    with handle:
        try:
            for n, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                where = f"{path}:{n}"
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise InputError(f"{where}: not JSON ({exc.msg})") from None
                task = parse_task(row, where)
                if task.task_id in seen:
                    raise InputError(f"{where}: task id {task.task_id!r} repeats line {seen[task.task_id]}")
                seen[task.task_id] = n
                tasks.append(task)
        except UnicodeDecodeError:
            raise InputError(f"{path}: not UTF-8 text") from None
    if not tasks:
        raise InputError(f"{path}: no tasks")
    return tasks


def write_tasks(path: str | os.PathLike[str], tasks: list[Task]) -> None:
    """Write tasks as AceCode JSONL lines (the inverse of ``read_tasks``)."""
    with Path(path).open("w", encoding="utf-8") as f:
        for t in tasks:
            row = {"id": t.task_id, "question": t.question, "test_cases": list(t.test_cases), **t.extra}
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
