"""A real terminal for the chat and CLI tests: tmux renders the screen and the test reads what a user sees
(``new-session -d -x 120 -y 40``, ``send-keys``, ``capture-pane -p``)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from tests.assistant.helpers import REPO, DaemonProcess

WIDTH, HEIGHT = 120, 40


class Tmux:
    """One detached tmux session on a private server socket, 120 x 40."""

    def __init__(self, command: str, env: dict[str, str]) -> None:
        self.socket = f"diffu-test-{uuid.uuid4().hex[:8]}"
        self._tmux("new-session", "-d", "-x", str(WIDTH), "-y", str(HEIGHT), "-s", "chat", command, env=env)

    def _tmux(self, *args: str, env: dict[str, str] | None = None) -> str:
        out = subprocess.run(
            ["tmux", "-L", self.socket, *args], env=env, capture_output=True, text=True, timeout=20
        )
        return out.stdout

    def keys(self, *keys: str) -> None:
        self._tmux("send-keys", "-t", "chat", *keys)

    def screen(self) -> str:
        return self._tmux("capture-pane", "-p", "-t", "chat")

    def wait_for(self, predicate: Callable[[str], bool], what: str, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            screen = self.screen()
            if predicate(screen):
                return screen
            if time.monotonic() > deadline:
                raise AssertionError(f"no {what} on the screen after {timeout:.0f}s; it shows:\n{screen}")
            time.sleep(0.2)

    def alive(self) -> bool:
        return (
            subprocess.run(
                ["tmux", "-L", self.socket, "has-session", "-t", "chat"], capture_output=True
            ).returncode
            == 0
        )

    def kill(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True)


def diffu_in_tmux(
    daemon: DaemonProcess, home: Path, *args: str, cwd: Path = REPO, hold: bool = False
) -> Tmux:
    """``diffu ARGS`` in a tmux session, in ``cwd``, talking to ``daemon``; its data under ``home``.
    ``hold``: the session stays a minute after the command ends, so its last words can be read."""
    env = {
        **os.environ,
        **daemon.env,
        "DIFFU_URL": daemon.url,
        "DIFFU_API_KEY": daemon.token,
        "DIFFU_DATA_DIR": str(home / "data"),
        "TERM": "xterm-256color",
    }
    env.pop("TMUX", None)
    # tmux starts the command through a shell with the server's environment: pass ours explicitly.
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items() if k.startswith(("DIFFU_", "XDG_")))
    # The pane's size, also where a terminal program looks first (shutil.get_terminal_size): on a loaded
    # machine the chat once read a size of 0 x 0 from a pane not yet sized, drew at 80 x 24 and never
    # heard of a change, so the lines it wrapped were not the ones a 120-column terminal shows.
    exports += f" COLUMNS={WIDTH} LINES={HEIGHT}"
    diffu = " ".join(shlex.quote(a) for a in args)
    command = (
        f"cd {shlex.quote(str(cwd))} && env {exports} {shlex.quote(sys.executable)} -m assistant.cli {diffu}"
    )
    return Tmux(command + ("; sleep 60" if hold else ""), env)
