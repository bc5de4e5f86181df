"""Starting a daemon in the background and stopping one: the client's side of a daemon's life (the
lock and discovery file the daemon publishes, and finding it through them, are ``assistant.discovery``).
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from assistant import paths
from assistant.discovery import DaemonError, DaemonInfo, find_daemon, model_key, pid_alive, remove_stale

START_TIMEOUT = 120.0  # seconds for a spawned daemon to bind its port (model loading comes after)


def output_path(key: str) -> Path:
    """stdout/stderr of a background daemon: the place tracebacks land before logging is set up."""
    return paths.log_dir() / f"{key}.out"


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
