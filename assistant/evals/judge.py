"""Judging a program outside it: differential testing against the reference, as EvalPlus does.

A program under test shares its process with anything that judges inside it: it can walk the frames to
a pass marker, replace ``check`` before it runs, or return an object equal to everything. So the judge
is the evaluator itself. For each task (a ``Suite``):

1. **Its cases**, once: the test's asserts are rewritten into recorded calls (``judge_extract``) and run
   with the reference solution in a sandbox of its own (``judge_reference``, one run for a batch of
   tasks): each call's input as data, the comparison the assert makes, and the reference's output as
   the expected one (``Spec``). A task whose test has another shape, or whose reference does not pass
   its own test, keeps the in-process harness instead (``Fallback``, with its reason): reports count and
   label those tasks.
2. **Each program**, judged: its code runs, then its function on each input, in the sandbox; outputs
   come back as data (``sandbox_values``: an object equal to everything does not serialize) and
   ``verdict`` compares them here, by value and type (a list is not a tuple; floats with the test's own
   tolerance where it has one), in the test's order: the first wrong output fails the program, as the
   first failing assert would have.

``prepare`` caches each task's cases for the life of the process (a HumanEval test that draws random
inputs draws them once per process).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from assistant.evals import judge_extract, judge_reference, sandbox_values
from assistant.evals.humaneval import Problem
from assistant.evals.sandbox import Calls, Limits, Outcome, Sandbox

SECONDS_PER_TASK = 10.0  # a reference slower than this on one task leaves the task to the fallback


@dataclass(frozen=True)
class Suite:
    """A task's tests for the judge: the reference code, the test (a module defining
    ``check(candidate)``), the function a program must define, and whether the reference defines it
    (an RL task may come without a solution: then the test's own expected values are the reference)."""

    reference: str
    test: str
    function: str
    has_reference: bool = True

    @property
    def key(self) -> str:
        text = json.dumps([self.reference, self.test, self.function, self.has_reference])
        return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True)
class Case:
    """One call: its input (data), the comparison, the expected output (decoded), the tolerance."""

    input: str
    op: str
    expected: Any
    tol: float | None
    strict: bool
    wrap: str | None

    def holds(self, output: Any) -> bool:
        return judge_reference.holds(self.op, output, self.expected, self.tol, self.strict)


@dataclass(frozen=True)
class Spec:
    """A task judged outside the program: its function and cases, in the test's order."""

    function: str
    cases: tuple[Case, ...]

    @property
    def calls(self) -> Calls:
        return Calls(self.function, tuple(c.input for c in self.cases), tuple(c.wrap for c in self.cases))


@dataclass(frozen=True)
class Fallback:
    """A task whose tests run in the program's own process (today's harness), and why."""

    reason: str


def humaneval_suite(problem: Problem) -> Suite:
    """A HumanEval problem's suite: the prompt and canonical solution are the reference."""
    return Suite(problem.prompt + problem.canonical_solution, problem.test, problem.entry_point)


def assert_suite(tests: Sequence[str], solution: str | None) -> Suite | Fallback:
    """An AceCode task's suite (its asserts, and its ``solution`` column when there is one)."""
    functions = {judge_extract.called_function(t) for t in tests}
    function = functions.pop() if len(functions) == 1 else None
    if function is None:
        return Fallback("its asserts do not all call one function in a known shape")
    test = judge_extract.check_of_asserts(list(tests), function)
    return Suite(solution or "", test, function, has_reference=bool(solution))


_cache: dict[str, Spec | Fallback] = {}
_lock = threading.Lock()
MAX_CACHED = 20_000


