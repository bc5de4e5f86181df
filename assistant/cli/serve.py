"""``diffu serve``: run the daemon in the foreground (``diffu daemon start`` runs this detached).

Order of events: read the config, take the model's lock, bind the socket (so ``--port 0`` can print the
real port at once), publish the discovery file, then serve. The model loads in the engine thread while
``/health`` already answers 503 with progress; it serves once loaded and compiles its programs between
requests. SIGTERM/SIGINT stop accepting connections, give in-flight requests ``shutdown_grace`` seconds,
cancel the rest, and remove the lock and discovery file (at once if the engine is inside a compile).

Over several hosts (``--coordinator/--num-processes/--process-id`` or ``--multihost-auto``) every host runs
the same command: process 0 is the daemon above, the others load their part of the model, repeat each
device call process 0 makes (see ``model_runtime.distributed``), and exit when it stops.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import logging.handlers
import os
import re
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from assistant.errors import UsageError

if TYPE_CHECKING:
    from assistant.client.discovery import DaemonLock
    from assistant.config import Config
    from assistant.server.scheduler import Loader
    from model_runtime.distributed import Leader
    from model_runtime.interface import RuntimeProtocol

log = logging.getLogger("diffu.serve")


def add_server_flags(parser: argparse.ArgumentParser) -> None:
    """Flags shared by ``diffu serve`` and ``diffu daemon start``, from the config's declaration; unset
    flags leave the config alone."""
    from assistant.cli.flags import add_flag
    from assistant.config import ENV_PREFIX, Config
    from model_runtime.options import options

    declared = options(Config)
    for name in FLAG_KEYS:
        if declared[name].kind is bool:
            continue  # the switches below turn a default-on option off
        opt = declared[name]
        default = f", else {opt.default}" if opt.default is not None else ""
        where = f"{ENV_PREFIX}{name.upper()} or config.toml's {name}{default}"
        add_flag(parser, opt, default=None, default_text=where, **_FLAG_EXTRA.get(name, {}))
    parser.add_argument(
        "--no-auth",
        dest="auth",
        action="store_const",
        const=False,
        help="accept requests without a token (any key is accepted)",
    )
    parser.add_argument(
        "--no-warmup",
        dest="warmup",
        action="store_const",
        const=False,
        help="compile nothing ahead of requests: each program when a request first needs it",
    )


FLAG_KEYS = (
    "model",
    "host",
    "port",
    "api_key",
    "auth",
    "dtype",
    "quantize",
    "queue_size",
    "max_batch",
    "warmup",
    "log_level",
    "tp",
    "dp",
)


_FLAG_EXTRA: dict[str, dict[str, Any]] = {"quantize": {"metavar": "int8|int4"}}


def flags_of(args: argparse.Namespace) -> dict[str, Any]:
    return {k: getattr(args, k, None) for k in FLAG_KEYS}


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="run the diffu daemon in the foreground",
        description="Run the diffu daemon (HTTP API over the model) in the foreground.",
    )
    add_server_flags(parser)
    from assistant.cli.model_options import add_multihost_options

    add_multihost_options(parser)
    # Set by 'diffu daemon start' / client auto-start: where to report "listening" and run without a terminal.
    parser.add_argument("--notify-fd", dest="notify_fd", type=int, help=argparse.SUPPRESS)
    parser.set_defaults(func=run)


def make_loader(config: Config) -> Loader:
    """The function the scheduler thread calls to load the runtime (JAX is imported there, not here)."""
    from assistant.server.fake_runtime import is_fake_spec, load_fake

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


def setup_logging(log_file: Path, level: int, *, to_stderr: bool) -> None:
    """Log to a rotating file (5 x 5 MB) and, in the foreground, to stderr too."""
    from assistant.errors import UsageError
    from assistant.paths import ensure_private_dir

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


def _guarded_protocol(seconds: float, max_connections: int, api_key: str | None) -> type:
    """uvicorn's h11 protocol with a deadline for receiving each whole request, and connection slots.

    uvicorn closes idle keep-alive connections, but a connection that sends half a request head or
    body and then nothing stays open forever; enough of them exhaust the open-file limit and lock every
    client out. Here each request (from the connection's start, or from the previous response's end)
    must arrive whole within ``seconds``; the deadline is lifted once it has, so long streamed answers
    are not cut. At most ``max_connections`` are open (``security.ConnectionSlots``): past it, a new
    connection closes the one that has waited longest without serving a request with the token.
    """
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    from assistant.server.security import ConnectionSlots

    slots = ConnectionSlots(max_connections, api_key)

    class GuardedH11Protocol(H11Protocol):
        _deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport):
            super().connection_made(transport)
            admitted, victim = slots.admit(self)
            if victim is not None:
                log.info("%d connections open: closed the longest idle one", max_connections)
                victim.transport.close()
            if not admitted:
                # Every open connection serves a request with the token: this one's requests get 503.
                self.limit_concurrency = 0
            self._arm()

        def data_received(self, data: bytes) -> None:
            scope = self.scope
            super().data_received(data)
            self._note_request(scope)
            if self.conn.their_state in (h11.DONE, h11.MUST_CLOSE, h11.CLOSED, h11.ERROR):
                self._disarm()

        def on_response_complete(self) -> None:
            scope = self.scope
            slots.idle(self)
            super().on_response_complete()
            self._note_request(scope)  # a pipelined request waiting in the buffer starts here
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            slots.closed(self)
            self._disarm()
            super().connection_lost(exc)

        def _note_request(self, previous: object) -> None:
            if self.scope is not None and self.scope is not previous:
                slots.request(self, dict(self.scope["headers"]))

        def _arm(self) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(seconds, self._expire)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expire(self) -> None:
            self._deadline = None
            if not self.transport.is_closing():
                log.info("closed a connection that did not send a whole request in %.0fs", seconds)
                self.transport.close()

    return GuardedH11Protocol


class _PrivateLogFile(logging.handlers.RotatingFileHandler):
    """Log files only this user can read (requests, prompts and paths are in them), rotated ones too."""

    def _open(self):
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


class _Terminated(Exception):
    """SIGTERM, raised after uvicorn's graceful shutdown so our cleanup runs (instead of dying on SIG_DFL)."""


