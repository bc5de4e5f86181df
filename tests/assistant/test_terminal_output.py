"""What ``diffu generate`` and ``diffu eval`` leave on a real terminal, and in pipes (issue #45).

tmux interprets the bytes (cursor movement, erase-line, redraws) and ``capture-pane`` gives the screen as
a user sees it: ``generate`` used to leave its last canvas frame above the answer (the answer showed twice,
and in a file the stats line ran into the frame), and ``eval`` showed a literal ``[K`` line for each of the
daemon's loading stages (an erase-line written through the proxy rich puts on stderr under a live bar).
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.assistant.helpers import REPO, DaemonProcess, isolated_env, start_daemon
from tests.preconditions import precondition
from tests.tui.test_tmux import Tmux

GENERATE = ["generate", "--prompt", "hello", "--max-new-tokens", "24", "--steps", "6"]


@pytest.fixture(autouse=True)
def _tmux_installed() -> None:
    precondition(shutil.which("tmux") is not None, "tmux is not installed (.ci/run installs it)")


def daemon_env(daemon: DaemonProcess, root: Path) -> dict[str, str]:
    return isolated_env(root, DIFFU_URL=daemon.url, DIFFU_API_KEY=daemon.token, TERM="xterm-256color")


@contextmanager
def terminal(args: list[str], env: dict[str, str]) -> Iterator[Tmux]:
    """``python -m assistant.cli ARGS`` on a 100 x 30 tmux screen; the shell prints ``EXIT=rc`` after it
    and keeps the pane open, so the screen can be read once the command is done."""
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items() if k.startswith(("DIFFU_", "TERM")))
    cli = " ".join(shlex.quote(a) for a in [sys.executable, "-m", "assistant.cli", *args])
    command = f"cd {shlex.quote(str(REPO))} && env {exports} {cli}; echo EXIT=$?; sleep 120"
    session = Tmux(command, {k: v for k, v in env.items() if k != "TMUX"})
    try:
        yield session
    finally:
        session.kill()


def test_piped_generate_keeps_the_answer_on_stdout_and_the_stats_on_stderr(fake_daemon, tmp_path):
    env = daemon_env(fake_daemon, tmp_path)
    cli = [sys.executable, "-m", "assistant.cli", *GENERATE]
    apart = subprocess.run(cli, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert apart.returncode == 0, apart.stderr
    answer = apart.stdout.removesuffix("\n")
    assert answer.strip() and "\n" not in answer  # the fake model's answer: one line, then the newline
    # No canvas frame in a file: the stats line is stderr's only line, and it ends with its newline.
    assert apart.stderr.startswith("24 tokens in 6 steps") and apart.stderr.count("\n") == 1
    assert apart.stderr.endswith("\n") and "░" not in apart.stderr
    # Both into one pipe: the answer first (stdout is flushed before the stats go to stderr), each a line.
    together = subprocess.run(cli, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines = together.stdout.decode().split("\n")
    assert lines[0] == answer and lines[1].startswith("24 tokens in 6 steps") and lines[2:] == [""]


def test_generate_clears_its_live_canvas_before_the_answer(fake_daemon, tmp_path):
    env = daemon_env(fake_daemon, tmp_path)
    answer = subprocess.run(
        [sys.executable, "-m", "assistant.cli", *GENERATE], cwd=REPO, env=env, capture_output=True, text=True
    ).stdout.strip()
    with terminal(GENERATE, env) as screen:
        shown = screen.wait_for(lambda s: "EXIT=" in s, "the command's end")
    rows = [row.rstrip() for row in shown.split("\n") if row.strip()]
    assert rows[0] == answer, shown  # the answer is the first thing on the screen, and only once:
    assert shown.count(answer) == 1 and "step 6/6" not in shown and "░" not in shown
    assert rows[1].startswith("24 tokens in 6 steps") and "EXIT=0" in rows


def test_eval_on_a_terminal_shows_the_daemons_loading_without_escape_debris(tmp_path):
    """The daemon is still loading when eval connects: its stages are reported under eval's live bar."""
    root = tmp_path / "daemon"
    gate = root / "loaded"  # the model loads until this appears: once eval has shown the load
    daemon = start_daemon(root, f"fake:step_delay=0.02,load_gate={gate}", env=isolated_env(root), wait=False)
    try:
        env = daemon_env(daemon, tmp_path / "client")
        args = ["eval", "humaneval", "--style", "base", "--task", "HumanEval/2", "--max-new-tokens", "8"]
        with terminal(args, env) as screen:
            screen.wait_for(lambda s: "loading fake weights" in s, "the loading stage", timeout=120)
            gate.touch()
            shown = screen.wait_for(lambda s: "EXIT=" in s, "the command's end", timeout=120)
    finally:
        gate.touch()
        daemon.stop()
    assert "EXIT=0" in shown and "pass@1" in shown, shown  # the table
    assert "diffu eval: loading fake weights" in shown  # the stage it waited for, as a plain line
    assert "[K" not in shown and "\x1b" not in shown, shown
    # Each stage once, above the table: no partial lines left by a redraw meant for a bare terminal.
    above = [row for row in shown.split("humaneval (base)")[0].split("\n") if row.strip()]
    assert len(above) == len(set(above)) and all(row.startswith("diffu eval: ") for row in above), above
