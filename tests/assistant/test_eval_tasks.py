"""``diffu eval tasks --tasks FILE``: held-out pass rates on AceCode-format tasks (the RL task files)."""

from __future__ import annotations

import json

import pytest

from assistant.cli.main import main
from assistant.evals import runner
from model_runtime.tokenizer import chat_prompt
from model_runtime.train.rl import synthetic
from model_runtime.train.rl.tasks import write_tasks


@pytest.fixture(scope="module")
def heldout(tmp_path_factory):
    tasks = synthetic.split(synthetic.generate(0), 0.2, 0)[1][:12]
    path = tmp_path_factory.mktemp("eval-tasks") / "heldout.jsonl"
    write_tasks(path, tasks)
    return path, tasks


def _samples(tmp_path, rows) -> str:
    path = tmp_path / "samples.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_reference_solutions_pass_and_wrong_code_fails(heldout, tmp_path, capsys):
    path, tasks = heldout
    rows = [{"task_id": t.task_id, "completion": t.extra["solution"]} for t in tasks[:8]]
    rows += [{"task_id": t.task_id, "completion": "def nothing():\n    pass\n"} for t in tasks[8:]]
    assert main(["eval", "tasks", "--tasks", str(path), "--samples", _samples(tmp_path, rows), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)["summary"]
    assert summary["tasks"] == 12 and summary["passed_samples"] == 8
    assert summary["pass@1"] == pytest.approx(8 / 12)


def test_answers_are_asked_as_in_rollouts_and_scored_by_their_python_block(heldout):
    _, tasks = heldout
    items = runner.task_file_tasks(tasks, 64)
    first = items[0]
    assert first.job.chat and first.job.prompt == chat_prompt(tasks[0].messages())
    answer = f"Here it is.\n```python\n{tasks[0].extra['solution']}```\n"
    program = first.program(first.completion(answer))
    assert program.startswith(tasks[0].extra["solution"]) and all(t in program for t in tasks[0].test_cases)
    assert first.completion("no code here") == ""


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["eval", "tasks"], "the tasks and lines benchmarks need --tasks FILE"),
        (["eval", "humaneval", "--tasks", "x.jsonl"], "--tasks only goes with them"),
    ],
)
def test_bad_arguments_are_one_line(args, message, capsys):
    assert main(args) == 2
    assert message in capsys.readouterr().err


def test_a_bad_task_file_is_one_line_naming_the_task(tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"id": "empty_one", "question": "Q?", "test_cases": []}) + "\n")
    assert main(["eval", "tasks", "--tasks", str(path), "--samples", str(path)]) == 2
    err = capsys.readouterr().err
    assert "t.jsonl:1 (task 'empty_one'): the task has no test cases" in err and "Traceback" not in err


def test_a_model_answers_more_tasks_than_the_cpu_batch_bucket(heldout, tiny_dir, capsys):
    """The CLI loads a model with the daemon's buckets (at most 4 rows on CPU): more tasks than that are
    generated in batches the runtime has, not refused."""
    path, _ = heldout
    argv = ["eval", "tasks", "--tasks", str(path), "--model", str(tiny_dir), "--limit", "6"]
    assert main([*argv, "--max-new-tokens", "8", "--steps", "8", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)["summary"]
    assert summary["tasks"] == 6 and summary["samples_per_task"] == 1
    assert summary["new_tokens"] == 6 * 8
