"""Task files for coupled-GRPO: the generator (deterministic, correct, split) and the validation of bad
lines, each message naming the task."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from model_runtime.errors import InputError
from model_runtime.train.rl import synthetic
from model_runtime.train.rl.tasks import SYSTEM_PROMPT, read_tasks


def test_the_generator_is_deterministic_and_every_test_passes_its_reference_solution(tmp_path):
    for name in ("a", "b", "c"):
        seed = 1 if name == "c" else 0
        cmd = [sys.executable, "-m", "model_runtime.train.rl.synthetic", "--out", str(tmp_path / name)]
        subprocess.run([*cmd, "--seed", str(seed)], check=True, capture_output=True)
    for part in ("train.jsonl", "heldout.jsonl"):
        assert (tmp_path / "a" / part).read_bytes() == (tmp_path / "b" / part).read_bytes()
        assert (tmp_path / "a" / part).read_bytes() != (tmp_path / "c" / part).read_bytes()
    train, held = read_tasks(tmp_path / "a" / "train.jsonl"), read_tasks(tmp_path / "a" / "heldout.jsonl")
    assert len(train) + len(held) >= 200 and 0.15 <= len(held) / (len(train) + len(held)) <= 0.25
    assert not {t.task_id for t in train} & {t.task_id for t in held}
    for category in ("arithmetic", "strings", "lists", "dicts"):
        assert any(t.extra["category"] == category for t in held)
        assert sum(t.extra["category"] == category for t in train) >= 30
    for task in train + held:
        assert len(task.test_cases) == 4
        for test in task.test_cases:
            exec(task.extra["solution"] + "\n" + test, {})  # our own reference solutions


def test_the_prompt_is_the_published_conversation():
    task = synthetic.generate(seed=0)[0]
    system, user = task.messages()
    assert system == {"role": "system", "content": SYSTEM_PROMPT}
    assert user["content"] == f"{task.question}\nTest cases: {task.test_cases[0]}"
    fenced = type(task)("t", "Complete:\n```\ndef f(): ...\n```\n", ("assert f() is None",))
    assert fenced.messages()[1]["content"] == fenced.question  # code shown already: no test appended


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (
            {"id": "sum3", "question": "Sum.", "test_cases": []},
            r"jsonl:2 \(task 'sum3'\): the task has no test",
        ),
        ({"id": "sum3", "question": "Sum."}, r"task 'sum3'\): the task has no test cases"),
        (
            {"id": "sum3", "question": "Sum.", "test_cases": ["assert f(1) == 2", "assert f(1 == 2"]},
            r"task 'sum3'\): test 2 does not parse \('\(' was never closed\)",
        ),
        ({"id": "sum3", "question": "", "test_cases": ["assert 1"]}, r"task 'sum3'\): question must be"),
        ({"id": "sum3", "question": "Sum.", "test_cases": "assert 1"}, r"test_cases must be a list"),
        ({"question": "Sum.", "test_cases": ["  "]}, r"tasks.jsonl:2 \(task '2'\): test 1 is empty"),
        (["not", "an", "object"], r"tasks.jsonl:2: expected a JSON object"),
        ({"id": "first", "question": "Again.", "test_cases": ["assert 1"]}, r"id 'first' repeats line 1"),
    ],
)
def test_bad_task_lines_are_refused_naming_the_task(tmp_path, line, message):
    path = tmp_path / "tasks.jsonl"
    first = {"id": "first", "question": "Q.", "test_cases": ["assert True"]}
    path.write_text(json.dumps(first) + "\n" + json.dumps(line) + "\n")
    with pytest.raises(InputError, match=message):
        read_tasks(path)


def test_unreadable_files_say_so(tmp_path):
    with pytest.raises(InputError, match="cannot read the task file"):
        read_tasks(tmp_path / "missing.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(InputError, match="no tasks"):
        read_tasks(tmp_path / "empty.jsonl")
    (tmp_path / "broken.jsonl").write_text('{"question": \n')
    with pytest.raises(InputError, match=r"broken.jsonl:1: not JSON"):
        read_tasks(tmp_path / "broken.jsonl")
    (tmp_path / "latin1.jsonl").write_bytes(b'{"question": "\xe9"}\n')
    with pytest.raises(InputError, match="not UTF-8"):
        read_tasks(tmp_path / "latin1.jsonl")
