"""Time a newcomer's first answer: ``diffu chat --once`` on a fresh clone, cold and then warm.

    python scripts/first_contact.py [--repo .] [--fresh] [--prompt "def add(a, b):"] [--json OUT.json]

Every diffu directory (config, runtime, logs, data, and the XDG cache that holds JAX's persistent
compilation cache) is a new empty temporary directory, so nothing of an earlier run helps. Then:

1. **cold**: ``diffu chat --once PROMPT`` with no daemon running: it auto-starts one for the bundled model,
   which loads and compiles, and the answer is printed. Timed from the command's start to its exit.
2. ``diffu daemon stop``.
3. **warm**: the same command again: a new daemon starts, this time with the compilation cache of run 1.

``--fresh`` first clones ``--repo`` into a temporary directory and installs it into a new virtualenv
(``pip install -e .``; not timed), as a newcomer's Quick start does. Without it, the diffu of this
checkout's ``.venv`` is used. Prints a table (and ``--json``): seconds cold and warm, the answer, the
daemon's own account of its start from its log, and the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def fresh_install(repo: Path, work: Path) -> Path:
    """Clone ``repo`` and install it the way the README's Quick start does; return its ``diffu``."""
    clone = work / "clone"
    subprocess.run(["git", "clone", "-q", str(repo), str(clone)], check=True)
    subprocess.run([sys.executable, "-m", "venv", str(clone / ".venv")], check=True)
    subprocess.run([str(clone / ".venv/bin/pip"), "install", "-q", "-e", str(clone)], check=True)
    return clone / ".venv/bin/diffu"


def timed(
    cmd: list[str], env: dict[str, str], timeout: float
) -> tuple[float, subprocess.CompletedProcess[str]]:
    start = time.perf_counter()
    done = subprocess.run(
        cmd, env=env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )
    return time.perf_counter() - start, done


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=Path, default=ROOT, help="the checkout to measure (default: this one)")
    parser.add_argument("--fresh", action="store_true", help="clone --repo and pip install it first")
    parser.add_argument("--prompt", default="def add(a, b):")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds allowed per run")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="diffu-first-contact-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DIFFU_", "XDG_"))}
    for name in ("config", "runtime", "log", "data"):
        env[f"DIFFU_{name.upper()}_DIR"] = str(work / name)
    env["XDG_CACHE_HOME"] = str(work / "cache")  # JAX's persistent compilation cache lives here
    diffu = args.repo / ".venv/bin/diffu"
    try:
        if args.fresh:
            diffu = fresh_install(args.repo, work)
        if not diffu.exists():
            print(f"no {diffu}: install the checkout first (or pass --fresh)", file=sys.stderr)
            return 2
        once = [str(diffu), "chat", "--once", args.prompt]
        runs = {}
        for label in ("cold", "warm"):
            seconds, done = timed(once, env, args.timeout)
            if done.returncode != 0:
                print(f"{label} run failed ({done.returncode}):\n{done.stderr}", file=sys.stderr)
                return 1
            runs[label] = {"seconds": round(seconds, 2), "answer": done.stdout}
            stop = subprocess.run([str(diffu), "daemon", "stop"], env=env, capture_output=True, text=True)
            if stop.returncode != 0:
                print(f"diffu daemon stop failed: {stop.stderr}", file=sys.stderr)
                return 1
        logs = sorted((work / "log").glob("*.log"))
        report = {
            "prompt": args.prompt,
            "cold_seconds": runs["cold"]["seconds"],
            "warm_seconds": runs["warm"]["seconds"],
            "answer": runs["cold"]["answer"],
            "same_answer_warm": runs["cold"]["answer"] == runs["warm"]["answer"],
            "machine": f"{os.cpu_count()} cores, {cpu_name()}",
            "python": platform.python_version(),
            "fresh_clone": args.fresh,
            "daemon_log": logs[-1].read_text()[-4000:] if logs else "",
        }
        print(f"machine: {report['machine']}")
        print(f"cold (empty compilation cache, daemon auto-started): {report['cold_seconds']:.1f} s")
        print(f"warm (after diffu daemon stop, cache kept):          {report['warm_seconds']:.1f} s")
        print(f"answer:\n{report['answer']}")
        if args.json:
            args.json.write_text(json.dumps(report, indent=2) + "\n")
        return 0
    finally:
        if diffu.exists():  # never leave a daemon behind, whatever failed
            subprocess.run([str(diffu), "daemon", "stop"], env=env, capture_output=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
