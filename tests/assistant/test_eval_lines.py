"""Held-out single-line infills (assistant/evals/lines.py): which lines, their windows, their scoring."""

from __future__ import annotations

import json

import pytest

from assistant.evals import lines, runner
from assistant.evals.sandbox import Limits

SOURCE = '''"""A module docstring
that spans lines."""

import os


def area(w, h):
    """One-line docstring."""
    # a comment
    total = w * h
    return total


class Box:
    size = area(2, 3)
'''


def test_only_lines_that_hold_code_are_hidden():
    kept = [SOURCE.split("\n")[i] for i in lines.code_lines(SOURCE)]
    assert kept == ["import os", "def area(w, h):", "    total = w * h", "    return total", "class Box:",
                    "    size = area(2, 3)"]  # fmt: skip
    assert lines.code_lines("def broken(:\n") == []


def test_tasks_are_drawn_with_a_fixed_seed_and_cut_from_the_file(tmp_path):
    files = [("pkg/a.py", SOURCE), ("pkg/b.py", SOURCE.replace("area", "volume"))]
    first = lines.build(files, 6, lambda s: len(s.split()), seed=0)
    assert first == lines.build(list(reversed(files)), 6, lambda s: len(s.split()), seed=0)
    assert [t.task_id for t in first] != [t.task_id for t in lines.build(files, 6, len, seed=1)]
    texts = dict(files)
    for t in first:
        path, line = t.task_id.rsplit(":L", 1)
        assert texts[path].split("\n")[int(line) - 1] + "\n" == t.middle
        assert t.prefix + t.middle + t.suffix in texts[path] and t.prefix.endswith("\n")
    # A line longer than the canvas is never asked for.
    assert all(len(t.middle.split()) <= 2 for t in lines.build(files, 10, lambda s: 20 * len(s.split())))
    out = tmp_path / "tasks.jsonl"
    lines.write(first, out)
    assert lines.read(out) == first
    out.write_text(json.dumps({"task_id": "x"}) + "\n")
    with pytest.raises(ValueError, match=r"tasks.jsonl:1: not a line task \(needs the strings task_id,"):
        lines.read(out)
    out.write_text("[1]\n")
    with pytest.raises(ValueError, match=r"tasks.jsonl:1: expected a JSON object with task_id, prefix"):
        lines.read(out)


def test_a_task_whose_context_stands_in_a_training_file_is_dropped():
    """Held out by path is not held out by content: a vendored copy of a held-out file in the training
    files gives away its lines, and the check drops their tasks; another file's lines are kept."""
    held = [("pkg/a.py", SOURCE)]
    tasks = lines.build(held, 6, lambda s: len(s.split()), seed=0)
    assert lines.window(tasks[0]).count("\n") <= 2 * lines.WINDOW_LINES
    other = "def f(x):\n    return x\n\n\nclass A:\n    pass\n"
    kept, dropped = lines.unseen(tasks, lines.Seen.of([other]))
    assert [t.task_id for t in kept] == [t.task_id for t in tasks] and dropped == []
    # The same file vendored elsewhere with more around it: every task's window is in it.
    vendored = "# vendored copy\n" + SOURCE + "\n# end\n"
    kept, dropped = lines.unseen(tasks, lines.Seen.of([other, vendored]))
    assert kept == [] and dropped == tasks


def test_spans_hide_lines_the_editor_would_write_and_are_asked_as_it_asks():
    """A multi-line task hides consecutive code lines that stay in the cursor's scope there; it is asked
    with the editor's canvas for its mode and its scope's end, and judged on every hidden line."""
    body = "def area(w, h):\n    total = w * h\n    half = total / 2\n    return half\n\n\nx = area(1, 2)\n"
    tasks = lines.build_spans([("pkg/a.py", body)], 5, lambda s: len(s.split()), seed=0, sizes=(2,))
    assert tasks and all(t.middle.count("\n") == 2 for t in tasks)
    for t in tasks:
        first = int(t.task_id.rsplit(":L", 1)[1].split("-")[0])
        assert body.split("\n")[first - 1 : first + 1] == t.middle.rstrip("\n").split("\n")
    # After an opener: a block, with the body's scope and the block canvas.
    job = runner.editor_job("def area(w, h):\n", "\n", None, single_line=False)
    assert (job.tokens, job.scope) == (64, 1)
    # After a statement at four columns: an empty line, its scope the statement's.
    job = runner.editor_job("def area(w, h):\n    total = w * h\n", "\n", None, single_line=False)
    assert (job.tokens, job.scope) == (32, 0)
    assert runner.editor_job("x = 1\n", "\n", 32, single_line=True).scope is None
    [task] = runner.line_tasks(
        [lines.LineTask("t", "def f():\n", "    a = 1\n    b = 2\n", "")], None, single_line=False
    )
    assert task.completion("    a = 1\n    b = 2\n\nprint()") == "    a = 1\n    b = 2"
    assert task.check is not None and task.check(task.completion("    a = 1\n    b = 2\n"))


def test_a_fill_passes_when_its_first_line_is_the_hidden_line():
    task = lines.LineTask("a.py:L3", "def f(w, h):\n", "    total = w * h\n", "    return total\n")
    tasks = runner.line_tasks([task, task, task], 32)
    fills = ["    total = w * h\n    print(total)", "    total = w + h", "\n    total = w * h"]
    completions = [[t.completion(fill)] for t, fill in zip(tasks, fills, strict=True)]
    report = runner.score(
        tasks, completions, ks=[1], sandbox_limits=Limits(), workers=1, advance=lambda n: None
    )
    # The editor's one-line cut keeps "    total = w * h"; a fill that breaks the line first is empty.
    assert [r["passed"] for r in report.results] == [True, False, False]
    assert [r["status"] for r in report.results] == ["passed", "wrong", "wrong"]
    assert report.summary["pass@1"] == pytest.approx(1 / 3) and report.summary["isolation"] == {}
