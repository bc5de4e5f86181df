"""Run untrusted Python programs (model-written code), each in a confined process tree.

Every program runs under ``assistant/evals/sandbox_child.py`` (see there for each step): in its own
network, PID, mount and IPC namespaces, as an unprivileged uid when the evaluator is root (``nobody``),
with no capability, a Landlock filesystem ruleset, a seccomp filter (no unix socket of its own, no nested
user namespace, no keyring), a session keyring of its own, an environment holding nothing of the user's,
and a size-capped tmpfs of its own (nosuid, noexec) as working directory, HOME and TMPDIR. Memory and
processes are counted for the whole run in cgroups of its own where the kernel lets the evaluator make
them (``assistant/evals/cgroups.py``), with per-process limits (address space, file size, processes,
open files, CPU seconds) in any case. Its configuration reaches it through a memfd and its output comes
back through pipes read as it runs (``assistant/evals/sandbox_io.py``): nothing of the run is a file on
the evaluator's disk.

The run ends everything it started (``assistant/evals/sandbox_cleanup.py``): at the program's end, its
timeout or when the evaluator closes the sandbox, the PID namespace's init is killed (so the kernel kills
the whole namespace) and the evaluator waits until it is gone; the run's cgroup is killed too where the
kernel has ``cgroup.kill``, and the process group in any case. Whatever the program leaves on disk is in
its tmpfs, which vanishes with its mount namespace (its SysV IPC objects with its IPC namespace); where
the kernel gives no mount namespace, its temporary directory is removed by a bounded walk that never
leaves it and never raises (a failure is a logged warning; the run's outcome stands).

Two ways to run a program. With ``calls`` (``Calls``: a function and its inputs, as data) the program's
code runs, then the function on each input, and the outputs come back as data (``Outcome.outputs``,
status ``returned``): the evaluator judges them (``assistant/evals/judge.py``). Without, the program holds
its own tests and passes when its code returned (the harness writes a marker with the run's token only
then, so ``sys.exit(0)``, ``os._exit(0)`` or a sabotaged error report fail). A hostile program (an
infinite loop, a fork bomb, a 20 GB allocation or file, killing its parent, reading the user's files,
connecting to the daemon) ends as one failed run; the caller carries on. Each result says which isolation
the kernel granted (``isolation``), so a report can state it.

The evaluation command (``diffu eval``) and the reinforcement-learning rewards use this module.
"""

from __future__ import annotations

import json
import logging
import os
import pwd
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from assistant.evals import cgroups, sandbox_io
from assistant.evals.sandbox_cleanup import Run, remove_tree

CHILD = Path(__file__).with_name("sandbox_child.py")
log = logging.getLogger("diffu.sandbox")


@dataclass(frozen=True)
class Limits:
    """A run's limits. ``timeout`` is HumanEval's 3 s by default.

    ``memory_bytes`` bounds the run's processes together where a memory cgroup is granted, and each
    process's address space in any case; ``processes`` likewise (a pids cgroup, and ``RLIMIT_NPROC``).
    ``disk_bytes`` and ``disk_files`` size the run's tmpfs (all its files together); ``file_bytes``
    bounds each file wherever it is, and each output stream (read on that far, then closed).
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
    result_bytes: int = 8 << 20  # a judged run's outputs, all together

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


@dataclass(frozen=True)
class Calls:
    """A judged run's work: the function the program must define, each call's input as data
    (``sandbox_values.encode([args, kwargs])``) and, per call, a conversion of its output or None
    (``sandbox_values.WRAPPERS``; none given: None for every call)."""

    function: str
    inputs: tuple[str, ...]
    wraps: tuple[str | None, ...] = ()

    def for_child(self) -> dict[str, object]:
        wraps = list(self.wraps) if self.wraps else [None] * len(self.inputs)
        return {"function": self.function, "inputs": list(self.inputs), "wraps": wraps}


@dataclass
class Outcome:
    """How one program ended.

    ``status``: ``passed`` (its code, tests included, ran to its end), ``returned`` (a judged run: every
    call returned, ``outputs`` holds the values), ``failed`` (an AssertionError, or an output that is not
    data), ``error`` (another exception, ``SystemExit`` included, named in ``error``), ``timeout``,
    ``killed`` (a signal: a CPU or file-size limit, the memory cgroup, or the program killing its own
    group) or ``exit`` (the process ended before its code did, without an exception: ``os._exit``, even
    with code 0). A judged run that stopped early keeps the outputs it sent.
    """

    status: str
    returncode: int | None
    error: str | None
    seconds: float
    stdout: str = ""
    stderr: str = ""
    isolation: dict[str, object] = field(default_factory=dict)
    outputs: list[Any] | None = None

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def _read_dirs() -> list[str]:
    """Directories the program may read: the Python installation this evaluator runs on."""
    dirs = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    return sorted(d for d in dirs if d)


# Nothing of the user's: no DIFFU_* settings, tokens, proxies or PYTHON* variables. HOME and TMPDIR are set
# by the child once it knows the program's directory (the process's first environment, which
# /proc/self/environ shows, names no directory of the evaluator's).
ENVIRONMENT = {
    "PATH": "/usr/bin:/bin",
    "HOME": "/",
    "TMPDIR": "/tmp",
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


def _user_namespace() -> str:
    """This process's user namespace (``user:[inode]``), or "" where /proc does not say: the child
    then leaves ``user.max_user_namespaces`` alone rather than risk setting the machine's."""
    try:
        return os.readlink("/proc/self/ns/user")
    except OSError:
        return ""


