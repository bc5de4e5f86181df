"""Finding a running diffu daemon, or starting one in the background, for both clients.

``DIFFU_URL``/``DIFFU_API_KEY`` (or ``url``/``api_key`` in config.toml) first, then the discovery file a
running daemon publishes (``assistant.discovery``); ``start_daemon`` starts one for the configured
model. Cheap to import, like the clients.
"""

from __future__ import annotations

import os
import socket
import sys
from typing import TextIO

from assistant import discovery
from assistant.api_token import read_token
from assistant.client import spawn
from assistant.client.core import DaemonUnavailable, Endpoint, Progress
from assistant.config import Config
from assistant.wire import ENDED, HEALTH_OK
from model_runtime.model_ref import is_fake_spec, local_problem

__all__ = ["client_api_key", "resolve_endpoint", "start_daemon", "stderr_progress"]


def client_api_key(config: Config) -> str | None:
    return config.api_key or read_token()


def resolve_endpoint(config: Config) -> Endpoint | None:
    """The configured URL, else a running daemon for the configured model (or any, if none is set)."""
    if config.url:
        return Endpoint(config.url.rstrip("/"), client_api_key(config))
    info = discovery.find_daemon(config.model)
    if info is None:
        return None
    return Endpoint(info.url, client_api_key(config), info)


def _port_free(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        # As the server binds (uvicorn sets SO_REUSEADDR): a port whose last connections linger in
        # TIME_WAIT after a restart is free for it, and must not send the daemon to a random port.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def start_daemon(config: Config, *, exact_port: bool = False) -> Endpoint:
    """Start a background daemon for ``config.model``; returns once it listens (it may still be loading).

    It gets the configured port (llama.cpp's 8012 by default, which editor plugins assume) when that is
    free, otherwise any free port (clients find it through the discovery file); with ``exact_port`` a
    busy port is an error instead.
    """
    if not config.model:
        raise DaemonUnavailable(
            "no diffu daemon is running and no model is configured: pass --model, set "
            'DIFFU_MODEL, or put model = "..." in config.toml'
        )
    problem = "" if is_fake_spec(config.model) else local_problem(config.model)
    if problem:  # said now, rather than by a daemon started only to fail its load
        raise DaemonUnavailable(problem)
    port = config.port if exact_port or (config.port and _port_free(config.host, config.port)) else 0
    args: list[str] = []
    if not config.auth:
        args.append("--no-auth")
    if config.dtype:
        args += ["--dtype", config.dtype]
    if config.quantize:
        args += ["--quantize", config.quantize]
    env = dict(os.environ)
    if config.api_key:
        env["DIFFU_API_KEY"] = config.api_key
    try:
        info = spawn.start_background(config.model, host=config.host, port=port, extra_args=args, env=env)
    except discovery.DaemonError as exc:
        raise DaemonUnavailable(f"could not start the diffu daemon: {exc}") from None
    return Endpoint(info.url, client_api_key(config), info)


def _redraws(stream: TextIO) -> bool:
    """Whether ``\\r`` and erase-line reach a terminal that interprets them. Not while a rich Live is on
    screen (``diffu eval``'s progress bars, ``chat --once``'s canvas): it swaps ``sys.stderr`` for a proxy
    that prints what is written as text above the live display, dropping the escape character, so an
    erase-line showed as a literal ``[K`` line."""
    return stream.isatty() and not hasattr(stream, "rich_proxied_file")


def stderr_progress(prefix: str = "diffu") -> Progress:
    """A progress callback that draws one updating line on a terminal, or prints stage changes otherwise
    (a pipe, a log, or a terminal where a rich Live owns the screen)."""
    last = {"stage": ""}

    def report(stage: str, fraction: float, detail: str) -> None:
        stream = sys.stderr  # looked up at each report: a rich Live may have swapped it since
        redraw = _redraws(stream)
        if stage == HEALTH_OK and not last["stage"]:
            return  # the daemon was ready at once: nothing was waited for, so nothing to say
        if stage in ENDED:  # the caller's error line says why, once
            if redraw and last["stage"]:
                stream.write("\r\033[K")  # the progress line gives way to it
                stream.flush()
            return
        if stage == HEALTH_OK:
            # A chat's first prompt is answered now; the rest of the warm-up is the daemon's.
            text = "ready"
        else:
            text = detail if detail.startswith(stage) else f"{stage} {detail}".rstrip()
        if redraw:
            end = "\n" if stage == HEALTH_OK else f" {fraction:4.0%}"
            stream.write(f"\r\033[K{prefix}: {text}{end}")
            stream.flush()
        elif stage != last["stage"]:
            print(f"{prefix}: {text}", file=stream, flush=True)
        last["stage"] = stage

    return report
