"""The latency a user of ``diffu lsp`` sees, per kind of suggestion, with the bundled model (or --model).

    python scripts/lsp_latency.py [--model DIR] [--per-mode 20] [--file assistant/infill/context.py]

Starts a daemon (``diffu serve``, its usual warm-up) and ``diffu lsp`` as Neovim 0.12 starts it (inline
completion, debounceMs 0: the editor's own 200 ms wait is not counted), opens ``--file``, and asks for
automatic suggestions the way typing does, at distinct places of three kinds: the end of an assignment
(single line), a new blank line (empty line), the end of a block opener (block). The first suggestion
after the server connects is reported on its own. Latency is request sent to answer received, measured
by this client; the server's own split (daemon round trip, engine) comes from ``diffu.status``.
"""

from __future__ import annotations

import argparse
import itertools
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lsp.state import percentile  # noqa: E402
from tests.assistant.helpers import REPO, DaemonProcess, isolated_env, start_daemon  # noqa: E402
from tests.lsp.rawclient import RawServer  # noqa: E402

PING = {"command": "diffu.status"}


def places(text: str, per_mode: int) -> dict[str, list[tuple[int, int, str, str]]]:
    """Per mode, (line, character, text replaced at the cursor, text put there) spread over the file.

    A single line is an assignment typed up to ``= `` (the rest of its line taken away while asking); an
    empty line is a new line after a statement, indented like it (as pressing Enter makes it); a block is
    the end of a line ending in ``:``.
    """
    lines = text.split("\n")
    single = [
        (i, m.end(), line[m.end() :], "")
        for i, line in enumerate(lines)
        if (m := re.match(r"\s*\w+ = ", line)) and line[m.end() :].strip()
    ]
    block = [
        (i, len(line), "", "") for i, line in enumerate(lines) if line.strip() and line.rstrip().endswith(":")
    ]
    empty = [
        (i, len(line), "", "\n" + " " * (len(line) - len(line.lstrip())))
        for i, line in enumerate(lines[:-1])
        if line.strip() and not line.rstrip().endswith((":", ",", "(", "[", "{")) and lines[i + 1].strip()
    ]

    def spread(found: list) -> list:
        step = max(1, len(found) // per_mode)
        return found[::step][:per_mode]

    return {"single_line": spread(single), "empty_line": spread(empty), "block": spread(block)}


def machine() -> str:
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    return f"{os.cpu_count()} cores of {model}, load average {os.getloadavg()[0]:.1f} at the start"


class Typist:
    """Edits one open document of ``server`` as typing would, and asks for suggestions as typing does."""

    def __init__(self, server: RawServer, uri: str) -> None:
        self.server, self.uri = server, uri
        self.version = 1
        self.asked = 0

    def edit(self, start: tuple[int, int], end: tuple[int, int], new: str) -> None:
        self.version += 1
        where = {
            "start": {"line": start[0], "character": start[1]},
            "end": {"line": end[0], "character": end[1]},
        }
        change = {
            "textDocument": {"uri": self.uri, "version": self.version},
            "contentChanges": [{"range": where, "text": new}],
        }
        self.server.notify("textDocument/didChange", change)

    def ask(self, line: int, character: int, old: str, new: str) -> float:
        """Make the place as typing would, ask as typing does (automatic), put the text back: the wall ms."""
        self.edit((line, character), (line, character + len(old)), new)
        head, _, tail = new.rpartition("\n")
        cursor = (line + 1, len(tail)) if head or new.startswith("\n") else (line, character + len(new))
        params = {
            "textDocument": {"uri": self.uri},
            "position": {"line": cursor[0], "character": cursor[1]},
            "context": {"triggerKind": 2},
        }
        self.asked += 1
        start = time.perf_counter()
        response = self.server.request(f"r{self.asked}", "textDocument/inlineCompletion", params)
        wall = (time.perf_counter() - start) * 1000
        assert "result" in response, response
        self.edit((line, character), cursor, old)
        return wall


def wait_warm(server: RawServer, daemon: DaemonProcess) -> float:
    """Seconds until the daemon compiled what the server asked it to warm on connecting: the first
    suggestion after connecting is then as when the editor has just started the server and the user
    starts typing."""
    t0 = time.perf_counter()
    for i in itertools.count():
        state = server.request(f"warm{i}", "workspace/executeCommand", PING)["result"]
        if state["warm_request"] or time.perf_counter() - t0 > 60:
            break
        time.sleep(0.1)
    assert state["warm_request"], f"the server did not ask the daemon to warm: {state}"
    while daemon.health()["stage"] != "ready":
        time.sleep(0.05)
    return time.perf_counter() - t0


def table(results: dict[str, list[float]], status: dict[str, Any]) -> None:
    """Per kind of place: the wall times measured here beside the engine's times the server recorded."""
    timings = status["timings"]
    assert timings[0]["first"] and timings[0]["mode"] == "single_line", timings[0]
    header = ("kind", "n", "median ms", "p90 ms", "engine median", "canvas", "steps")
    print("\n{:<12} {:>3} {:>10} {:>8} {:>14} {:>7} {:>6}".format(*header))
    for mode, walls in results.items():
        mine = [t for t in timings[1:] if t["mode"] == mode]
        engine = statistics.median(t["engine_ms"] for t in mine)
        print(
            f"{mode:<12} {len(walls):>3} {statistics.median(walls):>10.0f} {percentile(walls, 0.9):>8.0f} "
            f"{engine:>14.0f} {mine[0]['canvas']:>7} {mine[0]['steps']:>6}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model", default=None, help="checkpoint directory (default: the bundled demo model)"
    )
    parser.add_argument("--per-mode", type=int, default=20)
    parser.add_argument(
        "--file", default="assistant/infill/context.py", help="the document to type in (repository path)"
    )
    args = parser.parse_args()
    from model_runtime.bundled import bundled_model_dir

    model = args.model or str(bundled_model_dir())
    text = (REPO / args.file).read_text()
    root = Path(tempfile.mkdtemp(prefix="diffu-lsp-latency-"))
    print(f"machine: {machine()}")
    t0 = time.perf_counter()
    daemon = start_daemon(root / "daemon", model, env=isolated_env(root / "daemon"))
    print(f"daemon ready (load and warm-up) in {time.perf_counter() - t0:.1f} s")
    server = RawServer(root / "lsp")
    uri = (REPO / args.file).as_uri()
    typist = Typist(server, uri)
    results: dict[str, list[float]] = {}
    try:
        capabilities = {"textDocument": {"inlineCompletion": {}}, "window": {"workDoneProgress": True}}
        options = {"url": daemon.url, "apiKey": daemon.token, "debounceMs": 0}
        init = {"processId": None, "capabilities": capabilities, "initializationOptions": options}
        server.request("init", "initialize", init)
        server.notify("initialized", {})
        doc = {"uri": uri, "languageId": "python", "version": 1, "text": text}
        server.notify("textDocument/didOpen", {"textDocument": doc})
        spots = places(text, args.per_mode + 1)
        warm_s = wait_warm(server, daemon)
        first_wall = typist.ask(*spots["single_line"][0])
        for mode, found in spots.items():
            for spot in found[1:]:
                results.setdefault(mode, []).append(typist.ask(*spot))
        status = server.request("status", "workspace/executeCommand", PING)["result"]
    finally:
        server.close()
        daemon.stop()
    table(results, status)
    print(f"the editor's shapes compiled {warm_s:.1f} s after connecting")
    print(f"first suggestion after connecting (single line): {first_wall:.0f} ms")
    print(f"answered {status['counters']['answered']} of {status['counters']['requests']} with a suggestion")
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
