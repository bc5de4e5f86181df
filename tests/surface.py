"""What users and editors see of diffu, as text: every ``diffu`` command's ``--help`` and the language
server's answer to ``initialize`` for each client profile the tests use.

``tests/test_surface.py`` regenerates both from the current tree and compares them with the golden copies
in ``tests/golden/``, which were captured from the tree before issue #41 (commit 8dd7ede): a refactoring
must leave them byte for byte as they are. Capture them again only for an intended change::

    python tests/surface.py --root . --out tests/golden

(``--root`` may be another checkout, e.g. ``git worktree add /tmp/base 8dd7ede``: the tree whose code
runs; this file only drives it.) Everything runs in subprocesses of ``--root`` with an isolated
environment and a fixed terminal width, so neither the caller's settings nor its window change a byte.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

COLUMNS = "100"  # argparse wraps help to the terminal's width (COLUMNS - 2)

# The client profiles of tests/lsp/conftest.py, plus none at all: the server's capabilities follow the
# client's (the inline or the completion provider, registered statically or dynamically).
LSP_PROFILES = ("none", "neovim", "neovim-0.12", "vscode", "vscode-proposed")

# Run inside ``--root`` (``python -c``): every parser of the ``diffu`` tree, by its command line.
_HELP_TREE = """
import argparse, json, os, sys
import assistant
here = os.path.realpath(assistant.__file__)
assert here.startswith(os.path.realpath(sys.argv[1]) + os.sep), f"{here} is not the tree asked for"
from assistant.cli.main import build_parser

def walk(parser):
    yield parser.prog, parser.format_help()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from walk(sub)

print(json.dumps(dict(walk(build_parser()[0]))))
"""


def _env(root: Path, home: Path) -> dict[str, str]:
    """The caller's environment without its diffu settings, confined to ``home``, running ``root``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DIFFU_")}
    env.update(
        PYTHONPATH=str(root),
        COLUMNS=COLUMNS,
        HOME=str(home),
        XDG_CONFIG_HOME=str(home / "config"),
        DIFFU_CONFIG_DIR=str(home / "diffu-config"),
        DIFFU_RUNTIME_DIR=str(home / "diffu-run"),
        DIFFU_LOG_DIR=str(home / "diffu-log"),
        DIFFU_AUTOSTART="0",
    )
    return env


def help_tree(root: Path) -> dict[str, str]:
    """``--help`` of ``diffu`` and of every sub-command (recursively), by command line."""
    with tempfile.TemporaryDirectory() as home:
        out = subprocess.run(
            [sys.executable, "-c", _HELP_TREE, str(root)],
            cwd=root,
            env=_env(root, Path(home)),
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        )
    return dict(json.loads(out.stdout))


def client_capabilities(profile: str) -> dict[str, Any]:
    """The ``capabilities`` an editor of ``profile`` sends (as tests/lsp/conftest.py builds them)."""
    if profile == "none":
        return {}
    from lsprotocol.converters import get_converter
    from pytest_lsp import client_capabilities as captured

    converter = get_converter()
    if profile == "neovim-0.12":
        data = Path(__file__).parent / "lsp" / "data" / "neovim_v0.12.0.json"
        return dict(json.loads(data.read_text()))
    raw: dict[str, Any] = converter.unstructure(
        captured("neovim" if profile == "neovim" else "visual-studio-code")
    )
    if profile == "vscode-proposed":
        raw["textDocument"]["inlineCompletion"] = {"dynamicRegistration": True}
    elif profile not in ("neovim", "vscode"):
        raise ValueError(profile)
    return raw


def _frame(message: dict[str, Any]) -> bytes:
    body = json.dumps(message).encode()
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


def _read_message(stream: Any) -> dict[str, Any]:
    """One framed message from the server's stdout (``Content-Length`` headers, then the body)."""
    headers: dict[str, str] = {}
    while True:
        line = stream.readline()
        if not line:
            raise EOFError("diffu lsp closed its output")
        if line in (b"\r\n", b"\n"):
            break
        name, _, value = line.decode("ascii").partition(":")
        headers[name.strip().lower()] = value.strip()
    return dict(json.loads(stream.read(int(headers["content-length"]))))


def lsp_initialize(root: Path, profile: str) -> dict[str, Any]:
    """The ``result`` of ``initialize`` from ``diffu lsp`` of ``root``, for a client of ``profile``."""
    with tempfile.TemporaryDirectory() as home:
        workspace = Path(home) / "ws"
        workspace.mkdir()
        proc = subprocess.Popen(
            [sys.executable, "-m", "assistant.cli", "lsp"],
            cwd=root,
            env=_env(root, Path(home)),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        assert proc.stdin is not None and proc.stdout is not None
        try:
            params = {
                "processId": None,
                "rootUri": workspace.as_uri(),
                "capabilities": client_capabilities(profile),
                "initializationOptions": {},
            }
            proc.stdin.write(_frame({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": params}))
            proc.stdin.flush()
            # A server that never answers is killed, which ends the read below with an EOFError.
            watchdog = threading.Timer(60, proc.kill)
            watchdog.start()
            while "id" not in (message := _read_message(proc.stdout)):
                pass  # a notification (a log message) before the answer
            proc.stdin.write(_frame({"jsonrpc": "2.0", "id": 2, "method": "shutdown"}))
            proc.stdin.write(_frame({"jsonrpc": "2.0", "method": "exit"}))
            proc.stdin.close()
            proc.wait(30)
            watchdog.cancel()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
            proc.stdout.close()
    return dict(message["result"])


def surface(root: Path) -> dict[str, str]:
    """Every golden file's relative path and text, generated from the tree at ``root``."""
    files = {f"help/{prog.replace(' ', '_')}.txt": text for prog, text in help_tree(root).items()}
    for profile in LSP_PROFILES:
        result = lsp_initialize(root, profile)
        files[f"lsp_initialize/{profile}.json"] = json.dumps(result, indent=2) + "\n"
    return files


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--out", type=Path, required=True, help="the golden directory to (re)write")
    args = parser.parse_args()
    for relative, text in surface(args.root.resolve()).items():
        path = args.out / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
