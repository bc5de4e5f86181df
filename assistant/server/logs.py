"""The daemon's logging: a rotating file only its user can read, and access lines that never carry a
token sent in the query string."""

from __future__ import annotations

import io
import logging
import logging.handlers
import os
import re
import sys
from pathlib import Path

from assistant.errors import UsageError
from assistant.paths import ensure_private_dir


def setup_logging(log_file: Path, level: int, *, to_stderr: bool) -> None:
    """Log to a rotating file (5 x 5 MB) and, in the foreground, to stderr too."""
    ensure_private_dir(log_file.parent)
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        file_handler = _PrivateLogFile(log_file, maxBytes=5 * 1024 * 1024, backupCount=5, encoding="utf-8")
    except OSError as exc:
        raise UsageError(
            f"cannot write the log file {log_file} ({exc.strerror}); set DIFFU_LOG_DIR"
        ) from None
    handlers: list[logging.Handler] = [file_handler]
    if to_stderr:
        handlers.append(logging.StreamHandler(sys.stderr))
    root = logging.getLogger()
    for handler in handlers:
        handler.setFormatter(fmt)
        root.addHandler(handler)
    root.setLevel(level)
    access = logging.getLogger("uvicorn.access")
    access.setLevel(max(level, logging.INFO))
    access.addFilter(_redact_secrets)
    # JAX logs each backend it cannot start ("Unable to initialize backend 'tpu'", 'cuda' ...) at INFO on
    # every machine without that accelerator: noise in every log, unless debugging.
    logging.getLogger("jax._src.xla_bridge").setLevel(max(level, logging.WARNING))


class _PrivateLogFile(logging.handlers.RotatingFileHandler):
    """Log files only this user can read (requests, prompts and paths are in them), rotated ones too."""

    def _open(self) -> io.TextIOWrapper:
        fd = os.open(self.baseFilename, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.fchmod(fd, 0o600)  # a file from an older version may have been created 0644
        return os.fdopen(fd, "a", encoding=self.encoding)


_SECRET_QUERY = re.compile(r"((?:api[_-]?key|token|access_token|key)=)[^&\s]*", re.IGNORECASE)


def _redact_secrets(record: logging.LogRecord) -> bool:
    """Access-log lines never carry a token sent in the query string (``?api_key=...``)."""
    if isinstance(record.args, tuple) and len(record.args) >= 3 and isinstance(record.args[2], str):
        args = list(record.args)
        args[2] = _SECRET_QUERY.sub(r"\1[redacted]", str(args[2]))
        record.args = tuple(args)
    return True
