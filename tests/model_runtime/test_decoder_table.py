"""``scripts/decoder_table.py`` in a tiny run: the tiny checkpoint, two held-out lines, the reference and
the sliding decoder. The figures of a random model mean nothing; the test checks that every setting
answered every task, the table pairs them with the reference, a second run resumes (measures nothing
again) instead of starting over, and ``--exclude`` leaves a set of tasks out of the table."""

from __future__ import annotations

import json
from pathlib import Path

from assistant.evals import lines
from scripts import decoder_table


def test_a_tiny_table_answers_every_task_per_setting_and_resumes(tiny_dir: Path, tmp_path: Path) -> None:
    tasks = [
        lines.LineTask("a.py:L2", "def f(x):\n", "    return x\n", "\nprint(f(1))\n"),
        lines.LineTask("b.py:L2", "import os\n", "import sys\n", "\nprint(os.sep)\n"),
    ]
    lines.write(tasks, tmp_path / "lines.jsonl")
    out = tmp_path / "table"
    argv = [
        str(out),
        "--model",
        str(tiny_dir),
        "--benchmarks",
        "lines",
        "--lines",
        str(tmp_path / "lines.jsonl"),
    ]
    argv += ["--settings", "reference,sliding"]
    assert decoder_table.main(argv) == 0
    results = (out / "results.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in results]
    assert sorted(r["setting"] for r in rows) == ["reference", "sliding"]
    for row in rows:
        assert [t["task_id"] for t in row["tasks"]] == ["a.py:L2", "b.py:L2"]
        assert all(t["forwards"] >= 1 and t["seconds"] > 0 for t in row["tasks"])
        assert row["params"]["max_lines"] == 1 and row["params"]["decoder"] == row["setting"]
    table = json.loads((out / "table.json").read_text())["benchmarks"]["lines"]
    assert list(table) == ["reference", "sliding"]  # the reference first, as asked
    assert table["reference"]["minus_baseline"] == [0.0, 0.0, 0.0]
    assert table["sliding"]["tasks"] == 2 and table["sliding"]["baseline_time_over_this"] > 0
    md = (out / "table.md").read_text()
    assert "| lines (2) | reference |" in md and "| lines (2) | sliding |" in md
    # Run again: everything is measured already, so nothing is added.
    assert decoder_table.main(argv) == 0
    assert (out / "results.jsonl").read_text().splitlines() == results
    # The table without the tasks the settings were chosen on: the same results, one task fewer.
    lines.write(tasks[1:], tmp_path / "chosen_on.jsonl")
    assert decoder_table.main(argv + ["--report", "--exclude", str(tmp_path / "chosen_on.jsonl")]) == 0
    assert (out / "results.jsonl").read_text().splitlines() == results
    smaller = json.loads((out / "table.json").read_text())
    assert smaller["excluded_tasks"] == 1
    assert {e["tasks"] for e in smaller["benchmarks"]["lines"].values()} == {1}
    assert "| lines (1) | sliding |" in (out / "table.md").read_text()
    # Against another baseline (the strongest one the table holds, say): every difference is from it.
    assert decoder_table.main(argv + ["--report", "--baseline", "sliding"]) == 0
    against = json.loads((out / "table.json").read_text())
    assert against["baseline"] == "sliding"
    assert against["benchmarks"]["lines"]["sliding"]["minus_baseline"] == [0.0, 0.0, 0.0]
    assert "| sliding time / this (95% CI) |" in (out / "table.md").read_text()


def test_the_multi_line_table_scores_answers_that_are_all_wrong_softly(tmp_path: Path) -> None:
    """Every answer wrong (as every setting's were on the bundled model's multi-line table): pass/fail
    cannot tell two settings apart; the edit similarity and the first line can."""
    from assistant.evals import runner

    spans = [
        lines.LineTask(f"s{i}.py:L2-3", "def f(x):\n", "    y = x + 1\n    return y\n", "\nf(1)\n")
        for i in range(4)
    ]
    tasks = {t.task_id: t for t in runner.line_tasks(spans, None, single_line=False)}
    answers = {"fast-b64": "    y = x + 2\n    return y\n", "sliding": "    import os\n    print(os)\n"}
    with (tmp_path / "results.jsonl").open("w") as f:
        for setting, text in answers.items():
            records = [
                {"task_id": t, "passed": False, "status": "failed", "seconds": 0.5, "tokens": 9}
                | {"forwards": 9, "text": text}
                for t in tasks
            ]
            row = {"benchmark": "spans", "setting": setting, "chunk": 0, "tasks": records}
            f.write(json.dumps(row | {"load_average": 1.0, "device": "cpu"}) + "\n")
    table = decoder_table.report(tmp_path, ["spans"], list(answers), baseline="fast-b64", tasks=tasks)
    near, far = table["benchmarks"]["spans"]["fast-b64"], table["benchmarks"]["spans"]["sliding"]
    assert near["right"] == far["right"] == 0 and near["similarity"] > far["similarity"] + 0.3
    assert near["first_line"] == 0.0 and far["similarity_minus_baseline"][0] < -0.3
    md = (tmp_path / "table.md").read_text()
    assert "| spans (4) | sliding | " in md.split("edit similarity")[1]
