"""``diffu chat`` in a real terminal emulator: tmux renders the screen and the test reads what a user sees.

The pseudo-terminal test in test_chat_daemon.py reads raw bytes; here tmux interprets them (cursor
movement, redraws, colours), so ``capture-pane`` gives the screen as it looks: the connected header, the
answer under its prompt, the replay of the denoising. ``.ci/run`` installs tmux for this test.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from assistant.client import Client, Done
from assistant.config import Config
from assistant.workspace.files import context_block, with_files
from tests.assistant.helpers import DaemonProcess
from tests.preconditions import precondition
from tests.tui.tmux import Tmux, diffu_in_tmux
from tui.settings import ChatSettings
from tui.store import ChatStore


@pytest.fixture(autouse=True)
def _tmux_installed() -> None:
    precondition(shutil.which("tmux") is not None, "tmux is not installed (.ci/run installs it)")


@pytest.fixture
def tmux_chat(fake_daemon: DaemonProcess, diffu_home: Path, store: ChatStore) -> Iterator[Tmux]:
    store.save_settings(ChatSettings(max_new_tokens=24, steps=6, temperature=0.0).to_dict())
    session = diffu_in_tmux(fake_daemon, diffu_home, "chat")
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


def test_files_in_context_in_a_real_terminal(
    fake_daemon: DaemonProcess, diffu_home: Path, store: ChatStore, tmp_path: Path
) -> None:
    """--file, @path with Tab, a file edited between turns and files that cannot be sent, as a user types
    them; what the daemon was sent is checked at the daemon: the fake model's answer is a function of the
    prompt's tokens, so the chat's answer is the one a request with exactly those files gets."""
    settings = ChatSettings(max_new_tokens=24, steps=6, temperature=0.0)
    store.save_settings(settings.to_dict())
    work = tmp_path / "work"
    work.mkdir()
    geo, geometry = work / "geo.py", work / "geometry.py"
    geo.write_text("def area(r):\n    return 3 * r * r\n")
    geometry.write_text("PI = 3.14\n")
    (work / "pkg").mkdir()
    (work / "blob.bin").write_bytes(b"\x00\x01\x02")
    (work / "big.py").write_text("x = 1\n" * 100)

    def daemon_answer(messages: list[dict[str, str]]) -> Done:
        config = Config(url=fake_daemon.url, api_key=fake_daemon.token, autostart=False)
        with Client(config=config) as client:
            return client.generate(messages=messages, max_new_tokens=24, sampling=settings.request_sampling())

    def blocks() -> list[str]:
        return [context_block("geo.py", geo.read_text()), context_block("geometry.py", geometry.read_text())]

    session = diffu_in_tmux(fake_daemon, diffu_home, "chat", "--file", "geo.py", cwd=work)
    try:
        session.wait_for(lambda s: "1 file ·" in s and "/486 tokens" in s, "the file's tokens in the header")
        session.keys("Compare with @geom", "Tab")
        session.wait_for(lambda s: "Compare with @geometry.py" in s, "the completed path")
        session.keys("Enter")
        session.wait_for(lambda s: s.count("6 steps") == 1, "the first answer")
        first = {"role": "user", "content": with_files(blocks(), "Compare with @geometry.py")}
        saved = store.messages(store.conversations()[0].id)
        expected = daemon_answer([first])
        assert saved[-1].content == expected.text and saved[-1].content
        assert saved[-1].stats["prompt_tokens"] == expected.usage["prompt_tokens"] > sum(map(len, blocks()))
        # Edited between turns: the next turn sends the file as it is now.
        geo.write_text("def area(r):\n    return 3.14159 * r * r\n")
        session.keys("Again", "Enter")
        session.wait_for(lambda s: s.count("6 steps") == 2, "the second answer")
        second = {"role": "user", "content": with_files(blocks(), "Again")}
        previous = {"role": "user", "content": "Compare with @geometry.py"}
        history = [previous, {"role": "assistant", "content": saved[-1].content}, second]
        assert store.messages(store.conversations()[0].id)[-1].content == daemon_answer(history).text
        # A file in context that went away: one line, and nothing is sent.
        geometry.unlink()
        session.keys("Once more", "Enter")
        session.wait_for(lambda s: "geometry.py: no such file (it is in the context" in s, "the refusal")
        session.wait_for(lambda s: "▊ Once more " in s, "the prompt kept, to fix and send again")
        assert len(store.messages(store.conversations()[0].id)) == 4
        session.keys("C-u")
        session.wait_for(lambda s: "▊ Ask DiffuCoder" in s, "the prompt cleared")
        session.keys("/drop geometry.py", "Enter")
        session.wait_for(lambda s: "dropped geometry.py" in s, "the file dropped")
        session.keys("/add pkg blob.bin big.py missing.py", "Enter")
        screen = session.wait_for(lambda s: "missing.py: no such file; not added" in s, "one line per file")
        assert "pkg: is a directory" in screen and "blob.bin: a binary file, not text" in screen, screen
        big = "big.py: 620 tokens (with the 60 of the files already in context), beyond the prompt's"
        assert big in screen, screen
        assert "1 file ·" in screen, screen  # none of them was added
    finally:
        session.kill()
