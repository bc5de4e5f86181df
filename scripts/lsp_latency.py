"""The latency a user of ``diffu lsp`` sees, per kind of suggestion, with the bundled model (or --model).

    python scripts/lsp_latency.py [--model DIR] [--per-mode 20] [--file lsp/context.py]

Starts a daemon (``diffu serve``, its usual warm-up) and ``diffu lsp`` as Neovim 0.12 starts it (inline
completion, debounceMs 0: the editor's own 200 ms wait is not counted), opens ``--file``, and asks for
automatic suggestions the way typing does, at distinct places of three kinds: the end of an assignment
(single line), a new blank line (empty line), the end of a block opener (block). The first suggestion
after the server connects is reported on its own. Latency is request sent to answer received, measured
by this client; the server's own split (daemon round trip, engine) comes from ``diffu.status``.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lsp.state import percentile  # noqa: E402
from tests.assistant.helpers import REPO, isolated_env, start_daemon  # noqa: E402
from tests.lsp.rawclient import RawServer  # noqa: E402

PING = {"command": "diffu.status"}


def places(text: str, per_mode: int) -> dict[str, list[tuple[int, int, str | None]]]:
    """(line, character, text to insert first) for each mode, spread over the file."""
    lines = text.split("\n")
    single = [(i, m.end(), None) for i, line in enumerate(lines) if (m := re.match(r"\s*\w+ = ", line))]
    block = [
        (i, len(line), None) for i, line in enumerate(lines) if line.rstrip().endswith(":") and line.strip()
    ]
    # A new blank line after a plain statement, indented like it: as pressing Enter there does.
    empty = [
        (i + 1, len(line) - len(line.lstrip()), "\n")
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model", default=None, help="checkpoint directory (default: the bundled demo model)"
    )
    parser.add_argument("--per-mode", type=int, default=20)
    parser.add_argument("--file", default="lsp/context.py", help="the document to type in (repository path)")
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
    results: dict[str, list[float]] = {}
    try:
        capabilities = {"textDocument": {"inlineCompletion": {}}, "window": {"workDoneProgress": True}}
        options = {"url": daemon.url, "apiKey": daemon.token, "debounceMs": 0}
        server.request(
            "init",
            "initialize",
            {"processId": None, "capabilities": capabilities, "initializationOptions": options},
        )
        server.notify("initialized", {})
        uri = (REPO / args.file).as_uri()
        version = 1
        server.notify(
            "textDocument/didOpen",
            {"textDocument": {"uri": uri, "languageId": "python", "version": 1, "text": text}},
        )
        n = 0
        for mode, spots in places(text, args.per_mode).items():
            for line, character, insert in spots:
                if insert is not None:  # open a blank line: insert it, ask, take it out again
                    version += 1
                    at = {"line": line, "character": 0}
                    change = {"range": {"start": at, "end": at}, "text": " " * character + insert}
                    server.notify(
                        "textDocument/didChange",
                        {"textDocument": {"uri": uri, "version": version}, "contentChanges": [change]},
                    )
                params = {
                    "textDocument": {"uri": uri},
                    "position": {"line": line, "character": character},
                    "context": {"triggerKind": 2},
                }
                n += 1
                start = time.perf_counter()
                response = server.request(f"r{n}", "textDocument/inlineCompletion", params)
                wall = (time.perf_counter() - start) * 1000
                assert "result" in response, response
                results.setdefault(mode, []).append(wall)
                if insert is not None:
                    version += 1
                    end = {"line": line + 1, "character": 0}
                    change = {"range": {"start": {"line": line, "character": 0}, "end": end}, "text": ""}
                    server.notify(
                        "textDocument/didChange",
                        {"textDocument": {"uri": uri, "version": version}, "contentChanges": [change]},
                    )
        status = server.request("status", "workspace/executeCommand", PING)["result"]
    finally:
        server.close()
        daemon.stop()
    timings = status["timings"]
    first = next(t for t in timings if t["first"])
    header = ("kind", "n", "median ms", "p90 ms", "engine median", "canvas", "steps")
    print("\n{:<12} {:>3} {:>10} {:>8} {:>14} {:>7} {:>6}".format(*header))
    firsts = {}
    for mode, walls in results.items():
        mine = [t for t in timings if t["mode"] == mode]
        # The first suggestion after connecting is reported on its own, not in its mode's figures.
        if mine and mine[0]["first"]:
            firsts[mode] = walls[0]
            walls = walls[1:]
            mine = mine[1:]
        engine = statistics.median(t["engine_ms"] for t in mine) if mine else float("nan")
        canvas, steps = (mine[0]["canvas"], mine[0]["steps"]) if mine else (0, 0)
        print(
            f"{mode:<12} {len(walls):>3} {statistics.median(walls):>10.0f} {percentile(walls, 0.9):>8.0f} "
            f"{engine:>14.0f} {canvas:>7} {steps:>6}"
        )
    ((mode, wall),) = firsts.items()
    print(f"first suggestion after connecting ({mode}): {wall:.0f} ms (server: {first['wall_ms']:.0f} ms)")
    print(f"answered {status['counters']['answered']} of {status['counters']['requests']} with a suggestion")
    return 0


if __name__ == "__main__":
    sys.exit(main())
