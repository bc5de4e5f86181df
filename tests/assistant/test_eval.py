"""``diffu eval``: HumanEval scoring, the infilling tasks, pass@k, bad input, reproducible runs."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from assistant.cli.main import main
from assistant.evals import humaneval as he
from assistant.evals import runner
from assistant.evals.sandbox import Limits


@pytest.fixture(scope="module")
def problems() -> list[he.Problem]:
    return he.load_problems()


def _samples(tmp_path, name, rows) -> str:
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_canonical_solutions_pass_and_empty_completions_fail(problems, tmp_path, capsys):
    canon = _samples(
        tmp_path,
        "canon.jsonl",
        [{"task_id": p.task_id, "completion": p.canonical_solution} for p in problems],
    )
    assert main(["eval", "humaneval", "--samples", canon, "--json"]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert out["summary"]["tasks"] == 164 and out["summary"]["passed_samples"] == 164
    assert out["summary"]["pass@1"] == 1.0
    assert {r["status"] for r in out["results"]} == {"passed"}
    # Judged outside the programs but HumanEval/32, whose test checks a property of the output.
    judged = out["summary"]["judge"]
    assert (judged["outside"], judged["in_process"], list(judged["fallback"])) == (163, 1, ["HumanEval/32"])
    assert {r["task_id"] for r in out["results"] if r["judge"] == "in-process"} == {"HumanEval/32"}
    assert "judge: 163 tasks judged outside the program" in captured.err

    empty = _samples(tmp_path, "empty.jsonl", [{"task_id": p.task_id, "completion": ""} for p in problems])
    assert main(["eval", "humaneval", "--samples", empty, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["summary"]["passed_samples"] == 0 and out["summary"]["pass@1"] == 0.0
    assert all(r["error"] for r in out["results"])


# Completions of HumanEval/0 that end the program with exit code 0 without its tests running to their
# end; each passed before the harness's completion marker (#31).
FORGERIES = {
    "SystemExit in the function": "    raise SystemExit(0)\n",
    "os._exit in the function": "    import os\n    os._exit(0)\n",
    "sys.exit before the tests": "    return False\n\nimport sys\nsys.exit()\n",
    "sabotaged error report": (
        "    return False\n\nimport os, traceback\ntraceback.print_exc = lambda *a, **k: os._exit(0)\n"
    ),
}
# Nests directories deeper than Python's recursion limit (the old cleanup raised RecursionError out of
# the evaluation), then returns None: its tests fail.
DEEP = "    import os\n    for _ in range(1100):\n        os.mkdir('d')\n        os.chdir('d')\n"


def test_forged_passes_and_a_deep_directory_fail_and_the_evaluation_reports(problems, tmp_path, capsys):
    canonical = problems[0].canonical_solution
    completions = [*FORGERIES.values(), DEEP, canonical]
    rows = [{"task_id": "HumanEval/0", "completion": c} for c in completions]
    assert main(["eval", "humaneval", "--samples", _samples(tmp_path, "forged.jsonl", rows), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    got = {r["completion"]: (r["passed"], r["status"]) for r in out["results"]}
    assert got[canonical] == (True, "passed")
    for name, completion in FORGERIES.items():
        assert got[completion][0] is False, name
    assert got[FORGERIES["SystemExit in the function"]][1] == "error"
    assert got[FORGERIES["os._exit in the function"]][1] == "exit"
    assert got[DEEP] == (False, "failed")
    assert out["summary"]["passed_samples"] == 1


# Forgeries that share the harness's process (#43 N4), each a pass before the judge moved outside the
# program: a frame walk to the harness's pass marker (the nonce, or the token and its result pipe),
# sys.settrace replacing check before it runs, an object equal to everything.
FRAME_WALK = """\
    import json, os, sys
    frame = sys._getframe()
    while frame is not None:
        local = frame.f_locals
        if "nonce" in local and "result_fd" in local:
            os.write(local["result_fd"], f"passed {local['nonce']}\\n".encode())
            os._exit(0)
        for value in list(local.values()):
            if isinstance(getattr(value, "fd", None), int) and isinstance(getattr(value, "token", None), str):
                for record in ({"passed": 1}, {"end": 1}):
                    os.write(value.fd, (json.dumps({**record, "token": value.token}) + "\\n").encode())
                os._exit(0)
        frame = frame.f_back
    return False
