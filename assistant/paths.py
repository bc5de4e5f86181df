"""Where diffu keeps its files: the platformdirs directories, each overridable by an environment variable.

``DIFFU_CONFIG_DIR`` (config.toml, the API token), ``DIFFU_RUNTIME_DIR`` (daemon discovery files and locks)
and ``DIFFU_LOG_DIR`` (daemon logs) win over platformdirs, which itself honours the XDG variables. Tests
point all three at temporary directories so that they never touch the user's real state.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import platformdirs

from assistant.errors import UsageError

APP_NAME = "diffu"


def _override(var: str) -> Path | None:
    value = os.environ.get(var)
    return Path(value).expanduser() if value else None


def config_dir() -> Path:
    """The user's diffu config directory (``config.toml``, ``token``)."""
    return _override("DIFFU_CONFIG_DIR") or Path(platformdirs.user_config_dir(APP_NAME))


def runtime_dir() -> Path:
    """Per-user runtime state: discovery files and locks of running daemons.

    ``$XDG_RUNTIME_DIR/diffu`` when ``XDG_RUNTIME_DIR`` names a directory of this user's that only they
    can use (mode 0700, as the XDG spec requires), else ``/tmp/runtime-$UID/diffu``. Decided here from the
    environment alone, the same way every time: platformdirs (4.14) validates the variable itself and may
    answer differently between two calls (before and after the directory exists), which once put a
    daemon's lock and its discovery file in different places. :func:`ensure_private_dir` creates the
    directory for this user only and refuses one someone else owns.
    """
    override = _override("DIFFU_RUNTIME_DIR")
    if override:
        return override
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and _usable_runtime_root(Path(xdg)):
        return Path(xdg) / APP_NAME
    return Path(tempfile.gettempdir()) / f"runtime-{os.getuid()}" / APP_NAME


def _usable_runtime_root(path: Path) -> bool:
    try:
        st = path.stat()
    except OSError:
        return False
    return path.is_dir() and st.st_uid == os.getuid() and not st.st_mode & 0o077


def log_dir() -> Path:
    """The daemon's log directory."""
    return _override("DIFFU_LOG_DIR") or Path(platformdirs.user_log_dir(APP_NAME))


def config_file() -> Path:
    return config_dir() / "config.toml"


def token_file() -> Path:
    return config_dir() / "token"


class UnsafeDirectory(UsageError, PermissionError):
    """A diffu directory belongs to another user: trusting it would hand them our token."""


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` (and parents) for this user only; returns it.

    A directory someone else created first (``/tmp/runtime-$UID`` is guessable) is refused: its owner
    could plant a discovery file pointing clients, and their token, at a server of theirs.
    """
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        st = path.stat()
    except OSError as exc:
        # A read-only parent, or a file where the directory should be (DIFFU_LOG_DIR=/some/file).
        raise UsageError(
            f"cannot use {path} as a directory ({exc.strerror}); point DIFFU_CONFIG_DIR, "
            "DIFFU_RUNTIME_DIR or DIFFU_LOG_DIR at a writable directory of yours"
        ) from None
    if not path.is_dir():
        raise UsageError(f"{path} is not a directory; point the DIFFU_*_DIR variable at a directory")
    if st.st_uid != os.getuid():
        raise UnsafeDirectory(
            f"{path} belongs to another user (uid {st.st_uid}); refusing to use it "
            "(set DIFFU_RUNTIME_DIR / DIFFU_CONFIG_DIR to a directory of yours)"
        )
    if st.st_mode & 0o077:
        path.chmod(0o700)
    return path


def owned_by_me(path: Path) -> bool:
    """Whether ``path`` belongs to this user (files others planted are ignored)."""
    try:
        return path.stat().st_uid == os.getuid()
    except FileNotFoundError:
        return False
