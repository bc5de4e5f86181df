"""The chat's files, ``/apply`` and ``diffu fill`` on the bundled demo model, end to end: a real daemon, the
real tokenizer, a trained model whose answers hold code blocks and whose fills are code, in a real
terminal (tmux) where a user would see them, and the non-interactive forms (``--json``) scripts use.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from assistant.client import Client
from assistant.config import Config
from assistant.workspace.files import context_block
from tests.assistant.helpers import DaemonProcess
from tests.preconditions import precondition
from tests.tui.tmux import diffu_in_tmux
from tui.store import ChatStore

CALC = "def add(a, b):\n    return 0\n\n\ndef keep():\n    return 1\n"
HOLES = "import math\n\n\ndef area(r):\n    return ???\n\n\ndef double(x):\n    return ???\n"
PROMPT = "Write a Python function `add(a, b)`. Return the sum of a and b."


@pytest.fixture
def work(tmp_path: Path) -> Path:
    root = tmp_path / "work"
    root.mkdir()
    (root / "calc.py").write_text(CALC)
    (root / "ex.py").write_text(HOLES)
    return root


def diffu(daemon: DaemonProcess, home: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **daemon.env,
        "DIFFU_URL": daemon.url,
        "DIFFU_API_KEY": daemon.token,
        "DIFFU_DATA_DIR": str(home / "data"),
    }
    return subprocess.run(
        [sys.executable, "-m", "assistant.cli", *args],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
    )


def one_error_line(result: subprocess.CompletedProcess[str], text: str) -> None:
    """Bad input: exit 2, one line on stderr saying ``text``, no traceback, nothing on stdout."""
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and text in result.stderr and result.stdout == "", result.stderr


def outside_holes_kept(original: str, filled: str) -> None:
    """Every byte of ``original`` outside its ``???`` holes is in ``filled``, in order, and only fills
    lie between them."""
    parts = original.split("???")
    assert filled.startswith(parts[0]) and filled.endswith(parts[-1])
    rest = filled[len(parts[0]) : len(filled) - len(parts[-1])]
    for middle in parts[1:-1]:
        assert middle in rest
        rest = rest[rest.index(middle) + len(middle) :]


def test_once_json_counts_the_files_tokens_and_refuses_bad_input(
    bundled_daemon: DaemonProcess, diffu_home: Path, store: ChatStore, work: Path
) -> None:
    store.save_settings({"max_new_tokens": 64, "steps": 64})  # a short answer is enough here
    plain = diffu(bundled_daemon, diffu_home, work, "chat", "--once", "--json", PROMPT)
    assert plain.returncode == 0, plain.stderr
    with_file = diffu(
        bundled_daemon, diffu_home, work, "chat", "--once", "--file", "calc.py", "--json", PROMPT
    )
    assert with_file.returncode == 0, with_file.stderr
    a, b = json.loads(plain.stdout), json.loads(with_file.stdout)
    assert a["files"] == [] and isinstance(a["answer"], str) and a["finish_reason"] in ("stop", "length")
    assert [f["path"] for f in b["files"]] == ["calc.py"]
    with Client(config=Config(url=bundled_daemon.url, api_key=bundled_daemon.token, autostart=False)) as c:
        assert b["files"][0]["tokens"] == len(
            c.tokenize(context_block("calc.py", CALC))
        )  # the daemon's count
    assert b["prompt_tokens"] - a["prompt_tokens"] >= b["files"][0]["tokens"] > 0
    # Bad input: one line each, exit 2, and the daemon keeps serving.
    (work / "big.py").write_text("value = 12345\n" * 80)
    (work / "pkg").mkdir()
    (work / "blob.bin").write_bytes(b"\x00\x01")
    one_error_line(
        diffu(bundled_daemon, diffu_home, work, "chat", "--once", "--file", "gone.py", PROMPT),
        "gone.py: no such file",
    )
    one_error_line(
        diffu(bundled_daemon, diffu_home, work, "chat", "--once", "--file", "pkg", PROMPT),
        "pkg: is a directory",
    )
    one_error_line(
        diffu(bundled_daemon, diffu_home, work, "chat", "--once", "--file", "blob.bin", PROMPT),
        "blob.bin: a binary file",
    )
    big = diffu(bundled_daemon, diffu_home, work, "chat", "--once", "--file", "big.py", "--json", PROMPT)
    one_error_line(big, "big.py: ")
    assert (
        "beyond the prompt's limit of 446 tokens (the model's context of 512 less the 64-token answer)"
        in big.stderr
    )
    one_error_line(
        diffu(bundled_daemon, diffu_home, work, "chat", "--json", PROMPT), "--json goes with --once"
    )
    assert bundled_daemon.health()["status"] == "ok"


def test_fill_write_json_fills_every_hole_and_keeps_every_other_byte(
    bundled_daemon: DaemonProcess, diffu_home: Path, work: Path
) -> None:
    result = diffu(bundled_daemon, diffu_home, work, "fill", "ex.py", "--write", "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["path"] == "ex.py" and out["written"] is True and len(out["fills"]) == 2
    assert [(h["line"], h["column"], h["marker"]) for h in out["holes"]] == [(5, 12, "???"), (9, 12, "???")]
    filled = (work / "ex.py").read_text()
    ast.parse(filled)
    assert "???" not in filled and "<|mask|>" not in filled
    outside_holes_kept(HOLES, filled)
    assert filled == HOLES.replace("???", out["fills"][0], 1).replace("???", out["fills"][1], 1)
    # Bad input: one line each, exit 2.
    (work / "plain.py").write_text("x = 1\n")
    one_error_line(
        diffu(bundled_daemon, diffu_home, work, "fill", "plain.py", "--write", "--json"),
        "plain.py: no holes to fill (mark them with <|mask|> or ???)",
    )
    one_error_line(
        diffu(bundled_daemon, diffu_home, work, "fill", "gone.py", "--json"), "gone.py: no such file"
    )
    one_error_line(
        diffu(bundled_daemon, diffu_home, work, "fill", "plain.py", "--hole-tokens", "0"),
        "--hole-tokens: must be in 1..1024, got 0",
    )
    one_error_line(
        diffu(bundled_daemon, diffu_home, work, "fill", "ex.py:40-50"), "ex.py:40-50: the file has 9 lines"
    )


@pytest.fixture
def _tmux() -> None:
    precondition(shutil.which("tmux") is not None, "tmux is not installed (.ci/run installs it)")


@pytest.mark.usefixtures("_tmux")
def test_fill_in_a_real_terminal_shows_the_file_denoise_then_writes_on_y(
    bundled_daemon: DaemonProcess, diffu_home: Path, work: Path
) -> None:
    session = diffu_in_tmux(bundled_daemon, diffu_home, "fill", "ex.py", cwd=work, hold=True)
    try:
        live = []  # screens showing the file with masks still in it
        deadline = time.monotonic() + 180
        while "Write ex.py? [y/N]" not in (screen := session.screen()):
            assert time.monotonic() < deadline, f"no question after 180s; the screen shows:\n{screen}"
            if "░" in screen:
                live.append(screen)
            time.sleep(0.1)
        # The live view: the file's own numbered lines, the holes' masks resolving inside them.
        assert any("4 │ def area(r):" in s and "8 │ def double(x):" in s for s in live), live[-1:]
        assert any("5 │     return ░" in s for s in live)
        assert "-    return ???" in screen and "+++ b/ex.py" in screen  # then the diff
        assert (work / "ex.py").read_text() == HOLES  # nothing written before y
        session.keys("y", "Enter")
        session.wait_for(lambda s: "diffu: 2 of 2 holes filled; wrote ex.py" in s, "the file written")
    finally:
        session.kill()
    filled = (work / "ex.py").read_text()
    ast.parse(filled)
    assert "???" not in filled
    outside_holes_kept(HOLES, filled)


@pytest.mark.usefixtures("_tmux")
def test_apply_and_undo_in_a_real_terminal(
    bundled_daemon: DaemonProcess, diffu_home: Path, work: Path
) -> None:
    original = (work / "calc.py").read_bytes()
    session = diffu_in_tmux(bundled_daemon, diffu_home, "chat", "--file", "calc.py", cwd=work)
    try:
        session.wait_for(lambda s: "1 file ·" in s, "the file in the header")
        session.keys(PROMPT, "Enter")
        session.wait_for(lambda s: "⟲ replay" in s, "the answer", timeout=180)
        session.keys("/apply", "Enter")
        screen = session.wait_for(
            lambda s: "Apply the code block to calc.py" in s or "does not parse" in s,
            "the review",
            timeout=30,
        )
        if "does not parse" in screen:  # a model whose block does not parse: applied only when forced
            session.keys("/apply --force", "Enter")
            screen = session.wait_for(lambda s: "Apply the code block to calc.py" in s, "the review")
        screen = session.wait_for(
            lambda s: "+++ b/calc.py" in s and "y Write it" in s, "the diff and its keys"
        )
        assert (work / "calc.py").read_bytes() == original  # nothing written before y
        session.keys("y")
        session.wait_for(lambda s: "wrote calc.py" in s and "/undo puts it back" in s, "the file written")
        assert (work / "calc.py").read_bytes() != original
        session.keys("/undo", "Enter")
        session.wait_for(lambda s: "put back calc.py as it was" in s, "the undo")
        assert (work / "calc.py").read_bytes() == original
        assert os.path.exists(work / "calc.py") and sorted(p.name for p in work.iterdir()) == [
            "calc.py",
            "ex.py",
        ]
    finally:
        session.kill()
