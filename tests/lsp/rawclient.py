"""A raw byte-level client for ``diffu lsp``: sends exactly the bytes it is given, reads strictly.

pytest-lsp's client cannot send malformed traffic, so the conformance and fuzz tests use this one. The
reader thread parses the server's output as the specification requires (``Content-Length`` framing,
strict JSON: ``Infinity`` or ``NaN`` is a violation) and records every message and every violation.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tests.assistant.helpers import isolated_env

# Here rather than in conftest.py, which needs pytest's plugins: scripts/lsp_latency.py and fuzz_lsp.py use
# this client and must run after the README's install, which has no test extra.
LSP_COMMAND = [sys.executable, "-m", "assistant.cli", "lsp"]


def _strict(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def frame(body: bytes | str | dict[str, Any]) -> bytes:
    if isinstance(body, dict):
        body = json.dumps(body)
    if isinstance(body, str):
        body = body.encode()
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


class RawServer:
    """``diffu lsp`` in a subprocess with isolated directories and no daemon to reach."""

    def __init__(self, root: Path, *, env: dict[str, str] | None = None) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.root = root
        self.stderr_path = root / "lsp-stderr.log"
        server_env = isolated_env(root, **{"DIFFU_AUTOSTART": "0", **(env or {})})
        self.proc = subprocess.Popen(
            LSP_COMMAND,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr_path.open("wb"),
            env=server_env,
        )
        self.messages: list[dict[str, Any]] = []
        self.violations: list[str] = []
        self.raw = bytearray()
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    # -- output ----------------------------------------------------------------------------------------
    def _read(self) -> None:
        assert self.proc.stdout is not None
        out = self.proc.stdout
        while True:
            headers: dict[str, str] = {}
            while True:
                line = out.readline()
                if not line:
                    return
                self.raw += line
                if line in (b"\r\n", b"\n"):
                    break
                if not line.endswith(b"\r\n") or b":" not in line:
                    self._violation(f"bad header line {line!r}")
                    continue
                name, _, value = line.decode("ascii").partition(":")
                headers[name.strip().lower()] = value.strip()
            length = int(headers.get("content-length", "-1"))
            if length < 0:
                self._violation(f"no Content-Length in {headers}")
                continue
            body = out.read(length)
            self.raw += body
            try:
                message = json.loads(body.decode("utf-8"), parse_constant=_strict)
            except ValueError as exc:
                self._violation(f"invalid JSON from the server ({exc}): {body[:200]!r}")
                continue
            with self._changed:
                self.messages.append(message)
                self._changed.notify_all()

    def _violation(self, what: str) -> None:
        with self._changed:
            self.violations.append(what)
            self._changed.notify_all()

    def responses(self, msg_id: Any = ...) -> list[dict[str, Any]]:
        """Responses (result or error), all of them or those for ``msg_id`` (None: null-id errors)."""
        with self._changed:
            found = [m for m in self.messages if "method" not in m]
        return found if msg_id is ... else [m for m in found if m.get("id") == msg_id]

    def notifications(self, method: str | None = None) -> list[dict[str, Any]]:
        with self._changed:
            return [
                m for m in self.messages if "method" in m and "id" not in m and method in (None, m["method"])
            ]

    def wait(self, predicate: Any, timeout: float = 20.0, what: str = "a message") -> Any:
        """Wait until ``predicate()`` is true (the condition's lock is re-entrant, so it may read state)."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                value = predicate()
                if value:
                    return value
                left = deadline - time.monotonic()
                if left <= 0 or not self._reader.is_alive():
                    raise AssertionError(f"no {what} (stderr: {self.stderr()[-2000:]})")
                self._changed.wait(min(left, 0.2))

    def response(self, msg_id: Any, timeout: float = 20.0) -> dict[str, Any]:
        return self.wait(lambda: next(iter(self.responses(msg_id)), None), timeout, f"response to {msg_id!r}")

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    # -- input -----------------------------------------------------------------------------------------
    def send(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def request(self, msg_id: Any, method: str, params: Any = None) -> dict[str, Any]:
        """Send a request and wait for its response."""
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": msg_id, "method": method}
        if params is not None:
            message["params"] = params
        self.send(frame(message))
        return self.response(msg_id)

    def notify(self, method: str, params: Any = None) -> None:
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        self.send(frame(message))

    def initialize(self, msg_id: Any = "init") -> dict[str, Any]:
        response = self.request(
            msg_id,
            "initialize",
            {
                "processId": None,
                "rootUri": self.root.as_uri(),
                "capabilities": {},
                "initializationOptions": {},
            },
        )
        self.notify("initialized", {})
        return response

    def exit_code(self, timeout: float = 20.0) -> int:
        return self.proc.wait(timeout)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass
