"""``diffu chat`` in a real terminal emulator: tmux renders the screen and the test reads what a user sees.

The pseudo-terminal test in test_chat_daemon.py reads raw bytes; here tmux interprets them (cursor
movement, redraws, colours), so ``capture-pane`` gives the screen as it looks: the connected header, the
answer under its prompt, the replay of the denoising. ``.ci/run`` installs tmux for this test.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.assistant.helpers import DaemonProcess
from tests.preconditions import precondition
from tui.settings import ChatSettings
from tui.store import ChatStore

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _tmux_installed() -> None:
    precondition(shutil.which("tmux") is not None, "tmux is not installed (.ci/run installs it)")


class Tmux:
    """One detached tmux session on a private server socket, 120 x 40."""

    def __init__(self, command: str, env: dict[str, str]) -> None:
        self.socket = f"diffu-test-{uuid.uuid4().hex[:8]}"
        self._tmux("new-session", "-d", "-x", "120", "-y", "40", "-s", "chat", command, env=env)

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


@pytest.fixture
def tmux_chat(fake_daemon: DaemonProcess, diffu_home: Path, store: ChatStore) -> Iterator[Tmux]:
    store.save_settings(ChatSettings(max_new_tokens=24, steps=6, temperature=0.0).to_dict())
    env = {
        **os.environ,
        **fake_daemon.env,
        "DIFFU_URL": fake_daemon.url,
        "DIFFU_API_KEY": fake_daemon.token,
        "DIFFU_DATA_DIR": str(diffu_home / "data"),
        "TERM": "xterm-256color",
    }
    env.pop("TMUX", None)
    # tmux starts the command through a shell with the server's environment: pass ours explicitly.
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items() if k.startswith(("DIFFU_", "XDG_")))
    command = (
        f"cd {shlex.quote(str(REPO))} && env {exports} {shlex.quote(sys.executable)} -m assistant.cli chat"
    )
    session = Tmux(command, env)
    try:
        yield session
    finally:
        session.kill()


def test_chat_answers_and_replays_in_tmux(tmux_chat: Tmux, store: ChatStore) -> None:
    tmux_chat.wait_for(lambda s: "fake" in s, "connected header with the model's name")
    tmux_chat.keys("Write a haiku about masks", "Enter")
    screen = tmux_chat.wait_for(lambda s: "6 steps" in s, "answer stats line")
    assert "Write a haiku about masks" in screen  # the prompt stays above its answer
    answer = store.messages(store.conversations()[0].id)[-1]
    assert answer.role == "assistant" and answer.content
    assert answer.content.split()[0] in screen  # the answer's first word is on the screen
    # ctrl+r plays the denoising from its first step; home stops it there (masks still on the canvas); end
    # jumps to the last step; escape closes the replay.
    tmux_chat.keys("C-r")
    tmux_chat.wait_for(lambda s: "Replay · answer" in s, "the replay open")
    tmux_chat.keys("Home")
    tmux_chat.wait_for(lambda s: "step 1/6" in s and "░" in s and "paused" in s, "replay at its first step")
    tmux_chat.keys("End")
    tmux_chat.wait_for(lambda s: "step 6/6" in s and "24/24 tokens revealed" in s, "replay at the last step")
    tmux_chat.keys("Escape")
    tmux_chat.wait_for(lambda s: "Replay · answer" not in s, "the replay closed")
    tmux_chat.keys("C-q")
    deadline = time.monotonic() + 15
    while tmux_chat.alive() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not tmux_chat.alive(), "ctrl+q ends the chat (and with it the tmux session)"
