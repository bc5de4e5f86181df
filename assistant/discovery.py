"""What a running daemon publishes about itself, and how it is found: the per-model lock and discovery
file, and stale detection.

A running daemon holds an exclusive ``flock`` on ``<runtime dir>/<key>.lock`` for its whole life and
describes itself in ``<key>.json`` (url, pid, model). The kernel drops the lock when the process dies, even
on ``kill -9``, so "the lock can be taken" is the reliable test for a stale discovery file; a dead pid is
the quick one. ``<key>`` is derived from the model, so one user has at most one daemon per model.

The daemon writes these files (``assistant.server.bootstrap``) and the clients read them, so they live
here, below both, free of JAX, HTTP and the server; starting and stopping a daemon in the background is
the client's (``assistant.client.spawn``).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from assistant import __version__, paths
from assistant.errors import UsageError


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


def info_dict(info: DaemonInfo) -> dict[str, Any]:
    return asdict(info)
