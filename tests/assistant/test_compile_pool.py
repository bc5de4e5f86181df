"""XLA's compile threads run at the warm-up's lower priority while only the warm-up compiles (#44: a block
suggestion sent while the warm-up compiled waited 1.6-2.4 s for its first forward, 0.4 s now)."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import threading

import pytest

from assistant.server.compile_pool import CompilePool
from assistant.server.native_work import NativeWork
from tests.assistant.helpers import REPO

# Compiles one many-op program, then runs it: the CPU each thread used in each phase, and which threads
# compile_pool counts as XLA's compile threads.
PROBE = """
import json, os, sys
from model_runtime import compile_cache
from assistant.server.compile_pool import later_threads
compile_cache.enable(sys.argv[1])
backend = compile_cache.backend_threads()
import jax, jax.numpy as jnp

def ticks():
    out = {}
    for tid in os.listdir("/proc/self/task"):
        fields = open(f"/proc/self/task/{tid}/stat").read().rsplit(")", 1)[1].split()
        out[int(tid)] = int(fields[11]) + int(fields[12])
    return out

def f(x):
    for i in range(120):
        x = jnp.tanh(x @ x.T + i) * jnp.cos(x)
    return x

x = jnp.ones((256, 256))
t0 = ticks()
compiled = jax.jit(f).lower(x).compile()
t1 = ticks()
for _ in range(5):
    compiled(x).block_until_ready()
t2 = ticks()
later = later_threads(backend)
import threading
print(json.dumps({
    "python": threading.get_native_id(),
    "backend": len(backend),
    "later": sorted(later),
    "compile": {t: t1[t] - t0.get(t, 0) for t in t1},
    "run": {t: t2[t] - t1.get(t, 0) for t in t2},
}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="threads are read from /proc")
def test_xla_compiles_on_threads_started_after_the_backend_and_runs_programs_on_others(tmp_path) -> None:
    # XLA's default flags, as a daemon runs it (the tests' own flags skip most of LLVM's work).
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, str(tmp_path / "cache")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env={**env, "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    later = {str(t) for t in report["later"]}
    assert report["backend"] > 0 and later
    # The CPU of the compile outside the Python thread that asked for it (which traced and lowered).
    compiled = sum(v for t, v in report["compile"].items() if t != str(report["python"]))
    ran = sum(report["run"].values())
    assert compiled > 20 and ran > 20, report
    # Most of it is on the threads the pool lowers; none of the program's runs are.
    assert sum(v for t, v in report["compile"].items() if t in later) > 0.6 * compiled, report
    assert sum(v for t, v in report["run"].items() if t in later) <= 0.02 * ran, report


def _can_raise() -> bool:
    base = os.getpriority(os.PRIO_PROCESS, 0)
    return os.geteuid() == 0 or resource.getrlimit(resource.RLIMIT_NICE)[0] >= 20 - base


@pytest.mark.skipif(not _can_raise(), reason="raising a priority back needs root or RLIMIT_NICE (CI is root)")
def test_the_compile_threads_are_low_exactly_while_every_compile_under_way_is_the_warm_ups() -> None:
    # A thread of this test stands for XLA's compile threads.
    stop = threading.Event()
    stand_in = threading.Thread(target=stop.wait)
    stand_in.start()
    native = stand_in.native_id
    assert native is not None
    base = os.getpriority(os.PRIO_PROCESS, native)
    pool = CompilePool(15, find=lambda backend: {native} if backend else set())
    pool.backend = frozenset({1})
    work = NativeWork(threading.Condition(), lambda what: None, pool)

    def niceness() -> int:
        return os.getpriority(os.PRIO_PROCESS, native)

    seen: list[int] = []

    def request_compile() -> None:
        with work.working("a request's program"):
            seen.append(niceness())

    try:
        with work.working("warm-up: a shape", low=True):
            assert niceness() == min(19, base + 15)
            helper = threading.Thread(target=request_compile)
            helper.start()
            helper.join()
            assert seen == [base]  # a request's compile runs on them at their priority
            assert niceness() == min(19, base + 15)  # lowered again once it is done
            work.normal(threading.get_ident())  # a request now waits for this compile
            assert niceness() == base
        with work.working("warm-up: a client's first program"):  # not lowered
            assert niceness() == base
        assert niceness() == base
    finally:
        stop.set()
        stand_in.join()
