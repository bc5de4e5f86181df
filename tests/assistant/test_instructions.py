"""Instruction data from source files: requests and answers, held-out files kept out of training, HumanEval
left out by name and by solution, and the two held-out measures of issue #18."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap

import pytest

from assistant.code_blocks import fenced_blocks
from assistant.evals import instructions as ins
from assistant.evals.humaneval import load_problems
from tests.assistant.helpers import REPO

LIB = textwrap.dedent(
    '''
    """A module."""


    def moving_average(values, window):
        """Return the averages of every run of `window` consecutive values."""
        out = []
        for i in range(len(values) - window + 1):
            out.append(sum(values[i : i + window]) / window)
        return out


    def unfinished(x):
        """Compute something one day."""
        raise NotImplementedError


    def undocumented(x):
        return x + 1


    class Stack:
        """A last-in, first-out stack of items."""

        def __init__(self):
            self.items = []

        def push(self, item):
            """Put an item on top of the stack."""
            self.items.append(item)
    '''
)


def _frames(source: str) -> set[str]:
    return {ins.framing(d) for d in ins.definitions("lib.py", source)}


def test_documented_definitions_become_requests_answered_by_their_code():
    found = {d.name: d for d in ins.definitions("lib.py", LIB)}
    # Undocumented and unimplemented definitions, and dunder methods, ask for nothing a model can learn.
    assert set(found) == {"moving_average", "Stack", "push"}
    assert (found["push"].kind, found["push"].owner) == ("method", "Stack")
    for d in found.values():
        conv = ins.conversation(d)
        user, answer = (m["content"] for m in conv["messages"])
        assert [m["role"] for m in conv["messages"]] == ["user", "assistant"]
        assert d.name in user or d.summary.split()[-1] in user
        blocks = fenced_blocks(answer)
        assert len(blocks) == 1 and ins.defines_function(blocks[0])  # a class with a method counts
        assert ins.has_good_block(answer)


def test_framings_vary_and_answers_leave_out_the_docstring_they_were_asked_with():
    src = "\n".join(
        f'def helper_{i}(a, b):\n    """Combine the two values into one."""\n    return a * {i} + b\n'
        for i in range(60)
    )
    defs = list(ins.definitions("many.py", src))
    framings = [ins.framing(d) for d in defs]
    assert set(framings) == {"plain", "signature", "summary", "docstring", "complete", "evalplus"}
    for d, how in zip(defs, framings, strict=True):
        user, answer = ins.request(d, how)
        code = fenced_blocks(answer)[0]
        ast.parse(code)
        has_doc = "Combine the two values" in code
        # "Complete this function" and EvalPlus answers are the whole function; the others are shorter.
        assert has_doc == (how in ("complete", "evalplus")), (how, answer)
        if how == "plain":
            assert user == "Write a Python function that combines the two values into one."
        if how == "evalplus":
            assert answer.startswith("Below is a Python script") and "```\ndef helper_" in user


def test_heldout_files_give_only_heldout_requests_and_vendored_copies_are_not_heldout():
    moving = LIB.split("class Stack")[0]
    other = 'def scale(xs, k):\n    """Multiply every value by k."""\n    return [x * k for x in xs]\n'
    sources = [
        ("pkg/lib.py", LIB),
        ("pkg/more.py", other),
        (
            "held/fresh.py",
            'def shout(s):\n    """Upper-case the text and add a bang."""\n    return s.upper() + "!"\n',
        ),
        ("held/vendored.py", moving),  # a copy of a training function (pip vendors rich, requests, ...)
    ]
    data = ins.build(
        sources,
        is_heldout=lambda path: path.startswith("held/"),
        guard=ins.HumanEvalGuard([]),
        fits=lambda conv: True,
    )
    train_paths = {c["source"]["path"] for c in data.train}
    assert train_paths == {"pkg/lib.py", "pkg/more.py"}
    assert [c["source"]["name"] for c in data.heldout] == ["shout"]
    assert data.counts["held-out code also in training files"] == 1
    # The same code twice in training is kept once.
    again = ins.build(sources[:2] + [("pkg/copy.py", other)], is_heldout=lambda p: False,
                      guard=ins.HumanEvalGuard([]), fits=lambda conv: True)  # fmt: skip
    assert again.counts["duplicate code"] == 1 and len(again.train) == len(data.train)


def test_humaneval_problems_are_left_out_by_name_and_by_canonical_solution():
    problems = load_problems()
    guard = ins.HumanEvalGuard(problems)
    by_name = problems[0]  # has_close_elements
    renamed = problems[12]  # longest: its solution under another name
    body = textwrap.indent(renamed.canonical_solution.strip("\n"), "") + "\n"
    copied = f'def pick_the_longest(strings):\n    """Pick the longest string."""\n{body}'
    sources = [
        (
            "a.py",
            f'def {by_name.entry_point}(xs, d):\n    """Are two numbers close?"""\n    return 0\n',
        ),
        ("b.py", copied),
        (
            "c.py",
            'def unrelated(n):\n    """Count down from n to zero."""\n    return list(range(n, -1, -1))\n',
        ),
    ]
    data = ins.build(sources, is_heldout=lambda p: False, guard=guard, fits=lambda c: True)
    reasons = {e["name"]: e["reason"] for e in data.excluded}
    assert reasons == {by_name.entry_point: "name: HumanEval/0", "pick_the_longest": "solution: HumanEval/12"}
    assert [c["source"]["name"] for c in data.train] == ["unrelated"]


def test_the_two_heldout_measures():
    good = "Sure.\n\n```python\ndef f(x):\n    return x + 1\n```\n"
    assert ins.has_good_block(good) and not ins.repeats_a_line(good)
    assert not ins.has_good_block("```python\ndef f(x):\n    return x +\n```")  # does not parse
    assert not ins.has_good_block("```python\nx = 1\n```")  # parses, defines no function
    assert not ins.has_good_block("```python\ndef f(x):\n    return x\n")  # the block never closes
    loop = "```python\ndef f(x):\n" + "    x = x + 1\n" * 4 + "    return x\n```"
    assert ins.repeats_a_line(loop) and not ins.repeats_a_line(loop.replace("x = x + 1\n", "x += 1\n", 1))


def test_sft_data_script_writes_training_and_heldout_files_and_a_manifest(tmp_path):
    corpus = tmp_path / "corpus"
    (corpus / "pkg").mkdir(parents=True)
    (corpus / "pkg" / "lib.py").write_text(LIB)
    for i in range(40):  # enough files for the 2.5% held-out hash to pick a few
        fn = f'def part_{i}(x):\n    """Return part {i} of the value x."""\n    return x[{i}:]\n'
        (corpus / "pkg" / f"m{i}.py").write_text(fn)
    (corpus / "tests").mkdir()
    (corpus / "tests" / "t.py").write_text('def tested(x):\n    """A test helper here."""\n    return x\n')
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "scripts/sft_data.py", str(corpus), str(out), "--heldout-permille", "200"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    train = [json.loads(line) for line in (out / "train.jsonl").read_text().splitlines()]
    held = [json.loads(line) for line in (out / "heldout.jsonl").read_text().splitlines()]
    manifest = json.loads((out / "manifest.json").read_text())
    assert len(train) == manifest["train"] and len(held) == manifest["heldout_requests"] > 0
    assert {c["source"]["path"] for c in train}.isdisjoint(manifest["heldout_files"])
    assert "tests/t.py" not in {c["source"]["path"] for c in train + held}  # test suites are skipped
    assert all(set(c) == {"messages", "source"} for c in train)
    # Stage 3's data: the single-turn conversations as they are, then topic changes made of training
    # conversations only; the two-turn held-out conversations are made of held-out requests only.
    turns = [json.loads(line) for line in (out / "turns.jsonl").read_text().splitlines()]
    single = [c for c in turns if len(c["messages"]) == 2]
    changes = [c for c in turns if len(c["messages"]) > 2]
    assert single == [c for c in train if c in single] and len(single) == manifest["turns"]["single_turn"]
    assert changes and len(changes) == manifest["turns"]["topic_changes"]
    trained = [c["messages"] for c in train]
    for c in changes:
        pairs = [c["messages"][i : i + 2] for i in range(0, len(c["messages"]), 2)]
        assert all(p in trained for p in pairs)
    two = [json.loads(line) for line in (out / "heldout_two_turn.jsonl").read_text().splitlines()]
    asked = [c["messages"] for c in held]
    assert len(two) == len(held) == manifest["heldout_two_turn"]
    assert all(c["messages"][:2] in asked and c["messages"][2:] in asked for c in two)


@pytest.mark.parametrize("summary, clause", [
    ("Return the sum of the list.", "returns the sum of the list."),
    ("Apply the patch.", "applies the patch."),
    ("Fetch a page.", "fetches a page."),
    ("Gets the value.", "gets the value."),
    ("The parser's state.", None),
])  # fmt: skip
def test_plain_requests_turn_an_imperative_summary_into_a_clause(summary, clause):
    assert ins._third_person(summary) == clause
