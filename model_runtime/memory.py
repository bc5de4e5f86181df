"""A process's resident memory, read without JAX (the runtime's program cache and the chat's goodbye)."""

from __future__ import annotations

import os


def resident_bytes(pid: int | str = "self") -> int | None:
    """The resident memory of process ``pid`` (Linux ``/proc/PID/statm``; None elsewhere, or when the
    process is gone)."""
    try:
        with open(f"/proc/{pid}/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None
