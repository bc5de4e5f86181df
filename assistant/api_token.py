"""The API token file (the config dir's ``token``, mode 0600): the daemon creates it, clients read it.

Below the server and the clients both, so a client finding its daemon's token imports no server code.
"""

from __future__ import annotations

import logging
import os
import secrets
from pathlib import Path

from assistant import paths
from assistant.errors import UsageError

log = logging.getLogger("diffu.security")


def load_or_create_token(path: Path | None = None) -> str:
    """The API token in ``path`` (the config dir's ``token``), created with mode 0600 on first use."""
    path = path or paths.token_file()
    paths.ensure_private_dir(path.parent)
    try:
        # O_EXCL: two daemons starting at once must not overwrite each other's token.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return read_token(path) or _replace_empty_token(path)
    token = secrets.token_urlsafe(32)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    log.info("created API token in %s", path)
    return token


def _replace_empty_token(path: Path) -> str:
    token = secrets.token_urlsafe(32)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    os.replace(tmp, path)
    return token


def read_token(path: Path | None = None) -> str | None:
    """The stored token, or None when there is none yet. Tightens a token file others can read."""
    path = path or paths.token_file()
    try:
        mode = path.stat().st_mode
        text = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:  # a directory there, a file we may not read, binary junk
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise UsageError(
            f"cannot read the API token {path} ({reason}); remove it to have a new one made, or set "
            "--api-key / DIFFU_API_KEY"
        ) from None
    if mode & 0o077:
        log.warning("token file %s was readable by others; setting its mode to 0600", path)
        os.chmod(path, 0o600)
    return text or None
