"""The coupled-GRPO rewards: the published reward cases, partial credit, timeouts, pluggable rewards, and
thousands of sandboxed executions that leave no process and no temporary file behind."""

from __future__ import annotations

import os
import tempfile
import threading

import pytest

from assistant.evals import rewards
from tests.assistant.helpers import sandbox_processes

# ml-diffucoder tests/test_code_reward.py: (answer, tests, code reward, format reward).
PUBLISHED = {
    "correct": (
        "Let me implement a function to calculate the sum of a list.\n```python\ndef sum_list(numbers):\n"
        "    return sum(numbers)\n```\n",
        ["assert sum_list([1, 2, 3]) == 6", "assert sum_list([]) == 0", "assert sum_list([-1, 1]) == 0",
         "assert sum_list([5]) == 5"],
        1.0,
        1.0,
    ),
    "invalid_syntax": (
        "Below is the implementation of the function to calculate the sum of a list.\n```python\n"
        "def sum_list(numbers)\n    return sum(numbers)  # Missing colon\n```\n",
        ["assert sum_list([1, 2, 3]) == 6", "assert sum_list([]) == 0"],
        0.0,
        0.5,
    ),
    "incorrect_format": (
        "Let me implement a function to calculate the sum of a list.\n```python\ndef sum_list(numbers):\n"
        "    return sum(numbers)\n\n",
        ["assert sum_list([1, 2, 3]) == 6", "assert sum_list([]) == 0"],
        0.0,
        0.0,
    ),
    "multiple_blocks": (
        "Let me implement a function to calculate the sum of a list.\n```python\n# First attempt\n"
        "def sum_list(numbers):\n    return 0\n```\n```python\n# Final solution\ndef sum_list(numbers):\n"
        "    return sum(numbers)\n```\n",
        ["assert sum_list([1, 2, 3]) == 6", "assert sum_list([]) == 0", "assert sum_list([-1, 1]) == 0",
         "assert sum_list([5]) == 5"],
        0.0,
        0.0,
    ),
}  # fmt: skip


@pytest.fixture(scope="module")
def code_reward():
    reward = rewards.CodeReward(workers=2)
    yield reward
    reward.close()


@pytest.mark.parametrize("case", sorted(PUBLISHED))
def test_the_published_reward_cases_hold(code_reward, case):
    text, tests, code, fmt = PUBLISHED[case]
    completions = [[{"role": "assistant", "content": text}]]
    assert code_reward(completions, test_cases=[tests]) == [code]
    assert rewards.code_format(completions) == [fmt]


def test_code_reward_is_the_fraction_of_asserts_passed_and_a_timeout_scores_zero(code_reward):
    half = "```python\ndef f(x):\n    return x + 1 if x < 3 else x\n```\n"
    tests = ["assert f(1) == 2", "assert f(2) == 3", "assert f(3) == 4", "assert f(4) == 5"]
    hang = "```python\ndef f(x):\n    while x == 2:\n        pass\n    return x + 1\n```\n"
    plain = ["```python\ndef f(x):\n    return x + 1\n```\n"]
    quick = rewards.CodeReward(timeout=1.0, workers=2)
    try:
        assert quick([half, hang, plain[0]], test_cases=[tests, tests, tests]) == [0.5, 0.0, 1.0]
    finally:
        quick.close()
    # A raising assert, an import error and a crash each fail their own test only.
    mixed = ["assert f(1) == 2", "import no_such_module", "assert f(1) == 2", "raise SystemExit(3)"]
    assert code_reward(plain, test_cases=[mixed]) == [0.5]


def test_forged_passes_earn_no_code_reward(code_reward):
    """Exit code 0 without the tests running to their end: a reward a policy could learn to hack."""
    forged = [
        "```python\ndef f(x):\n    raise SystemExit(0)\n```\n",
        "```python\ndef f(x):\n    import os\n    os._exit(0)\n```\n",
        "```python\nimport sys\n\ndef f(x):\n    return 0\n\nsys.exit()\n```\n",
        "```python\nimport os, traceback\ntraceback.print_exc = lambda *a, **k: os._exit(0)\n\n"
        "def f(x):\n    return 0\n```\n",
    ]
    honest = "```python\ndef f(x):\n    return x + 1\n```\n"
    tests = ["assert f(1) == 2", "assert f(2) == 3"]
    assert code_reward([*forged, honest], test_cases=[tests] * 5) == [0.0, 0.0, 0.0, 0.0, 1.0]


# Forgeries that share the harness's process (#43 N4), each worth the whole code reward before the judge
# moved outside the program: a block that defines nothing and walks the frames to the pass marker, a
# tracer that swaps in a function returning an object equal to everything as the assert runs, and such
# an object returned outright.
RL_FORGERIES = [
    """import json, os, sys
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
""",
    """import linecache, sys


class _Equal:
    def __eq__(self, other):
        return True


def f(x):
    return 0


def _tracer(frame, event, arg):
    if event == "line" and frame.f_code.co_filename == "program.py":
        if linecache.getline("program.py", frame.f_lineno).lstrip().startswith("assert"):
            frame.f_globals["f"] = lambda *args: _Equal()
    return _tracer


sys._getframe().f_trace = _tracer
sys.settrace(_tracer)
""",
    """class _Equal:
    def __eq__(self, other):
        return True


def f(x):
    return _Equal()
""",
]


