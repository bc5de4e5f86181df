"""Run untrusted Python programs (model-written code and its tests), each in a confined process.

Every program gets its own process started from ``assistant/evals/sandbox_child.py`` (see there for how it
confines itself): a new session and process group, a fresh empty temporary directory as working
directory, HOME and TMPDIR (removed afterwards), an environment holding nothing of the user's, limits on
wall-clock and CPU time, address space, file size, processes and open files, no network where the kernel
allows a new network namespace, and a Landlock filesystem ruleset where the kernel has one. Output is
written to files the file-size limit bounds and read back capped. On a timeout, or when the evaluator
closes the sandbox, the program's whole process group is killed.

A hostile program (an infinite loop, a fork bomb, a 20 GB allocation or file, killing its parent, reading
the user's files, connecting to the daemon) ends as one failed run; the caller carries on. Each result
says which isolation the kernel granted (``isolation``), so a report can state it.

The evaluation command (``diffu eval``) and the reinforcement-learning rewards use this module.
"""

from __future__ import annotations

import json
import os
import shutil
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

CHILD = Path(__file__).with_name("sandbox_child.py")
ERROR_MARK = "diffu-sandbox-error: "


@dataclass(frozen=True)
class Limits:
    """Per-program limits. ``timeout`` is HumanEval's 3 s by default."""

    timeout: float = 3.0
    cpu_seconds: int | None = None  # default: the timeout rounded up, plus one
    memory_bytes: int = 2 << 30
    file_bytes: int = 64 << 20
    processes: int = 64
    open_files: int = 256
    output_bytes: int = 16 << 10  # captured stdout/stderr kept per stream

    def for_child(self) -> dict[str, int]:
        cpu = self.cpu_seconds if self.cpu_seconds is not None else int(self.timeout) + 2
        return {
            "cpu_seconds": cpu,
            "memory_bytes": self.memory_bytes,
            "file_bytes": self.file_bytes,
            "processes": self.processes,
            "open_files": self.open_files,
        }


@dataclass
class Outcome:
    """How one program ended.

    ``status``: ``passed`` (exit code 0), ``failed`` (an AssertionError), ``error`` (another exception,
    named in ``error``), ``timeout``, ``killed`` (a signal: a CPU or file-size limit, or the program
    killing its own group) or ``exit`` (a non-zero exit without an exception).
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
    # Nothing of the user's: no DIFFU_* settings, tokens, proxies or PYTHON* variables.
    return {
        "PATH": "/usr/bin:/bin",
        "HOME": workdir,
        "TMPDIR": workdir,
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONHASHSEED": "0",
    }


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


def _classify(returncode: int, stderr: str, timed_out: bool) -> tuple[str, str | None]:
    if timed_out:
        return "timeout", None
    if returncode == 0:
        return "passed", None
    # The PID-namespace relay reports a signal as 128 + its number, like a shell.
    if returncode < 0 or returncode > 128:
        return "killed", _signal_name(-returncode if returncode < 0 else returncode - 128)
    tail = stderr.rstrip().rsplit("\n", 1)[-1]
    if tail.startswith(ERROR_MARK):
        error = tail[len(ERROR_MARK) :].strip()
        return ("failed" if error == "AssertionError" else "error"), error
    return "exit", f"exit code {returncode}"


class Sandbox:
    """Runs programs in confined processes; ``close`` kills whatever is still running."""

    def __init__(self, limits: Limits | None = None, *, workers: int | None = None) -> None:
        self.limits = limits or Limits()
        self.workers = max(1, workers or os.cpu_count() or 1)
        self._live: set[subprocess.Popen] = set()
        self._lock = threading.Lock()
        self._closed = False

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Kill the process group of every program still running; no new program starts."""
        with self._lock:
            self._closed = True
        self._kill_live()

    def _kill_live(self) -> None:
        with self._lock:
            live = list(self._live)
        for proc in live:
            _kill_group(proc)

    def run(self, program: str) -> Outcome:
        """Run one program (Python source) to completion or its timeout."""
        if self._closed:
            raise RuntimeError("the sandbox is closed")
        workdir = tempfile.mkdtemp(prefix="diffu-sandbox-")
        outdir = tempfile.mkdtemp(prefix="diffu-sandbox-out-")  # outside the program's reach
        try:
            return self._run_in(program, workdir, Path(outdir))
        finally:
            shutil.rmtree(workdir, onerror=_force_remove)
            shutil.rmtree(outdir, ignore_errors=True)

    def _run_in(self, program: str, workdir: str, outdir: Path) -> Outcome:
        source = Path(workdir) / "program.py"
        source.write_text(program, encoding="utf-8")
        status_r, status_w = os.pipe()
        config = {
            "workdir": workdir,
            "program": str(source),
            "limits": self.limits.for_child(),
            "read_dirs": _read_dirs(),
            "status_fd": status_w,
        }
        out_path, err_path = outdir / "stdout", outdir / "stderr"
        start = time.perf_counter()
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            try:
                proc = subprocess.Popen(
                    [sys.executable, "-I", str(CHILD), json.dumps(config)],
                    cwd=workdir,
                    env=_environment(workdir),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    pass_fds=(status_w,),
                    start_new_session=True,
                )
            finally:
                os.close(status_w)
            with self._lock:
                self._live.add(proc)
            timed_out = False
            try:
                proc.wait(timeout=self.limits.timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                # Whatever it left behind in its group goes too (a program's children, a fork bomb).
                _kill_group(proc)
                proc.wait()
                _wait_group_gone(proc.pid)
                with self._lock:
                    self._live.discard(proc)
        seconds = time.perf_counter() - start
        with os.fdopen(status_r, "r") as status:
            line = status.readline()
        isolation = json.loads(line) if line.strip() else {}
        stdout = _read_capped(out_path, self.limits.output_bytes)
        stderr = _read_capped(err_path, self.limits.output_bytes)
        state, error = _classify(proc.returncode, stderr, timed_out)
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


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _wait_group_gone(pgid: int, timeout: float = 5.0) -> None:
    """Killed processes die asynchronously (a fork bomb's many children): wait until none is left."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.02)


def _force_remove(func: Callable, path: str, exc: object) -> None:
    """A program may leave directories without write permission; make them removable and retry."""
    try:
        os.chmod(os.path.dirname(path), 0o700)
        if os.path.isdir(path):
            os.chmod(path, 0o700)
        func(path)
    except OSError:
        pass