def _program(tasks: list[dict[str, Any]]) -> str:
    """The reference run's program: the codec's and ``judge_reference``'s text, then the tasks."""
    values = Path(sandbox_values.__file__).read_text(encoding="utf-8")
    reference = Path(judge_reference.__file__).read_text(encoding="utf-8")
    return (
        "import json, types\n"
        "values = types.ModuleType('values')\n"
        f"exec(compile({values!r}, 'sandbox_values.py', 'exec'), values.__dict__)\n"
        "reference = types.ModuleType('reference')\n"
        f"exec(compile({reference!r}, 'judge_reference.py', 'exec'), reference.__dict__)\n"
        f"reference.main(json.loads({json.dumps(tasks)!r}), values, {SECONDS_PER_TASK!r})\n"
    )


def _spec(line: dict[str, Any], function: str) -> Spec | Fallback:
    if "fallback" in line:
        return Fallback(str(line["fallback"]))
    try:
        cases = tuple(
            Case(c["input"], c["op"], None if c["expected"] is None else sandbox_values.decode(c["expected"]),
                 c["tol"], bool(c["strict"]), c["wrap"])
            for c in line["cases"]
        )  # fmt: skip
    except (KeyError, TypeError, sandbox_values.NotData) as exc:
        return Fallback(f"the reference run's cases do not read ({exc})")
    return Spec(function, cases) if cases else Fallback("the test checks no call of the candidate")


def _reference_run(suites: dict[str, Suite], tests: dict[str, str]) -> dict[str, Spec | Fallback]:
    """One sandboxed run of every suite's reference over its rewritten test."""
    tasks = [
        {"key": k, "reference": s.reference, "test": tests[k], "function": s.function,
         "has_reference": s.has_reference}
        for k, s in suites.items()
    ]  # fmt: skip
    limits = Limits(
        timeout=min(600.0, 30.0 + SECONDS_PER_TASK * len(tasks) / 4),
        output_bytes=32 << 20,
        file_bytes=64 << 20,
    )
    with Sandbox(limits, workers=1) as sandbox:
        outcome = sandbox.run(_program(tasks))
    found: dict[str, Spec | Fallback] = {}
    for text in outcome.stdout.splitlines():
        try:
            line = json.loads(text)
            key = line["key"]
        except (ValueError, TypeError, KeyError):
            continue
        if key in suites:
            found[key] = _spec(line, suites[key].function)
    late = Fallback(f"the reference run ended before this task ({outcome.status}: {outcome.error})")
    return {k: found.get(k, late) for k in suites}


def prepare(suites: Sequence[Suite]) -> dict[str, Spec | Fallback]:
    """Each suite's cases (``Spec``) or the reason it keeps the in-process harness, by ``Suite.key``."""
    wanted = {s.key: s for s in suites}
    with _lock:
        known = {k: _cache[k] for k in wanted if k in _cache}
    todo: dict[str, Suite] = {}
    tests: dict[str, str] = {}
    for key, suite in wanted.items():
        if key in known:
            continue
        try:
            tests[key] = judge_extract.rewrite(suite.test)
            todo[key] = suite
        except judge_extract.Unsupported as exc:
            known[key] = Fallback(f"its test has another shape: {exc}")
    if todo:
        known.update(_reference_run(todo, tests))
    with _lock:
        if len(_cache) > MAX_CACHED:
            _cache.clear()
        _cache.update({k: v for k, v in known.items() if not _late(v)})
    return known


def _late(v: Spec | Fallback) -> bool:
    """A fallback only because the reference run was cut short: tried again next time."""
    return isinstance(v, Fallback) and v.reason.startswith("the reference run ended before")


def verdict(spec: Spec, outcome: Outcome) -> tuple[str, str | None]:
    """A judged run's status and error: the first wrong output fails it (in the test's order); every
    output right and every call returned passes it; else the run's own ending (error, timeout, ...)."""
    outputs = outcome.outputs or []
    n = len(spec.cases)
    for i, (case, output) in enumerate(zip(spec.cases, outputs, strict=False)):  # outputs: a prefix
        if not case.holds(output):
            return "failed", f"wrong output for input {i + 1} of {n}"
    if outcome.status == "returned":
        if len(outputs) == n:
            return "passed", None
        return "failed", f"{len(outputs)} outputs for {n} inputs"
    return outcome.status, outcome.error
