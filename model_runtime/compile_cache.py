"""JAX's persistent compilation cache in the platformdirs cache directory, and counters over it.

With the cache on, a second process that compiles the same step program for the same shapes loads the
executable from disk instead of running XLA again. The counters let the engine report how many programs
it really compiled (``compiled_programs``) and how many it loaded (``cache_hits``).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import jax
import platformdirs

_lock = threading.Lock()
_counts = {"requests": 0, "hits": 0}
_enabled_dir: Path | None = None
_backend_threads: frozenset[int] | None = None


def default_cache_dir() -> Path:
    override = os.environ.get("DIFFU_JAX_CACHE_DIR")
    if override:
        return Path(override).expanduser()
    return Path(platformdirs.user_cache_dir("diffu")) / "jax"


def _listener(event: str, **_: object) -> None:
    if event == "/jax/compilation_cache/compile_requests_use_cache":
        with _lock:
            _counts["requests"] += 1
    elif event == "/jax/compilation_cache/cache_hits":
        with _lock:
            _counts["hits"] += 1


def enable(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Turn the persistent cache on (idempotent); every program is cached, however quick to compile."""
    global _enabled_dir
    path = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    if _enabled_dir == path:
        return path
    path.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    if _enabled_dir is None:
        jax.monitoring.register_event_listener(_listener)
        _note_backend_threads()
    _enabled_dir = path
    return path


def _note_backend_threads() -> None:
    """Start JAX's backend and note its threads, before this process compiles anything (the first
    runtime's load): the threads outside Python started after them are XLA's compile threads."""
    global _backend_threads
    if _backend_threads is not None:
        return
    jax.devices()
    try:
        _backend_threads = frozenset(int(tid) for tid in os.listdir("/proc/self/task"))
    except OSError:  # not Linux: nothing is known
        _backend_threads = frozenset()


def backend_threads() -> frozenset[int]:
    """The native threads this process had once JAX's backend started, before the first runtime compiled
    (Linux; empty elsewhere or before :func:`enable`). Where the process compiled before that (a test
    process), XLA's compile threads are among them and cannot be told apart."""
    return _backend_threads or frozenset()


def counters() -> tuple[int, int]:
    """(compile requests that consulted the cache, of which hits) since the process started."""
    with _lock:
        return _counts["requests"], _counts["hits"]
