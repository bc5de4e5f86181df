"""Ending a sandboxed run and removing what it left (``assistant.evals.sandbox`` runs the programs).

A run's processes end through :class:`Run`: its init is killed by a pidfd, after which the kernel kills
the whole PID namespace; without one, the run's cgroup and its process group are killed, and the
evaluator waits until they are gone. Its directories go through :func:`remove_tree`, a bounded walk that
never leaves the directory it was given and never raises.
"""

from __future__ import annotations

import os
import select
import signal
import stat
import subprocess
import threading
import time
from pathlib import Path

from assistant.evals import cgroups


class Run:
    """One running program: its outer process, its init (by pidfd) and its cgroups; ``kill`` ends all."""

    def __init__(self, proc: subprocess.Popen, budget: cgroups.Budget | None) -> None:
        self.proc = proc
        self.budget = budget
        self.pidfd: int | None = None
        self._lock = threading.Lock()

    def watch_init(self, report: dict[str, object]) -> None:
        """Hold the init by a pidfd, so that killing it and waiting for it cannot hit a reused pid."""
        pid = report.get("init_pid")
        if not isinstance(pid, int) or not report.get("pid_ns"):
            return  # without a PID namespace, killing the init would not end the program
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            return
        # The init could have ended and its pid been reused before the pidfd was opened: only a child of
        # our outer process is the init (the outer forks nothing else).
        try:
            ours = f"\nPPid:\t{self.proc.pid}\n" in Path(f"/proc/{pid}/status").read_text()
        except OSError:
            ours = False
        if not ours:
            os.close(fd)
            return
        with self._lock:
            self.pidfd = fd

    def kill(self) -> None:
        """Kill the run: its init, after which the kernel kills the whole PID namespace and the outer
        process reaps the init and exits; without one, its cgroup and its process group."""
        with self._lock:
            if self.pidfd is not None:
                try:
                    signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
                    return
                except OSError:
                    pass
        if self.budget is not None:
            self.budget.kill()
        _kill_group(self.proc)

    def end(self) -> None:
        """Kill what is left of the run and wait until it is gone: the outer process, the init (which the
        kernel ends only after every other process of its namespace) and the process group."""
        self.kill()
        try:
            self.proc.wait(timeout=2.0)  # the outer process reaps the killed init, then exits
        except subprocess.TimeoutExpired:
            pass
        _kill_group(self.proc)
        self.proc.wait()
        with self._lock:
            fd, self.pidfd = self.pidfd, None
        if fd is not None:
            try:
                select.select([fd], [], [], 10.0)
            finally:
                os.close(fd)
        _wait_group_gone(self.proc.pid)


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


def remove_tree(root: str, *, max_entries: int = 200_000, seconds: float = 20.0) -> str | None:
    """Remove the directory ``root`` and everything in it; never raises. None, or what was left and why.

    Iterative (a program may nest directories thousands deep) and bounded (``max_entries`` removals,
    ``seconds``). Every step is relative to a descriptor of a directory inside ``root``, opened without
    following symlinks, and a step back up checks that it lands where it came from: a symlink, or a
    directory a leftover process renamed meanwhile, never leads it above ``root``. The only modes it
    changes are those of directories inside ``root`` (and ``root``), made writable to empty them.
    """
    deadline = time.monotonic() + seconds
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    try:
        fd = os.open(root, flags)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot open {root}: {exc.strerror}"
    trail: list[tuple[str, tuple[int, int]]] = []  # (name, (dev, ino) of the directory holding it)
    removed = 0
    try:
        _writable_dir(fd)
        while True:
            if removed >= max_entries or time.monotonic() > deadline:
                return f"gave up on {root} after removing {removed} entries"
            names = _some_entries(fd)
            subdir = None
            for name, is_dir in names:
                if is_dir:
                    subdir = name
                    break
                os.unlink(name, dir_fd=fd)
                removed += 1
            if subdir is not None:
                here = os.fstat(fd)
                child = _enter(subdir, fd)
                os.close(fd)
                fd = child
                trail.append((subdir, (here.st_dev, here.st_ino)))
                _writable_dir(fd)
            elif not names:
                if not trail:
                    break
                name, (dev, ino) = trail.pop()
                parent = os.open("..", flags, dir_fd=fd)
                os.close(fd)
                fd = parent
                up = os.fstat(fd)
                if (up.st_dev, up.st_ino) != (dev, ino):
                    return f"left {root}: a directory in it moved while it was being removed"
                os.rmdir(name, dir_fd=fd)
                removed += 1
    except OSError as exc:
        return f"could not remove everything in {root}: {exc.strerror} ({removed} entries removed)"
    finally:
        os.close(fd)
    try:
        os.rmdir(root)
    except OSError as exc:
        return f"could not remove {root}: {exc.strerror}"
    return None


def _enter(name: str, dir_fd: int) -> int:
    """Open the directory ``name`` in ``dir_fd`` (never through a symlink), opening up its mode first
    when it has none for us: by a path-only descriptor of that very directory, not by its name."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    try:
        return os.open(name, flags, dir_fd=dir_fd)
    except PermissionError:
        pass
    handle = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
    try:
        os.chmod(f"/proc/self/fd/{handle}", 0o700)
        return os.open(".", os.O_RDONLY | os.O_DIRECTORY, dir_fd=handle)
    finally:
        os.close(handle)


def _writable_dir(fd: int) -> None:
    """A program may leave directories without write or search permission; open them up (ours)."""
    try:
        if stat.S_IMODE(os.fstat(fd).st_mode) & 0o700 != 0o700:
            os.fchmod(fd, 0o700)
    except OSError:
        pass


def _some_entries(fd: int, batch: int = 1024) -> list[tuple[str, bool]]:
    """Up to ``batch`` entries of the directory ``fd`` (name, is a directory, symlinks not followed)."""
    entries = []
    with os.scandir(fd) as it:
        for entry in it:
            entries.append((entry.name, entry.is_dir(follow_symlinks=False)))
            if len(entries) >= batch:
                break
    return entries