def _on_sigterm(signum: int, frame: Any) -> None:
    del signum, frame
    raise _Terminated


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


def run(args: argparse.Namespace) -> int:
    from assistant.client import discovery
    from assistant.config import load_config

    config, _ = load_config(flags_of(args))
    if not config.model:
        raise UsageError("no model to serve: pass --model DIR (or set model in config.toml, or DIFFU_MODEL)")
    leaders: list[Leader] = []
    loader = make_loader(config)
    if getattr(args, "coordinator", None) or getattr(args, "multihost_auto", False):
        multihost = _multihost_loader(args, config, loader, leaders)
        if multihost is None:
            return _follow(config, loader)  # a process other than 0
        loader = multihost
    background = args.notify_fd is not None
    key = discovery.model_key(config.model)
    log_file = discovery.log_path(key)
    setup_logging(log_file, config.log_level_number, to_stderr=not background)
    api_key = _api_key(config)
    lock = discovery.DaemonLock(config.model)
    lock.acquire()
    abandoned = False
    try:
        sock = _bind(config.host, config.port)
        _announce(config, key, log_file, sock, lock, args.notify_fd)
        fatal, abandoned = _serve(config, loader, api_key, sock, leaders)
    finally:
        lock.release()
        log.info("daemon exited; lock and discovery file removed")
    if fatal:
        raise UsageError(f"cannot serve {config.model}: {fatal}")
    if abandoned:
        _exit_now()
    return 0


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


def _multihost_loader(
    args: argparse.Namespace, config: Config, loader: Loader, leaders: list[Leader]
) -> Loader | None:
    """Join the process group; on process 0 a loader whose runtime publishes every device call to the
    followers (kept in ``leaders`` to release them at the end), elsewhere None."""
    import jax

    from assistant.cli.model_options import init_multihost
    from model_runtime import distributed
    from model_runtime.errors import DiffuError

    try:
        init_multihost(args)
    except DiffuError as exc:
        raise UsageError(str(exc)) from None
    if jax.process_index() != 0:
        return None

    def lead(progress: Callable[[str, float], None]) -> RuntimeProtocol:
        leaders.append(distributed.Leader(loader(progress)))
        return leaders[-1]

    return lead


def _api_key(config: Config) -> str | None:
    """The token clients must send (None with auth off); warns about exposed or open daemons."""
    from assistant.server import security

    if not security.is_loopback(config.host):
        log.warning(
            "binding to %s: the model is reachable from other machines%s",
            config.host,
            "" if config.auth else " WITHOUT authentication",
        )
    if not config.auth:
        log.warning("authentication is off (--no-auth): any local program can use the daemon")
        return None
    return config.api_key or security.load_or_create_token()


def _announce(
    config: Config,
    key: str,
    log_file: Path,
    sock: socket.socket,
    lock: DaemonLock,
    notify_fd: int | None,
) -> None:
    """Publish the discovery file and tell whoever started us where we listen."""
    from assistant.client import discovery

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


def _serve(
    config: Config, loader: Loader, api_key: str | None, sock: socket.socket, leaders: list[Leader]
) -> tuple[str | None, bool]:
    """Run uvicorn on ``sock`` until a signal or a fatal load error; returns that error, if any, and
    whether the device thread was left inside a compile it cannot leave (``Scheduler.abandoned``)."""
    import uvicorn

    from assistant.server.http.app import HttpApp

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
        http=_guarded_protocol(config.read_timeout, config.max_connections, api_key),
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


def _follow(config: Any, loader: Any) -> int:
    """A process other than 0 of a multi-host daemon: load this host's shards, then follow process 0."""
    import jax

    from assistant.client import discovery
    from model_runtime import distributed
    from model_runtime.errors import DiffuError

    rank = jax.process_index()
    log_file = discovery.log_path(f"{discovery.model_key(config.model)}-process{rank}")
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
