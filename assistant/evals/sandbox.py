"""Run untrusted Python programs (model-written code and its tests), each in a confined process tree.

Every program runs under ``assistant/evals/sandbox_child.py`` (see there for each step): in its own
network, PID and mount namespaces, as an unprivileged uid when the evaluator is root (``nobody``), with
no capability, a Landlock filesystem ruleset, an environment holding nothing of the user's, and a
size-capped tmpfs of its own (nosuid, noexec) as working directory, HOME and TMPDIR. Memory and processes
are counted for the whole run in cgroups of its own where the kernel lets the evaluator make them
(``assistant/evals/cgroups.py``), with per-process limits (address space, file size, processes, open
files, CPU seconds) in any case. Output goes to files the file-size limit bounds and is read back capped.

The run ends everything it started (``assistant/evals/sandbox_cleanup.py``): at the program's end, its
timeout or when the evaluator closes the sandbox, the PID namespace's init is killed (so the kernel kills
the whole namespace) and the evaluator waits until it is gone; the run's cgroup is killed too where the
kernel has ``cgroup.kill``, and the process group in any case. Whatever the program leaves on disk is in
its tmpfs, which vanishes with its mount namespace; where the kernel gives no mount namespace, its
temporary directory is removed by a bounded walk that never leaves it and never raises (a failure is a
logged warning; the run's outcome stands).

A pass means the program's code returned: the harness writes a marker only then (see
``sandbox_child.harness``), so ``sys.exit(0)``, ``os._exit(0)`` or a sabotaged error report fail. A
hostile program (an infinite loop, a fork bomb, a 20 GB allocation or file, killing its parent, reading
the user's files, connecting to the daemon) ends as one failed run; the caller carries on. Each result
says which isolation the kernel granted (``isolation``), so a report can state it.

The evaluation command (``diffu eval``) and the reinforcement-learning rewards use this module.
"""

from __future__ import annotations

import json
import logging
import os
import pwd
import secrets
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from assistant.evals import cgroups
from assistant.evals.sandbox_cleanup import Run, remove_tree

CHILD = Path(__file__).with_name("sandbox_child.py")
log = logging.getLogger("diffu.sandbox")


@dataclass(frozen=True)
class Limits:
    """A run's limits. ``timeout`` is HumanEval's 3 s by default.

    ``memory_bytes`` bounds the run's processes together where a memory cgroup is granted, and each
    process's address space in any case; ``processes`` likewise (a pids cgroup, and ``RLIMIT_NPROC``).
    ``disk_bytes`` and ``disk_files`` size the run's tmpfs (all its files together); ``file_bytes``
    bounds each file wherever it is.
    """

    timeout: float = 3.0
    cpu_seconds: int | None = None  # default: the timeout rounded up, plus one
    memory_bytes: int = 2 << 30
    file_bytes: int = 64 << 20
    disk_bytes: int = 64 << 20
    disk_files: int = 16384
    processes: int = 64
    open_files: int = 256
    output_bytes: int = 16 << 10  # captured stdout/stderr kept per stream

    def for_child(self) -> dict[str, int]:
        cpu = self.cpu_seconds if self.cpu_seconds is not None else int(self.timeout) + 2
        return {
            "cpu_seconds": cpu,
            "memory_bytes": self.memory_bytes,
            "file_bytes": self.file_bytes,
            "disk_bytes": self.disk_bytes,
            "disk_files": self.disk_files,
            "processes": self.processes,
            "open_files": self.open_files,
        }


@dataclass
class Outcome:
    """How one program ended.

    ``status``: ``passed`` (its code ran to its end), ``failed`` (an AssertionError), ``error`` (another
    exception, ``SystemExit`` included, named in ``error``), ``timeout``, ``killed`` (a signal: a CPU or
    file-size limit, the memory cgroup, or the program killing its own group) or ``exit`` (the process
    ended before its code did, without an exception: ``os._exit``, even with code 0).
    """

    status: str
    returncode: int | None
    error: str | None
    seconds: float
    stdout: str = ""
    stderr: str = ""
    isolation: dict[str, object] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def _read_dirs() -> list[str]:
    """Directories the program may read: the Python installation this evaluator runs on."""
    dirs = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    return sorted(d for d in dirs if d)


