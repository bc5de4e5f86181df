"""The daemon's process: from a config to a served socket, and out again (``diffu serve`` calls :func:`run`).

Order of events: take the model's lock, bind the socket (so ``--port 0`` can print the real port at once),
publish the discovery file, then serve. The model loads in the engine thread while ``/health`` already
answers 503 with progress; it serves once loaded and compiles its programs between requests.
SIGTERM/SIGINT stop accepting connections, give in-flight requests ``shutdown_grace`` seconds, cancel the
rest, and remove the lock and discovery file (at once if the engine is inside a compile).

Over several hosts every host runs the same command, after joining the process group: process 0 is the
daemon above, its runtime wrapped in a ``Leader``; the others load their part of the model, repeat each
device call process 0 makes (``model_runtime.distributed``), and exit when it stops.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from assistant import api_token, discovery
from assistant.config import Config
from assistant.errors import UsageError
from assistant.server import security
from assistant.server.fake_runtime import is_fake_spec, load_fake
from assistant.server.logs import setup_logging
from assistant.server.scheduler import Loader
from model_runtime.interface import RuntimeProtocol

if TYPE_CHECKING:
    from model_runtime.distributed import Leader

log = logging.getLogger("diffu.serve")


def run(config: Config, *, notify_fd: int | None = None, multihost: bool = False) -> int:
    """Serve ``config.model`` until a signal; 0, or a UsageError saying why it could not serve.

    ``notify_fd``: where to report the listening address (``diffu daemon start`` and auto-start read it),
    and run without a terminal. ``multihost``: this process has joined a group of several.
    """
    if not config.model:
        raise UsageError("no model to serve: pass --model DIR (or set model in config.toml, or DIFFU_MODEL)")
    leaders: list[Leader] = []
    loader = make_loader(config)
    if multihost:
        import jax

        if jax.process_index() != 0:
            return _follow(config, loader)
        loader = _lead(loader, leaders)
    key = discovery.model_key(config.model)
    log_file = discovery.log_path(key)
    setup_logging(log_file, config.log_level_number, to_stderr=notify_fd is None)
    api_key = _api_key(config)
    lock = discovery.DaemonLock(config.model)
    lock.acquire()
    abandoned = False
    try:
        sock = _bind(config.host, config.port)
        _announce(config, key, log_file, sock, lock, notify_fd)
        fatal, abandoned = _serve(config, loader, api_key, sock, leaders)
    finally:
        lock.release()
        log.info("daemon exited; lock and discovery file removed")
    if fatal:
        raise UsageError(f"cannot serve {config.model}: {fatal}")
    if abandoned:
        _exit_now()
    return 0


def make_loader(config: Config) -> Loader:
    """The function the scheduler thread calls to load the runtime (JAX is imported there, not here)."""
    model = config.model
    if model is None:
        raise ValueError("no model configured")

    def load(progress: Callable[[str, float], None]) -> RuntimeProtocol:
        if is_fake_spec(model):
            return load_fake(
                model,
                progress=progress,
                max_context=config.max_context,
                length_buckets=config.length_buckets,
                batch_buckets=config.batch_buckets,
            )
        from model_runtime.loader import load

        return load(
            model,
            dtype=config.dtype,
            quantize=config.quantize,
            progress=progress,
            tp=config.tp,
            dp=config.dp,
            max_context=config.max_context,
            length_buckets=config.length_buckets,
            batch_buckets=config.batch_buckets,
            max_programs=config.max_programs,
        )

    return load


# -- several hosts --------------------------------------------------------------------------------------
def _lead(loader: Loader, leaders: list[Leader]) -> Loader:
    """Process 0's loader: its runtime publishes every device call to the followers (kept in ``leaders``
    to release them at the end)."""
    from model_runtime import distributed

    def lead(progress: Callable[[str, float], None]) -> RuntimeProtocol:
        leaders.append(distributed.Leader(loader(progress)))
        return leaders[-1]

    return lead


def _follow(config: Config, loader: Loader) -> int:
    """A process other than 0 of a multi-host daemon: load this host's shards, then follow process 0."""
    import jax

    from model_runtime import distributed
    from model_runtime.errors import DiffuError

    rank = jax.process_index()
    log_file = discovery.log_path(f"{discovery.model_key(config.model or '')}-process{rank}")
    setup_logging(log_file, config.log_level_number, to_stderr=True)
    log.info("process %d of %d: loading %s", rank, jax.process_count(), config.model)
    try:
        runtime = loader(lambda detail, fraction: log.debug("loading: %s (%.0f%%)", detail, 100 * fraction))
    except DiffuError as exc:
        raise UsageError(f"cannot serve {config.model}: {exc}") from None
    print(f"diffu serve: process {rank} follows process 0 (model {config.model})", flush=True)
    jobs = distributed.follow(runtime, log)
    log.info("process 0 stopped after %d jobs; process %d exits", jobs, rank)
    return 0


