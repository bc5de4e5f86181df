"""The judge outside the program (assistant/evals/judge.py): values as data, the cases read from tests,
the reference run, and the verdict on a program's outputs."""

from __future__ import annotations

import collections
import math

import pytest

from assistant.evals import judge, judge_extract, sandbox_values
from assistant.evals.humaneval import load_problems
from assistant.evals.sandbox import Calls, Limits, Sandbox


@pytest.fixture(scope="module")
def sandbox():
    with Sandbox(Limits(timeout=2.0), workers=2) as sb:
        yield sb


def test_values_keep_their_type_and_what_is_not_data_is_refused():
    Point = collections.namedtuple("Point", "x y")
    values = [
        None, True, 0, -(2**70), 1.5, math.inf, "\ud800 lone", b"\x00\xff", 1 + 2j, [1, (2, 3)],
        {(1, 2): {"a"}, "k": frozenset({1})}, (), [[[]]],
    ]  # fmt: skip
    for v in values:
        back = sandbox_values.decode(sandbox_values.encode(v))
        assert back == v and type(back) is type(v), v
    assert math.isnan(sandbox_values.decode(sandbox_values.encode(math.nan)))
    # A subclass travels as its base value, whatever it says of itself.
    assert sandbox_values.decode(sandbox_values.encode(Point(1, 2))) == (1, 2)
    assert type(sandbox_values.decode(sandbox_values.encode(collections.Counter("aab")))) is dict

    class Liar(int):
        def __eq__(self, other):
            return True

        __hash__ = int.__hash__

    assert sandbox_values.decode(sandbox_values.encode(Liar(3))) == 3

    class Equal:
        def __eq__(self, other):
            return True

    class Claims:
        __class__ = list  # type: ignore[assignment]

    deep: list = []
    for _ in range(200):
        deep = [deep]
    for bad in (Equal(), Claims(), (x for x in ()), deep):
        with pytest.raises(sandbox_values.NotData):
            sandbox_values.encode(bad)
    for text in ('{"evil": 1}', "[1, 2", '{"dict": [[[1], 2]]}', "1" * 5000, '{"int": "12"}'):
        with pytest.raises(sandbox_values.NotData):
            sandbox_values.decode(text)


def test_outputs_compare_by_value_and_type_with_the_tests_tolerance():
    def case(op, expected, tol=None, strict=True):
        return judge.Case("[[], {}]", op, expected, tol, strict, None)

    assert case("eq", [1, 2]).holds([1, 2]) and not case("eq", [1, 2]).holds((1, 2))
    assert case("eq", 0.5).holds(0.5) and not case("eq", 0.5).holds(0.5000001)
    assert case("close", 0.33, 1e-6).holds(0.3300004) and not case("close", 0.33, 1e-6).holds(0.331)
    assert not case("close", 0.33, 1e-6).holds("0.33")  # a wrong type is a wrong output, not a crash
    assert case("close", 1.0, 0.5, strict=False).holds(1.5) and not case("close", 1.0, 0.5).holds(1.5)
    assert case("truthy", True).holds([0]) and case("falsy", False).holds("")
    assert case("is", True).holds(True) and not case("is", True).holds(1)