def _environment(workdir: str) -> dict[str, str]:
    # Nothing of the user's: no DIFFU_* settings, tokens, proxies or PYTHON* variables. HOME and TMPDIR
    # become the program's own directory (the child sets them once it knows where that is).
    return {
        "PATH": "/usr/bin:/bin",
        "HOME": workdir,
        "TMPDIR": workdir,
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONHASHSEED": "0",
    }


def _unprivileged_identity() -> list[int] | None:
    """The uid and gid a root evaluator's programs run as (``nobody``); None when not root."""
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam("nobody")
        return [entry.pw_uid, entry.pw_gid]
    except KeyError:
        return [65534, 65534]


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _read_capped(path: Path, cap: int) -> str:
    with open(path, "rb") as f:
        data = f.read(cap + 1)
    text = data[:cap].decode("utf-8", "replace")
    return text + ("\n[output cut]" if len(data) > cap else "")


def _classify(returncode: int, verdict: list[str], nonce: str, timed_out: bool) -> tuple[str, str | None]:
    """The outcome from the exit status and the harness's lines (the first is its confinement report)."""
    if timed_out:
        return "timeout", None
    if returncode == 0 and f"passed {nonce}" in verdict:
        return "passed", None
    # The relays report a signal as 128 + its number, like a shell.
    if returncode < 0 or returncode > 128:
        return "killed", _signal_name(-returncode if returncode < 0 else returncode - 128)
    raised = [line[len("raised ") :] for line in verdict if line.startswith("raised ")]
    if raised:
        return ("failed" if raised[-1] == "AssertionError" else "error"), raised[-1]
    if returncode == 0:
        return "exit", "exited with code 0 before its code ran to its end"
    return "exit", f"exit code {returncode}"


