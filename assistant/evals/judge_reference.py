"""The reference run: every task's test inputs, and the reference solution's output for each.

Run in a sandbox of its own (``judge.py`` embeds this file's text, with ``sandbox_values``'s, into one
program for a batch of tasks), never in a program under test. For each task: the reference code (a
HumanEval prompt with its canonical solution; an RL task's ``solution``, if it has one) and the test,
rewritten by ``judge_extract.rewrite`` so that each assert calls ``__case__``, run in one namespace as
the original program would have run them. ``__case__`` evaluates the call's arguments, keeps them as data,
calls the reference on a fresh copy of them, checks that the reference passes the test's own assert, and
keeps the reference's output as the expected one (the test's own expected value where there is no
reference). A task whose reference fails its test, raises, runs past its time or handles anything that is
not data gets a reason instead of cases: the judge then keeps the in-process harness for it.

One JSON line per task on stdout: ``{"key", "cases": [{"input", "op", "expected", "tol", "strict",
"wrap"}]}`` or ``{"key", "fallback": reason}``. The standard library only. ``holds`` is the comparison both
this run and the evaluator apply.
"""

from __future__ import annotations

import io
import json
import os
import signal
import sys
from typing import Any

COMPARED = ("eq", "is", "close")  # the ops with an expected value


class Disagree(Exception):
    """The reference does not pass the test's own assert (the test or the reference is wrong)."""


class _Late(BaseException):
    """A task's reference ran past its time (a BaseException: no ``except Exception`` in it stops it)."""


def holds(op: str, out: Any, expected: Any, tol: float | None, strict: bool) -> bool:
    """Whether an output passes one case, as the test's assert would have judged it."""
    try:
        if op == "eq":
            return bool(out == expected)
        if op == "truthy":
            return bool(out)
        if op == "falsy":
            return not out
        if op == "is":
            return out is expected
        if op == "close" and tol is not None:
            gap = abs(out - expected)
            return bool(gap < tol) if strict else bool(gap <= tol)
    except Exception:  # a wrong type (a string where a number is due), a container too deep
        return False
    raise ValueError(f"unknown comparison {op!r}")


def run_task(task: dict[str, Any], values: Any) -> list[dict[str, Any]]:
    """The cases of one task (its ``reference``, rewritten ``test`` and ``function``); ``values`` is
    the ``sandbox_values`` module."""
    cases: list[dict[str, Any]] = []
    encode, decode = values.encode, values.decode

    def case(fn: Any, op: str, inputs: Any, want: Any, tol: Any, strict: bool, wrap: Any, line: int) -> None:
        args, kwargs = inputs()
        data = encode([list(args), dict(kwargs)])
        value = None
        if fn is not None:
            a, k = decode(data)  # the copy the program under test will get, untouched by the call
            value = fn(*a, **k)
            if wrap is not None:
                value = values.WRAPPERS[wrap](value)
        expected = want() if op in COMPARED else None
        if fn is not None and not holds(op, value, expected, tol, strict):
            raise Disagree(f"line {line}: the reference fails the test's assert")
        if fn is None:
            value = expected
        kept = encode(value) if op in COMPARED else None
        cases.append({"input": data, "op": op, "expected": kept, "tol": tol, "strict": strict, "wrap": wrap})

    namespace: dict[str, Any] = {"__name__": "__reference__", "__case__": case}
    exec(compile(task["reference"], "reference.py", "exec"), namespace)
    exec(compile(task["test"], "test.py", "exec"), namespace)
    fn = namespace.get(task["function"]) if task["has_reference"] else None
    if task["has_reference"] and not callable(fn):
        raise Disagree(f"the reference defines no function {task['function']!r}")
    namespace["check"](fn)
    return cases


def main(tasks: list[dict[str, Any]], values: Any, seconds: float) -> None:
    """Every task's line on stdout; a task's own prints go nowhere."""
    out = os.fdopen(os.dup(1), "w")

    def late(signum: int, frame: Any) -> None:
        raise _Late

    signal.signal(signal.SIGALRM, late)
    for task in tasks:
        sys.stdout = io.StringIO()
        line: dict[str, Any] = {"key": task["key"]}
        try:
            signal.setitimer(signal.ITIMER_REAL, seconds)
            line["cases"] = run_task(task, values)
            signal.setitimer(signal.ITIMER_REAL, 0)
        except _Late:
            line = {"key": task["key"], "fallback": f"the reference ran past {seconds:g} s"}
        except Disagree as exc:
            line["fallback"] = str(exc)
        except values.NotData as exc:
            line["fallback"] = f"an input or output is not data ({exc})"
        except BaseException as exc:
            line["fallback"] = f"the reference run raised {type(exc).__name__}"
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        out.write(json.dumps(line) + "\n")
        out.flush()
