"""Fuzz a real daemon with thousands of seeded malformed requests; print what came back.

    python scripts/fuzz_daemon.py --count 5000 [--model fake:step_delay=0.001] [--seed 7]

Starts ``diffu serve`` on a free loopback port in a temporary, isolated set of directories, sends the
requests of ``tests/assistant/fuzz.py`` (every POST route, every field broken with huge integers, lone
surrogates, deep nesting, wrong types, ...), and reports the status codes, any 5xx, the daemon's resident
memory before and after, and whether a normal request is answered exactly as before. Exit code 1 on any
5xx or a changed answer.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.assistant.fuzz import malformed_requests  # noqa: E402
from tests.assistant.helpers import isolated_env, start_daemon  # noqa: E402


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--model", default="fake:step_delay=0.001")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="diffu-fuzz-"))
    daemon = start_daemon(root, args.model, env=isolated_env(root))
    normal = {"prompt": "def add(a, b):", "max_new_tokens": 8, "stream": False}
    statuses: dict[int, int] = {}
    server_errors = []
    try:
        with httpx.Client(base_url=daemon.url, headers=daemon.headers, timeout=60) as http:
            before = http.post("/v1/diffu/generate", json=normal).json()["text"]
            rss_before = rss_mb(daemon.proc.pid)
            start = time.perf_counter()
            for path, body in malformed_requests(seed=args.seed, count=args.count):
                r = http.post(path, content=body, headers={"content-type": "application/json"})
                statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
                if r.status_code >= 500:
                    server_errors.append((path, body[:200], r.text[:200]))
            seconds = time.perf_counter() - start
            after = http.post("/v1/diffu/generate", json=normal).json()["text"]
            rss_after = rss_mb(daemon.proc.pid)
    finally:
        daemon.stop()
    print(f"{args.count} malformed requests in {seconds:.1f}s against {args.model}")
    print("status codes: " + ", ".join(f"{k}: {v}" for k, v in sorted(statuses.items())))
    print(f"5xx: {len(server_errors)}")
    for item in server_errors[:10]:
        print("  ", item)
    print(f"daemon resident memory: {rss_before:.0f} MB before, {rss_after:.0f} MB after")
    print(f"normal request answered identically afterwards: {after == before}")
    return 1 if server_errors or after != before else 0


if __name__ == "__main__":
    sys.exit(main())