class Sandbox:
    """Runs programs in confined processes; ``close`` kills whatever is still running."""

    def __init__(self, limits: Limits | None = None, *, workers: int | None = None) -> None:
        self.limits = limits or Limits()
        self.workers = max(1, workers or os.cpu_count() or 1)
        self._identity = _unprivileged_identity()
        self._hierarchies = cgroups.find()
        self._live: set[Run] = set()
        self._lock = threading.Lock()
        self._closed = False

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Kill every program still running, with all it started; no new program starts."""
        with self._lock:
            self._closed = True
        self._kill_live()

    def _kill_live(self) -> None:
        with self._lock:
            live = list(self._live)
        for run in live:
            run.kill()

    def run(self, program: str) -> Outcome:
        """Run one program (Python source) to completion or its timeout."""
        if self._closed:
            raise RuntimeError("the sandbox is closed")
        workdir = tempfile.mkdtemp(prefix="diffu-sandbox-")
        outdir = tempfile.mkdtemp(prefix="diffu-sandbox-out-")  # outside the program's reach
        budget = None
        if self._hierarchies:
            # Two more processes than the program's own: the outer process and the init.
            budget = cgroups.Budget(self._hierarchies, self.limits.memory_bytes, self.limits.processes + 2)
        try:
            return self._run_in(program, workdir, Path(outdir), budget)
        finally:
            for problem in (
                remove_tree(workdir),
                remove_tree(outdir),
                budget.remove() if budget is not None else None,
            ):
                if problem:
                    log.warning("sandbox cleanup: %s", problem)

    def _run_in(self, program: str, workdir: str, outdir: Path, budget: cgroups.Budget | None) -> Outcome:
        source = outdir / "program.py"
        source.write_text(program, encoding="utf-8")
        status_r, status_w = os.pipe()
        result_r, result_w = os.pipe()
        nonce_r, nonce_w = os.pipe()
        nonce = secrets.token_hex(16)
        os.write(nonce_w, nonce.encode())
        os.close(nonce_w)
        config = {
            "workdir": workdir,
            "source": str(source),
            "limits": self.limits.for_child(),
            "read_dirs": _read_dirs(),
            "identity": self._identity,
            "cgroups": budget.procs if budget is not None else [],
            "status_fd": status_w,
            "result_fd": result_w,
            "nonce_fd": nonce_r,
        }
        out_path, err_path = outdir / "stdout", outdir / "stderr"
        start = time.perf_counter()
        deadline = time.monotonic() + self.limits.timeout
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            try:
                proc = subprocess.Popen(
                    [sys.executable, "-I", str(CHILD), json.dumps(config)],
                    cwd=workdir,
                    env=_environment(workdir),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    pass_fds=(status_w, result_w, nonce_r),
                    start_new_session=True,
                )
            finally:
                for fd in (status_w, result_w, nonce_r):
                    os.close(fd)
            run = Run(proc, budget)
            with self._lock:
                self._live.add(run)
            timed_out = False
            try:
                report = _read_report(status_r, deadline)
                run.watch_init(report)
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                # Whatever it left behind goes too (a program's children, a fork bomb, a daemon).
                run.end()
                with self._lock:
                    self._live.discard(run)
        seconds = time.perf_counter() - start
        verdict = _read_verdict(result_r)
        isolation = _isolation(report, verdict, budget)
        stdout = _read_capped(out_path, self.limits.output_bytes)
        stderr = _read_capped(err_path, self.limits.output_bytes)
        state, error = _classify(proc.returncode, verdict[1:], nonce, timed_out)
        return Outcome(state, proc.returncode, error, seconds, stdout, stderr, isolation)

    def map(
        self, programs: Sequence[str], progress: Callable[[int], None] | None = None
    ) -> Iterator[Outcome]:
        """Run programs in parallel on ``workers`` processes; outcomes in the programs' order."""
        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            futures = [pool.submit(self.run, p) for p in programs]
            try:
                for fut in futures:
                    outcome = fut.result()
                    if progress:
                        progress(1)
                    yield outcome
            finally:
                for fut in futures:
                    fut.cancel()
                self._kill_live()


def _read_report(fd: int, deadline: float) -> dict[str, object]:
    """The outer process's one-line report (namespaces, work dir, init pid); {} if none came in time."""
    data = b""
    try:
        while not data.endswith(b"\n"):
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(fd)
    try:
        report = json.loads(data)
    except ValueError:
        return {}
    return report if isinstance(report, dict) else {}


def _read_verdict(fd: int, cap: int = 64 << 10) -> list[str]:
    """The harness's lines: its confinement report, then ``raised X`` or ``passed NONCE``. Read without
    blocking (every writer is gone by now, unless a program outlived its run without a PID namespace)."""
    os.set_blocking(fd, False)
    data = b""
    try:
        while len(data) < cap:
            chunk = os.read(fd, cap - len(data))
            if not chunk:
                break
            data += chunk
    except BlockingIOError:
        pass
    finally:
        os.close(fd)
    return data.decode("utf-8", "replace").splitlines()


def _isolation(report: dict, verdict: list[str], budget: cgroups.Budget | None) -> dict[str, object]:
    """What the kernel granted this run: the outer process's report, the program's (the first line of
    its verdict, written before the program's code ran) and the cgroups it joined."""
    isolation: dict[str, object] = {k: v for k, v in report.items() if k not in ("init_pid", "cgroups")}
    try:
        confined = json.loads(verdict[0]) if verdict else {}
    except ValueError:
        confined = {}
    if isinstance(confined, dict):
        isolation.update(confined)
    joined = report.get("cgroups") or []
    if budget is not None:
        isolation.update(budget.isolation(list(joined)))
    else:
        isolation.update(cgroup_memory=False, cgroup_pids=False, cgroup_kill=False)
    return isolation