def test_humaneval_tests_become_cases_but_one_and_other_shapes_are_refused():
    problems = load_problems()
    found = judge.prepare([judge.humaneval_suite(p) for p in problems])
    by_task = {p.task_id: found[judge.humaneval_suite(p).key] for p in problems}
    fallback = {k: v.reason for k, v in by_task.items() if isinstance(v, judge.Fallback)}
    assert list(fallback) == ["HumanEval/32"] and "solution = candidate(" in fallback["HumanEval/32"]
    spec = by_task["HumanEval/2"]
    assert isinstance(spec, judge.Spec) and spec.function == "truncate_number"
    assert [(c.op, c.tol) for c in spec.cases] == [("eq", None), ("close", 1e-6), ("close", 1e-6)]
    assert sandbox_values.decode(spec.cases[1].input) == [[1.33], {}]
    loops = by_task["HumanEval/44"]  # six asserts, then one in a loop over six values
    assert isinstance(loops, judge.Spec) and len(loops.cases) == 12
    wrapped = by_task["HumanEval/33"]  # tuple(candidate(...)) == ...
    assert isinstance(wrapped, judge.Spec) and {c.wrap for c in wrapped.cases} == {"tuple"}
    for test in (
        "def check(candidate):\n    x = candidate(1)\n    assert x == 2\n",
        "def check(candidate):\n    assert candidate(1) + 1 == 3\n",
        "def check(candidate):\n    assert candidate(candidate(1)) == 3\n",
        "def check(c, d):\n    assert c(1) == 2\n",
        "def check(candidate):\n    assert True\n",
    ):
        with pytest.raises(judge_extract.Unsupported):
            judge_extract.rewrite(test)


def test_an_rl_task_is_judged_against_its_solution_or_else_its_asserts():
    tests = ["assert add_one(1) == 2", "assert add_one(x=-1) == 0"]
    right, wrong = "def add_one(x):\n    return x + 1\n", "def add_one(x):\n    return x\n"
    suites = [judge.assert_suite(tests, s) for s in (right, None, wrong)]
    assert all(isinstance(s, judge.Suite) for s in suites)
    found = judge.prepare(suites)  # type: ignore[arg-type]
    with_solution, without, bad = (found[s.key] for s in suites)  # type: ignore[union-attr]
    assert isinstance(with_solution, judge.Spec) and isinstance(without, judge.Spec)
    assert [c.expected for c in with_solution.cases] == [2, 0] == [c.expected for c in without.cases]
    assert sandbox_values.decode(with_solution.cases[1].input) == [[], {"x": -1}]
    assert isinstance(bad, judge.Fallback) and "the reference fails the test's assert" in bad.reason
    mixed = judge.assert_suite(["assert f(1) == 2", "assert g(1) == 2"], None)
    assert isinstance(mixed, judge.Fallback)


def test_the_verdict_is_the_first_wrong_output_even_when_the_program_ends_badly(sandbox):
    spec = judge.Spec(
        "f",
        tuple(judge.Case(sandbox_values.encode([[x], {}]), "eq", x + 1, None, True, None) for x in (1, 2, 3)),
    )
    programs = {
        "right": "def f(x):\n    return x + 1\n",
        "wrong second": "def f(x):\n    return x + 1 if x != 2 else 0\n",
        # Hangs past the 2 s timeout, and stops by itself after 10 s whatever the sandbox does.
        "wrong, then hangs": "import time\ndef f(x):\n    end = time.time() + 10\n"
        "    while x == 2 and time.time() < end:\n        pass\n    return 0\n",
        "raises": "def f(x):\n    raise KeyError(x)\n",
        "a list for an int": "def f(x):\n    return [x + 1]\n",
        "nothing": "x = 1\n",
        "not data": "def f(x):\n    return object()\n",
    }
    outcomes = dict(zip(programs, sandbox.map(list(programs.values()), calls=[spec.calls] * 7), strict=True))
    got = {name: judge.verdict(spec, o) for name, o in outcomes.items()}
    assert got == {
        "right": ("passed", None),
        "wrong second": ("failed", "wrong output for input 2 of 3"),
        "wrong, then hangs": ("failed", "wrong output for input 1 of 3"),
        "raises": ("error", "KeyError"),
        "a list for an int": ("failed", "wrong output for input 1 of 3"),
        "nothing": ("error", "NameError"),
        "not data": ("failed", "an output is not data (object)"),
    }
    assert outcomes["wrong, then hangs"].status == "timeout"
    # The program's function gets fresh inputs every call, and its wrapper applied as the test would.
    mutating = "def f(xs):\n    xs.append(0)\n    return xs\n"
    calls = Calls("f", (sandbox_values.encode([[[1]], {}]),) * 2, ("tuple", None))
    assert sandbox.run(mutating, calls).outputs == [(1, 0), [1, 0]]