def _unencodable(program: str) -> str | None:
    """Why ``program`` cannot be handed to Python as UTF-8 text (a lone surrogate), or None."""
    try:
        program.encode("utf-8")
        return None
    except UnicodeEncodeError as exc:
        return f"UnicodeEncodeError: {exc.reason} at character {exc.start} (the program is not text)"


def _config_fd(config: dict[str, object]) -> int:
    """A memfd holding the run's configuration, read from its start by the child."""
    fd = os.memfd_create("diffu-sandbox-config", 0)
    data = json.dumps(config).encode()
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


class Sandbox:
    """Runs programs in confined processes; ``close`` kills whatever is still running."""

    def __init__(self, limits: Limits | None = None, *, workers: int | None = None) -> None:
        self.limits = limits or Limits()
        self.workers = max(1, workers or os.cpu_count() or 1)
        self._identity = _unprivileged_identity()
        self._hierarchies = cgroups.find()
        self._host_user_ns = _user_namespace()
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

    def run(self, program: str, calls: Calls | None = None) -> Outcome:
        """Run one program (Python source) to completion or its timeout; with ``calls``, its function
        on each input after its code (a judged run)."""
        if self._closed:
            raise RuntimeError("the sandbox is closed")
        unencodable = _unencodable(program)
        if unencodable is not None:
            return Outcome("error", None, unencodable, 0.0)
        workdir = tempfile.mkdtemp(prefix="diffu-sandbox-")
        budget = None
        if self._hierarchies:
            # Two more processes than the program's own: the outer process and the init.
            budget = cgroups.Budget(self._hierarchies, self.limits.memory_bytes, self.limits.processes + 2)
        try:
            return self._run_in(program, calls, workdir, budget)
        finally:
            for problem in (remove_tree(workdir), budget.remove() if budget is not None else None):
                if problem:
                    log.warning("sandbox cleanup: %s", problem)

    def _run_in(
        self, program: str, calls: Calls | None, workdir: str, budget: cgroups.Budget | None
    ) -> Outcome:
        limits = self.limits
        pipes = [os.pipe() for _ in range(4)]  # status, result, stdout, stderr
        (status_r, status_w), (result_r, result_w) = pipes[0], pipes[1]
        token = secrets.token_hex(16)
        config: dict[str, object] = {
            "workdir": workdir,
            "source": program,
            "token": token,
            "calls": None if calls is None else calls.for_child(),
            "limits": limits.for_child(),
            "read_dirs": _read_dirs(),
            "identity": self._identity,
            "host_user_ns": self._host_user_ns,
            "cgroups": budget.procs if budget is not None else [],
            "status_fd": status_w,
            "result_fd": result_w,
        }
        start = time.perf_counter()
        deadline = time.monotonic() + limits.timeout
        config_fd = _config_fd(config)
        try:
            # The evaluator's pid in the command line: ps shows whose run it is (tests count their own).
            proc = subprocess.Popen(
                [sys.executable, "-I", str(CHILD), str(config_fd), str(os.getpid())],
                cwd=workdir,
                env=ENVIRONMENT,
                stdin=subprocess.DEVNULL,
                stdout=pipes[2][1],
                stderr=pipes[3][1],
                pass_fds=(status_w, result_w, config_fd),
                start_new_session=True,
            )
        except BaseException:
            for r, _ in pipes:
                os.close(r)
            raise
        finally:
            for fd in (config_fd, *(w for _, w in pipes)):
                os.close(fd)
        status = sandbox_io.Stream(status_r, 64 << 10, 64 << 10)
        result = sandbox_io.Stream(result_r, limits.result_bytes, limits.result_bytes + 1)
        out, err = (sandbox_io.Stream(pipes[i][0], limits.output_bytes, limits.file_bytes) for i in (2, 3))
        streams = [status, result, out, err]
        run = Run(proc, budget)
        with self._lock:
            self._live.add(run)
        try:
            timed_out = not sandbox_io.pump(streams, proc, deadline, status, run.watch_init)
        finally:
            # Whatever it left behind goes too (a program's children, a fork bomb, a daemon).
            run.end()
            with self._lock:
                self._live.discard(run)
            sandbox_io.finish(streams)
        seconds = time.perf_counter() - start
        confined, found = sandbox_io.records(result, token)
        state, error, outputs = sandbox_io.classify(proc.returncode, found, timed_out, calls is not None)
        if result.cut:
            state, error = "failed", f"its outputs ran past {limits.result_bytes} bytes"
        isolation = sandbox_io.isolation(sandbox_io.report(status), confined, budget)
        return Outcome(state, proc.returncode, error, seconds, out.text(), err.text(), isolation, outputs)

    def map(
        self,
        programs: Sequence[str],
        progress: Callable[[int], None] | None = None,
        calls: Sequence[Calls | None] | None = None,
    ) -> Iterator[Outcome]:
        """Run programs in parallel on ``workers`` processes; outcomes in the programs' order. ``calls``
        (one per program, None for a program with its own tests) makes runs judged."""
        each = list(calls) if calls is not None else [None] * len(programs)
        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            futures = [pool.submit(self.run, p, c) for p, c in zip(programs, each, strict=True)]
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
