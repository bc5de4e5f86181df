"""The sandbox contains hostile programs: each ends as one failed run and the evaluator carries on.

Each test checks what a user relies on: this process (the evaluator) is alive, no process of the
program is left, nothing outside its temporary directory was written or removed, the user's secret was
not read, and nothing reached a listening socket on this machine.
"""

from __future__ import annotations

import os
import socket
import textwrap

import pytest

from assistant.evals.sandbox import Limits, Sandbox
from tests.assistant.helpers import sandbox_processes

SECRET = "diffu-secret-token-7f3a"


@pytest.fixture(scope="module")
def sandbox():
    with Sandbox(Limits(timeout=3.0), workers=2) as sb:
        yield sb


@pytest.fixture(scope="module")
def isolation(sandbox) -> dict:
    return sandbox.run("pass").isolation


def _need(isolation: dict, *keys: str) -> None:
    missing = [k for k in keys if not isolation.get(k)]
    if missing:
        pytest.skip(f"this kernel does not grant {', '.join(missing)}")


def test_a_correct_program_passes_and_a_wrong_one_fails(sandbox):
    ok = sandbox.run("def f(x):\n    return x + 1\nassert f(1) == 2\nprint('ok')\n")
    assert ok.passed and ok.stdout.strip() == "ok"
    bad = sandbox.run("assert 1 + 1 == 3\n")
    assert bad.status == "failed" and bad.error == "AssertionError"
    err = sandbox.run("import math\nmath.sqrt(-1)\n")
    assert err.status == "error" and err.error == "ValueError"


def test_environment_holds_nothing_of_the_user(sandbox, monkeypatch):
    monkeypatch.setenv("DIFFU_API_KEY", SECRET)
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    out = sandbox.run("import os, json\nprint(json.dumps(dict(os.environ)))\nprint(os.getcwd())\n")
    assert out.passed
    assert SECRET not in out.stdout and "proxy" not in out.stdout.lower()
    env_line, cwd = out.stdout.strip().splitlines()
    assert cwd.rsplit("/", 1)[-1].startswith("diffu-sandbox-") and f'"HOME": "{cwd}"' in env_line
    assert not os.path.exists(cwd), "the temporary directory is removed afterwards"


@pytest.mark.parametrize(
    "program, statuses",
    [
        ("while True:\n    pass\n", {"timeout", "killed"}),
        (
            "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
            {"timeout", "killed", "error"},
        ),
        ("x = bytearray(20 * 1024 ** 3)\n", {"error", "killed"}),
        ("f = open('big', 'wb')\nwhile True:\n    f.write(b'x' * (1 << 20))\n", {"error", "killed"}),
        (
            "import os\nos.kill(os.getppid(), 9)\nimport time\ntime.sleep(10)\n",
            {"killed", "timeout", "error"},
        ),
    ],
    ids=["infinite-loop", "fork-bomb", "allocate-20GB", "write-20GB", "kill-parent"],
)
def test_hostile_programs_end_as_one_failed_run(sandbox, program, statuses):
    outcome = sandbox.run(program)
    assert outcome.status in statuses, (outcome.status, outcome.error, outcome.stderr[-500:])
    assert outcome.seconds < sandbox.limits.timeout + 5
    assert sandbox_processes() == []
    # The evaluator still works: the next program runs normally.
    assert sandbox.run("assert True\n").passed


def test_files_outside_the_directory_are_neither_read_written_nor_removed(sandbox, isolation, tmp_path):
    _need(isolation, "landlock_abi")
    token = tmp_path / "token"
    token.write_text(SECRET)
    token.chmod(0o600)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    program = textwrap.dedent(f"""
        import os
        for action in (
            lambda: print(open({str(token)!r}).read()),
            lambda: os.remove({str(victim)!r}),
            lambda: open({str(tmp_path / "written.txt")!r}, 'w').write('x'),
            lambda: print(open('/proc/1/environ', 'rb').read()),
        ):
            try:
                action()
            except OSError as exc:
                print('refused', type(exc).__name__)
        assert False, 'the program reached its end: every attempt above was refused'
    """)
    outcome = sandbox.run(program)
    assert outcome.status == "failed"
    assert SECRET not in outcome.stdout + outcome.stderr
    assert outcome.stdout.count("refused") == 4
    assert victim.read_text() == "keep me" and not (tmp_path / "written.txt").exists()


def test_no_network_reaches_a_local_daemon_port(sandbox, isolation):
    _need(isolation, "net_ns")
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    port = server.getsockname()[1]
    try:
        outcome = sandbox.run(
            f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2).sendall(b'x')\n"
        )
        assert not outcome.passed and outcome.error in {
            "ConnectionRefusedError",
            "OSError",
            "PermissionError",
            "TimeoutError",
        }
        with pytest.raises(TimeoutError):
            server.accept()
    finally:
        server.close()


def test_output_is_capped(sandbox):
    outcome = sandbox.run("print('y' * 10_000_000)\n")
    assert len(outcome.stdout) <= sandbox.limits.output_bytes + 20 and outcome.stdout.endswith("[output cut]")


def test_programs_run_in_parallel_in_order(sandbox):
    programs = [f"import time\ntime.sleep(0.5)\nassert {i} % 3 != 0\n" for i in range(6)]
    outcomes = list(sandbox.map(programs))
    assert [o.passed for o in outcomes] == [i % 3 != 0 for i in range(6)]
