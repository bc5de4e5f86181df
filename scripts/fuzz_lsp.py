"""Fuzz ``diffu lsp`` over stdio with thousands of seeded malformed messages; print what came back.

    python scripts/fuzz_lsp.py --count 5000 [--seed 7]

Starts ``diffu lsp`` with isolated directories and no daemon, initializes it, opens a document, then
sends the messages of ``tests/lsp/fuzz.py`` (broken params of every request, broken envelopes, ids and
framings, malformed notifications, stray responses), with a normal request after every 100 of them.
Reports the answers by kind, every problem (a request answered zero or two times, an error code the
specification does not name, a traceback, output that is not JSON), the normal request's latency, and
the server's resident memory before and after. Exit code 1 on any problem.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.fuzz_daemon import rss_mb  # noqa: E402
from tests.lsp.fuzz import PING, check, malformed_messages  # noqa: E402
from tests.lsp.rawclient import RawServer  # noqa: E402

SOURCE = "def total(items):\n    result = ???\n    return result\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="diffu-fuzz-lsp-"))
    server = RawServer(root)
    pings: list[float] = []
    try:
        server.initialize()
        uri = (root / "a.py").as_uri()
        server.notify(
            "textDocument/didOpen",
            {"textDocument": {"uri": uri, "languageId": "python", "version": 1, "text": SOURCE}},
        )
        assert "result" in server.request("ping-start", "workspace/executeCommand", PING)
        rss_before = rss_mb(server.proc.pid)
        cases = list(malformed_messages(seed=args.seed, count=args.count, uri=uri))
        start = time.perf_counter()
        for i, case in enumerate(cases):
            server.send(case.data)
            if i % 100 == 99:
                t0 = time.perf_counter()
                server.request(f"ping-{i}", "workspace/executeCommand", PING)
                pings.append((time.perf_counter() - t0) * 1000)
        server.request("ping-end", "workspace/executeCommand", PING)
        seconds = time.perf_counter() - start
        rss_after = rss_mb(server.proc.pid)
        responses = [r for r in server.responses() if not str(r.get("id")).startswith("ping-")]
        report = check(cases, responses, bytes(server.raw))
        alive = server.proc.poll() is None
    finally:
        server.close()
    problems = report.problems + server.violations + ([] if alive else ["the server exited"])
    print(f"diffu lsp fuzz: {args.count} messages, seed {args.seed}, {seconds:.1f} s")
    print("  sent:     " + ", ".join(f"{k} {v}" for k, v in sorted(report.cases.items())))
    print("  answers:  " + ", ".join(f"{k} {v}" for k, v in sorted(report.answers.items())))
    with_id = sum(c.id is not None for c in cases)
    print(f"  requests with an id: {with_id}, each answered exactly once: {not report.problems}")
    if pings:
        median, worst = statistics.median(pings), max(pings)
        print(f"  normal request during the run: median {median:.1f} ms, max {worst:.1f} ms")
    print(f"  resident memory: {rss_before:.1f} MB before, {rss_after:.1f} MB after")
    print(f"  problems: {len(problems)}")
    for problem in problems[:20]:
        print(f"    {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