def test_forgeries_inside_the_programs_process_earn_no_code_reward(code_reward):
    answers = [f"```python\n{code}```\n" for code in [*RL_FORGERIES, "def f(x):\n    return x + 1\n"]]
    assert all(rewards.format_score(a) == 1.0 for a in answers)
    tests = ["assert f(1) == 2", "assert f(2) == 3"]
    assert code_reward(answers, test_cases=[tests] * 4) == [0.0, 0.0, 0.0, 1.0]


def test_outputs_are_judged_by_type_and_other_test_cases_still_count(code_reward):
    """Judged against the task's ``solution`` column: a tuple is not the list the solution returns. A
    test case the judge cannot read (not one call in a known shape) still counts, run in the program's
    process."""
    answer = "```python\ndef f(x):\n    return [x, x]\n```\n"
    tests = ["assert f(2) == [2, 2]", "assert f(3) != (3, 3)", "assert len(f(1)) == 2"]
    solution = "def f(x):\n    return [x, x]\n"
    assert code_reward([answer], test_cases=[tests], solution=[solution]) == [1.0]
    tuple_answer = "```python\ndef f(x):\n    return (x, x)\n```\n"  # a tuple is not the list due
    assert code_reward([tuple_answer], test_cases=[tests], solution=[solution]) == [pytest.approx(1 / 3)]


def test_format_wants_the_closing_fence_and_a_final_newline_only():
    block = "```python\nx = 1\n```"
    assert rewards.format_score(block + "\n") == 1.0
    assert rewards.format_score("Here:\n" + block + "\n") == 1.0
    assert rewards.format_score(block) == 0.0  # no newline after the fence
    assert rewards.format_score(block + "\n\n") == 0.0
    assert rewards.format_score(block + "\nDone.\n") == 0.0
    assert rewards.format_score("```py\nx = 1\n```\n") == 0.0
    assert rewards.format_score("```python\nx = '\\0'\n```\n") == 1.0  # the escape, in the source
    assert rewards.format_score("```python\nx = '\0'\n```\n") == 0.5  # a null byte: does not parse


def test_reward_callables_load_by_import_path_and_bad_paths_say_why(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(
        "def short(completions, **kw):\n    return [1.0] * len(completions)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    for spec in ("my_rewards:short", "my_rewards.short"):
        assert rewards.load_reward(spec)(["a", "b"]) == [1.0, 1.0]
    with pytest.raises(ValueError, match="cannot import no_such_pkg"):
        rewards.load_reward("no_such_pkg:f")
    with pytest.raises(ValueError, match="has no attribute 'missing'"):
        rewards.load_reward("my_rewards:missing")
    with pytest.raises(ValueError, match="expected an import path"):
        rewards.load_reward("justaname")
    assert rewards.load_reward("assistant.evals.rewards:code_format") is rewards.code_format


def _sandbox_temp_entries() -> set[str]:
    return {n for n in os.listdir(tempfile.gettempdir()) if n.startswith("diffu-sandbox")}


def _children() -> set[int]:
    """This process's child processes, read from /proc (no subprocess of our own in the count)."""
    pids = set()
    for entry in os.listdir("/proc"):
        try:
            stat = open(f"/proc/{entry}/stat").read() if entry.isdigit() else ""
        except OSError:
            continue
        if stat and int(stat.rsplit(")", 1)[1].split()[1]) == os.getpid():
            pids.add(int(entry))
    return pids


def test_hundreds_of_sandboxed_executions_leave_no_process_and_no_temp_file():
    """201 programs (40 of each kind, one endless loop), 401 sandboxed runs (one per test case, as
    published): ones fork sleepers, write files, run out of time."""
    procs_before, temp_before = sandbox_processes(), _sandbox_temp_entries()
    threads_before, children_before = threading.active_count(), _children()
    bodies = [
        "    return x + 1",
        "    import os\n    if os.fork() == 0:\n        import time; time.sleep(60)\n    return x + 1",
        "    open('scratch.txt', 'w').write('x' * 1000)\n    return x + 1",
        "    import tempfile; tempfile.mkstemp(); return x + 1",
        "    raise RuntimeError('no')",
    ]
    completions, tests = [], []
    for i in range(200):
        completions.append(f"```python\ndef f(x):\n{bodies[i % len(bodies)]}\n```\n")
        tests.append([f"assert f({j}) == {j + 1}" for j in range(2)])
    completions.append("```python\ndef f(x):\n    while True:\n        pass\n```\n")
    tests.append(["assert f(1) == 2"])
    # the time limit is wall-clock: a right program must finish inside it on a machine at load 10
    # (a sandboxed interpreter's start alone took over a second there), so only the loop meets it
    reward = rewards.CodeReward(timeout=10.0, workers=2)
    try:
        scores = reward(completions, test_cases=tests)
    finally:
        reward.close()
    assert len(scores) == 201 and sum(1 for s in scores if s == 1.0) == 160 and scores[-1] == 0.0
    assert sandbox_processes() == procs_before
    assert _sandbox_temp_entries() == temp_before
    assert threading.active_count() == threads_before
    assert _children() == children_before


def test_the_cpu_run_rewards_read_an_answer_ending_at_its_fence_as_closed():
    from scripts import rl_cpu_rewards

    at_fence = "Here:\n```python\ndef f(x):\n    return x + 1\n```"
    assert rewards.code_format([at_fence]) == [0.0]  # the published rule wants a final newline
    assert rl_cpu_rewards.code_format([at_fence, at_fence + "\n", "```python\ndef f(x)\n```"]) == [
        1.0,
        1.0,
        0.5,
    ]
    assert rl_cpu_rewards.code([at_fence], test_cases=[["assert f(1) == 2", "assert f(2) == 4"]]) == [0.5]