"""
SETTRACE = """\
    return []


import sys


def _skip(candidate):
    return None


def _tracer(frame, event, arg):
    if frame.f_globals.get("check") not in (None, _skip):
        frame.f_globals["check"] = _skip
    return _tracer


sys._getframe().f_trace = _tracer
sys.settrace(_tracer)
"""
ALWAYS_EQUAL = """\
    class _Equal:
        def __eq__(self, other):
            return True

        def __ne__(self, other):
            return False

    return _Equal()
"""
IN_PROCESS_FORGERIES = {"HumanEval/0": FRAME_WALK, "HumanEval/1": SETTRACE, "HumanEval/3": ALWAYS_EQUAL}


def test_forgeries_inside_the_programs_process_fail(problems, tmp_path, capsys):
    canonical = {p.task_id: p.canonical_solution for p in problems[:4]}
    rows = [{"task_id": t, "completion": c} for t, c in IN_PROCESS_FORGERIES.items()]
    rows += [{"task_id": t, "completion": c} for t, c in canonical.items()]
    assert main(["eval", "humaneval", "--samples", _samples(tmp_path, "n4.jsonl", rows), "--json"]) == 0
    results = json.loads(capsys.readouterr().out)["results"]
    got = {(r["task_id"], r["completion"]): (r["passed"], r["status"], r.get("judge")) for r in results}
    for task_id, forged in IN_PROCESS_FORGERIES.items():
        assert got[task_id, forged][:2] == (False, "failed"), (task_id, got[task_id, forged])
        assert got[task_id, canonical[task_id]] == (True, "passed", "outside")


def test_a_program_named_as_markup_or_not_text_leaves_the_evaluation_whole(problems, tmp_path, capsys):
    """Exception names that are rich markup or terminal escapes, and a completion with a lone surrogate:
    each fails alone, the table and the --json report come out, nothing of them reaches the terminal raw."""
    raising = "    raise type({!r}, (Exception,), {{}})()\n"
    completions = [
        raising.format("[/]"),
        raising.format("[bold red]x[/bold red]\x1b[41m"),
        "    return '\ud800'\n",
        problems[0].canonical_solution,
    ]
    rows = [{"task_id": "HumanEval/0", "completion": c} for c in completions]
    path = tmp_path / "odd.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))  # the surrogate as JSON's \ud800
    assert main(["eval", "humaneval", "--samples", str(path), "--json"]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert [r["status"] for r in out["results"]] == ["error", "error", "error", "passed"]
    assert [r["error"] for r in out["results"]][:2] == ["[/]", "[bold red]x[/bold red]\x1b[41m"]
    assert "UnicodeEncodeError" in out["results"][2]["error"]
    assert "humaneval (samples): 1 tasks" in captured.err and "1/4" in captured.err
    assert "[/] 1" in captured.err and "\x1b" not in captured.err and "\\x1b[41m" in captured.err


def test_infilling_tasks_match_the_published_counts(problems):
    single = he.infill_tasks(problems, "single-line")
    multi = he.infill_tasks(problems, "multi-line")
    assert len(single) == 1033 and len(multi) == 5815
    assert single == he.infill_tasks(problems, "single-line")  # deterministic
    for t in single[:50] + multi[:50]:
        assert t.prefix + t.middle + t.suffix == t.problem.prompt + t.problem.canonical_solution


def test_infill_scoring_passes_the_hidden_lines_and_fails_without_them(problems, tmp_path, capsys):
    tasks = he.infill_tasks(problems, "multi-line")[:30]
    right = _samples(tmp_path, "right.jsonl", [{"task_id": t.task_id, "completion": t.middle} for t in tasks])
    assert (
        main(
            [
                "eval",
                "humaneval-infill",
                "--variant",
                "multi-line",
                "--limit",
                "30",
                "--samples",
                right,
                "--json",
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["summary"]["passed_samples"] == 30
    wrong = _samples(
        tmp_path, "wrong.jsonl", [{"task_id": t.task_id, "completion": "    return None\n"} for t in tasks]
    )
    assert (
        main(
            [
                "eval",
                "humaneval-infill",
                "--variant",
                "multi-line",
                "--limit",
                "30",
                "--samples",
                wrong,
                "--json",
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["summary"]["passed_samples"] < 10


def test_instruct_answers_are_extracted_from_the_fence(problems):
    p = problems[0]
    code = f"from typing import List\n\ndef {p.entry_point}(numbers, threshold):\n    return False\n"
    text = code + "```\nThis checks nothing.<|im_end|>"
    assert he.cut_instruct(text) == code
    program = he.instruct_program(p, he.cut_instruct(text))
    assert program.startswith("from typing import List") and f"check({p.entry_point})" in program
    # A body without a signature is completed onto the prompt.
    assert he.instruct_program(p, "    return False\n").startswith(p.prompt)
    assert he.cut_base("    return 1\n\ndef helper():\n    pass\n") == "    return 1\n"


@pytest.mark.parametrize(
    "args, message",
    [
        (["eval", "mbpp"], "unknown benchmark 'mbpp'"),
        (["eval", "humaneval", "--limit", "0"], "--limit"),
        (["eval", "humaneval", "--n", "4"], "--temperature"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(args, message, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err and err.startswith("diffu: error:")


@pytest.mark.parametrize(
    "lines, message",
    [
        (['{"task_id": "HumanEval/0", "completion": "x"}', "{not json"], ":2: not a JSON object"),
        (['{"completion": "    return 1"}'], ":1: missing task_id"),
        (['{"task_id": "HumanEval/999", "completion": ""}'], "unknown task_id 'HumanEval/999'"),
    ],
)
def test_bad_samples_files_are_one_line_and_exit_2(lines, message, tmp_path, capsys):
    path = tmp_path / "s.jsonl"
    path.write_text("\n".join(lines) + "\n")
    assert main(["eval", "humaneval", "--samples", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err


def test_same_seed_and_settings_give_the_same_results(runtime, problems):
    from model_runtime.params import SamplingParams

    tasks = runner.humaneval_tasks(problems[:3], "base", 16)
    params = SamplingParams(max_new_tokens=16, steps=8, temperature=0.9, top_p=0.95, seed=5)

    def once():
        report = runner.run_benchmark(
            tasks,
            runner.LocalGenerator(runtime, params, batch=2),
            samples=2,
            seed=5,
            ks=[1, 2],
            limits=Limits(),
            workers=2,
            progress=lambda _name, _total: lambda _n: None,
        )
        return [(r["task_id"], r["sample"], r["completion"], r["status"]) for r in report.results], report

    first, report = once()
    second, _ = once()
    assert first == second
    assert len(first) == 6 and report.summary["samples_per_task"] == 2 and "pass@2" in report.summary
    summary = report.summary
    # Tokens are the answers' (each cut at its end of text), forwards the reference decoder's steps.
    answers = sum(len(r["completion"]) > 0 for r in report.results)
    assert 0 < summary["new_tokens"] <= 6 * 16 and summary["tokens_per_second"] > 0 and answers
    assert summary["forwards_per_answer"] == 8
    assert summary["tokens_per_forward"] == round(summary["new_tokens"] / (6 * 8), 3)
    low, high = summary["pass@1_ci95"]
    assert 0 <= low <= summary["pass@1"] <= high <= 1
    # A different seed draws different answers from a random model.
    other = runner.run_benchmark(
        tasks,
        runner.LocalGenerator(runtime, dataclasses.replace(params, seed=6), batch=2),
        samples=2,
        seed=6,
        ks=[1],
        limits=Limits(),
        workers=2,
        progress=lambda _name, _total: lambda _n: None,
    )
    assert [r["completion"] for r in other.results] != [c for _, _, c, _ in first]


def test_eval_through_the_daemon(fake_daemon, tmp_path):
    # A daemon is configured (DIFFU_URL): eval uses it without being told.
    from tests.assistant.helpers import isolated_env

    env = isolated_env(tmp_path, DIFFU_URL=fake_daemon.url, DIFFU_API_KEY=fake_daemon.token)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "assistant",
            "eval",
            "humaneval",
            "--style",
            "base",
            "--task",
            "HumanEval/129",
            "--task",
            "HumanEval/2",
            "--task",
            "HumanEval/53",
            "--max-new-tokens",
            "8",
            "--json",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["summary"]["tasks"] == 3 and data["summary"]["through"] == "daemon"
    results = {r["task_id"]: r for r in data["results"]}
    # HumanEval/129's prompt does not fit the fake model's 512-token context: that task fails alone.
    assert results["HumanEval/129"]["status"] == "generation_error"
    assert "context" in results["HumanEval/129"]["error"]
    for tid in ("HumanEval/2", "HumanEval/53"):
        assert results[tid]["status"] != "generation_error" and results[tid]["completion"] != ""
    assert data["summary"]["generate_seconds"] > 0 and "humaneval (base)" in out.stderr
    # Each answer counts its share of its batch's time: the model's time is within the run's.
    assert data["summary"]["generate_seconds"] <= data["summary"]["wall_seconds"]


def test_the_sweep_covers_thresholds_and_block_lengths():
    from assistant.cli import eval as eval_command
    from assistant.cli.main import build_parser

    parser, _ = build_parser()
    args = parser.parse_args(
        [
            "eval",
            "humaneval-infill",
            "--sweep",
            "--sweep-block-lengths",
            "16,32,64,16",
            "--block-length",
            "32",
        ]
    )
    eval_command._check(args)
    model = {"block_length": 64, "threshold": 0.8, "max_new_tokens": 192, "steps": 192}  # its own
    settings = eval_command._settings(args, 32, model)
    assert [label for label, _ in settings] == [
        "reference",
        *(f"fast, block 32, threshold {t}" for t in (0.7, 0.8, 0.9, 0.95)),  # the flag over the model's
        "fast, block 16, threshold 0.9",
        "fast, block 64, threshold 0.9",
    ]
    assert [(p.decoder, p.block_length) for _, p in settings][-2:] == [("fast", 16), ("fast", 64)]
    # The benchmark's canvas, one step a token: the model's steps go with its own canvas only.
    assert {(p.max_new_tokens, p.steps) for _, p in settings} == {(32, 32)}
    # Without the flag, the model's block length: the block-length row it duplicates is left out.
    args = parser.parse_args(["eval", "humaneval-infill", "--sweep", "--sweep-block-lengths", "16,64"])
    eval_command._check(args)
    labels = [label for label, _ in eval_command._settings(args, 32, model)]
    assert labels[1] == "fast, block 64, threshold 0.7" and labels[-1] == "fast, block 16, threshold 0.9"
    assert len(labels) == 6


@pytest.mark.parametrize(
    "args, message",
    [
        (["--sweep-block-lengths", "16"], "--sweep-block-lengths goes with --sweep"),
        (["--sweep", "--sweep-block-lengths", "16,x"], "--sweep-block-lengths: expected"),
        (["--sweep", "--sweep-block-lengths", "0"], "--sweep-block-lengths: expected"),
        (["--sweep", "--sweep-block-lengths", "24"], "each one of 1, 2, 4, 8, 16, 32, 64, 128, 256"),
    ],
)
def test_bad_sweep_block_lengths_are_one_line_and_exit_2(args, message, capsys):
    assert main(["eval", "humaneval-infill", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err