# -- the socket and who may use it ------------------------------------------------------------------------
def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        hint = " (is another server using it? pass --port 0 for a free port)" if exc.errno == 98 else ""
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror}{hint}") from None
    sock.listen(512)
    sock.set_inheritable(False)
    return sock


def _api_key(config: Config) -> str | None:
    """The token clients must send (None with auth off); warns about exposed or open daemons."""
    if not security.is_loopback(config.host):
        log.warning(
            "binding to %s: the model is reachable from other machines%s",
            config.host,
            "" if config.auth else " WITHOUT authentication",
        )
    if not config.auth:
        log.warning("authentication is off (--no-auth): any local program can use the daemon")
        return None
    return config.api_key or api_token.load_or_create_token()


def _announce(
    config: Config,
    key: str,
    log_file: Path,
    sock: socket.socket,
    lock: discovery.DaemonLock,
    notify_fd: int | None,
) -> None:
    """Publish the discovery file and tell whoever started us where we listen."""
    port = sock.getsockname()[1]
    # A wildcard bind is reached through loopback by local clients.
    url_host = {"0.0.0.0": "127.0.0.1", "::": "[::1]"}.get(config.host) or (
        f"[{config.host}]" if ":" in config.host else config.host
    )
    info = discovery.DaemonInfo(
        url=f"http://{url_host}:{port}",
        pid=os.getpid(),
        model=config.model or "",
        key=key,
        host=config.host,
        port=port,
        started=time.time(),
        log_file=str(log_file),
        auth=config.auth,
    )
    lock.publish(info)
    log.info("listening on %s (model %s, pid %d)", info.url, config.model, os.getpid())
    if notify_fd is not None:
        with os.fdopen(notify_fd, "w") as notify:
            notify.write(json.dumps(discovery.info_dict(info)) + "\n")
    else:
        print(f"diffu serve: listening on {info.url} (model {config.model})", flush=True)


# -- serving, and stopping --------------------------------------------------------------------------------
class _Terminated(Exception):
    """SIGTERM, raised after uvicorn's graceful shutdown so our cleanup runs (instead of dying on SIG_DFL)."""


def _on_sigterm(signum: int, frame: Any) -> None:
    del signum, frame
    raise _Terminated


def _serve(
    config: Config, loader: Loader, api_key: str | None, sock: socket.socket, leaders: list[Leader]
) -> tuple[str | None, bool]:
    """Run uvicorn on ``sock`` until a signal or a fatal load error; returns that error, if any, and
    whether the device thread was left inside a compile it cannot leave (``Scheduler.abandoned``)."""
    import uvicorn

    from assistant.server.http.app import HttpApp
    from assistant.server.http.transport import guarded_protocol

    fatal: list[str] = []
    server: uvicorn.Server | None = None

    def on_fatal(message: str) -> None:
        fatal.append(message)
        if server is not None:
            server.should_exit = True  # read by uvicorn's main loop; starts the normal shutdown

    app = HttpApp(config, loader=loader, on_fatal=on_fatal)
    uv_config = uvicorn.Config(
        app.app(api_key=api_key),
        lifespan="on",
        log_config=None,
        access_log=True,
        server_header=False,
        ws="none",
        # uvicorn waits this many seconds (a float works though its annotation says int).
        timeout_graceful_shutdown=max(config.shutdown_grace, 0.1),  # type: ignore[arg-type]
        http=guarded_protocol(config.read_timeout, config.max_connections, api_key),
    )
    server = uvicorn.Server(uv_config)
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        server.run(sockets=[sock])
        # uvicorn handles SIGINT/SIGTERM itself and may return normally (re-raising the signal only in
        # some versions and timings); the only other way out of its loop is a fatal load error.
        if not fatal and server.should_exit:
            log.info("stopped by signal")
    except (_Terminated, KeyboardInterrupt):
        log.info("stopped by signal")
    finally:
        signal.signal(signal.SIGTERM, previous)
        sock.close()
        for leader in leaders:
            leader.shutdown()
    abandoned = app.scheduler is not None and app.scheduler.abandoned
    return (fatal[0] if fatal else None), abandoned


def _exit_now() -> None:
    """Exit 0 at once, without finalizing the interpreter.

    Stopped while its device thread is inside an XLA compile (or the model load), the daemon has no way
    to interrupt it; finalizing would then kill that thread inside XLA's C++ code, which aborts the
    process ("terminate called after throwing an instance of ''", exit 134) after waiting for it. Every
    file is closed and the lock released by now; only the flushing of logs and output is left.
    """
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(0)
