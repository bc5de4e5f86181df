"""Daemon lifecycle: the per-model lock and discovery file, background start, stop, and stale detection.

A running daemon holds an exclusive ``flock`` on ``<runtime dir>/<key>.lock`` for its whole life and
describes itself in ``<key>.json`` (url, pid, model). The kernel drops the lock when the process dies, even
on ``kill -9``, so "the lock can be taken" is the reliable test for a stale discovery file; a dead pid is
the quick one. ``<key>`` is derived from the model, so one user has at most one daemon per model.

Nothing here imports JAX or the server: clients use it to find or start a daemon.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from assistant import __version__, paths
from assistant.errors import UsageError

START_TIMEOUT = 120.0  # seconds for a spawned daemon to bind its port (model loading comes after)


class DaemonError(UsageError):
    """A daemon could not be started, found or stopped; the message says why."""


class AlreadyRunning(DaemonError):
    def __init__(self, info: DaemonInfo) -> None:
        super().__init__(
            f"a diffu daemon for {info.model} is already running at {info.url} "
            f"(pid {info.pid}); stop it with 'diffu daemon stop'"
        )
        self.info = info


@dataclass(frozen=True)
class DaemonInfo:
    """The contents of a discovery file."""

    url: str
    pid: int
    model: str
    key: str
    host: str
    port: int
    started: float
    log_file: str
    auth: bool = True
    version: str = __version__

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"

    @classmethod
    def from_file(cls, path: Path) -> DaemonInfo | None:
        """The info in ``path``, or None if it is missing, unreadable or not ours (half-written, planted)."""
        if not paths.owned_by_me(path):
            return None
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})
        except (OSError, ValueError, TypeError):
            return None


def canonical_model(model: str) -> str:
    """The same model named two ways (``./m``, ``/abs/m``) must map to one daemon."""
    if model.startswith("fake"):
        return model
    path = Path(model).expanduser()
    return str(path.resolve()) if path.exists() else model


def model_key(model: str) -> str:
    """A file-name-safe key per model: readable slug plus a short hash of the canonical name."""
    canon = canonical_model(model)
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(canon.rstrip("/")).name or canon)[:40] or "model"
    return f"{slug}-{hashlib.sha256(canon.encode()).hexdigest()[:10]}"


def discovery_path(key: str) -> Path:
    return paths.runtime_dir() / f"{key}.json"


def lock_path(key: str) -> Path:
    return paths.runtime_dir() / f"{key}.lock"


def log_path(key: str) -> Path:
    return paths.log_dir() / f"{key}.log"


def output_path(key: str) -> Path:
    """stdout/stderr of a background daemon: the place tracebacks land before logging is set up."""
    return paths.log_dir() / f"{key}.out"


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, but belongs to someone else
        return True
    return True


def lock_held(key: str) -> bool:
    """Whether some process holds the daemon lock of ``key`` (we probe with a non-blocking flock)."""
    try:
        fd = os.open(lock_path(key), os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return True
        raise
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def is_live(info: DaemonInfo) -> bool:
    return pid_alive(info.pid) and lock_held(info.key)


class DaemonLock:
    """Held by a serving process: the model's lock plus its discovery file, removed on release."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.key = model_key(model)
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock, or raise AlreadyRunning with the live daemon's info."""
        paths.ensure_private_dir(paths.runtime_dir())
        fd = os.open(lock_path(self.key), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            info = DaemonInfo.from_file(discovery_path(self.key))
            if info is None:  # the holder has not written its discovery file yet
                raise DaemonError(
                    f"a diffu daemon for {self.model} is starting; try again in a moment"
                ) from None
            raise AlreadyRunning(info) from None
        os.set_inheritable(fd, False)
        self._fd = fd
        # We own the lock, so any discovery file left here is from a dead daemon.
        with contextlib.suppress(FileNotFoundError):
            discovery_path(self.key).unlink()

    def publish(self, info: DaemonInfo) -> None:
        """Write the discovery file atomically (readers never see half a file), mode 0600."""
        path = discovery_path(self.key)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(info.to_json())
        os.replace(tmp, path)

    def release(self) -> None:
        if self._fd is None:
            return
        with contextlib.suppress(FileNotFoundError):
            discovery_path(self.key).unlink()
        with contextlib.suppress(FileNotFoundError):
            lock_path(self.key).unlink()
        os.close(self._fd)  # closing drops the flock
        self._fd = None


def running_daemons(*, clean: bool = True) -> list[DaemonInfo]:
    """Live daemons of this user, newest first; stale discovery files are removed when ``clean``."""
    root = paths.runtime_dir()
    if not root.is_dir():
        return []
    paths.ensure_private_dir(root)
    found = []
    for path in sorted(root.glob("*.json")):
        info = DaemonInfo.from_file(path)
        if info is None:
            continue
        if is_live(info):
            found.append(info)
        elif clean:
            remove_stale(info)
    return sorted(found, key=lambda i: i.started, reverse=True)


def remove_stale(info: DaemonInfo) -> None:
    """Remove the files of a daemon that died without cleaning up (kill -9, crash, power loss)."""
    if lock_held(info.key):
        return
    for path in (discovery_path(info.key), lock_path(info.key)):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def find_daemon(model: str | None) -> DaemonInfo | None:
    """The live daemon serving ``model``; with no model, the most recently started one."""
    if model is not None:
        key = model_key(model)
        info = DaemonInfo.from_file(discovery_path(key))
        if info is None:
            return None
        if is_live(info):
            return info
        remove_stale(info)
        return None
    daemons = running_daemons()
    return daemons[0] if daemons else None


def start_background(
    model: str,
    *,
    host: str,
    port: int,
    extra_args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    timeout: float = START_TIMEOUT,
) -> DaemonInfo:
    """Spawn ``diffu serve`` detached, and return once it listens (the model then loads in the background).

    The child reports its URL through an inherited pipe as soon as its socket is bound, so we wait on a
    read instead of polling for the discovery file. Secrets travel in the environment, never in argv
    (``ps`` shows argv to every user).
    """
    key = model_key(model)
    paths.ensure_private_dir(paths.log_dir())
    r, w = os.pipe()
    cmd = [
        sys.executable,
        "-m",
        "assistant.cli",
        "serve",
        "--model",
        model,
        "--host",
        host,
        "--port",
        str(port),
        "--notify-fd",
        str(w),
        *extra_args,
    ]
    # Only this user may read the daemon's output (it can hold prompts); handed to the child, closed here.
    out = os.fdopen(os.open(output_path(key), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab")
    try:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            pass_fds=(w,),
            start_new_session=True,
            env=env,
            close_fds=True,
        )
    finally:
        out.close()
        os.close(w)
    try:
        ready, _, _ = select.select([r], [], [], timeout)
        line = os.read(r, 65536).decode() if ready else ""
    finally:
        os.close(r)
    if line.strip():
        try:
            return DaemonInfo(**json.loads(line))
        except (ValueError, TypeError) as exc:
            raise DaemonError(f"the daemon sent an unreadable start notice: {line!r} ({exc})") from None
    # No notice: the child exited (perhaps losing a start race to another daemon) or hung.
    try:
        code = proc.wait(timeout=5 if ready else 0.5)
    except subprocess.TimeoutExpired:
        proc.terminate()
        raise DaemonError(
            f"the daemon did not start listening within {timeout:.0f}s; see {output_path(key)}"
        ) from None
    winner = find_daemon(model)
    if winner is not None:
        return winner
    tail = tail_lines(output_path(key), 15)
    raise DaemonError(f"the daemon exited with code {code} before listening:\n{tail}".rstrip())


def stop_daemon(info: DaemonInfo, *, timeout: float = 30.0) -> bool:
    """SIGTERM the daemon and wait for it to exit; True if it is gone. Escalates only to SIGTERM."""
    try:
        os.kill(info.pid, signal.SIGTERM)
    except ProcessLookupError:
        remove_stale(info)
        return True
    if wait_exit(info.pid, timeout):
        remove_stale(info)
        return True
    return False


def wait_exit(pid: int, timeout: float) -> bool:
    """Wait for a (non-child) process to exit: a pidfd becomes readable when it does (Linux >= 5.3)."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    except (AttributeError, OSError):
        pidfd = None
    if pidfd is not None:
        try:
            ready, _, _ = select.select([pidfd], [], [], timeout)
            return bool(ready)
        finally:
            os.close(pidfd)
    # Without pidfds there is no event to wait on; check a few times a second.
    deadline = time.monotonic() + timeout
    while pid_alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def tail_lines(path: Path, n: int) -> str:
    """The last ``n`` lines of a text file ('' if it does not exist)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            data = f.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(data.splitlines()[-n:])


def info_dict(info: DaemonInfo) -> dict[str, Any]:
    return asdict(info)
