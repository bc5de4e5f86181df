"""``diffu serve``: run the daemon in the foreground (``diffu daemon start`` runs this detached).

Here are the flags (derived from the config's declaration) and the process group's options; the daemon's
process itself (the lock, the socket, the discovery file, signals, logging, the HTTP server) is
``assistant.server.bootstrap``, imported only when a daemon is to run.

Over several hosts (``--coordinator/--num-processes/--process-id`` or ``--multihost-auto``) every host runs
the same command: process 0 is the daemon, the others load their part of the model, repeat each device
call process 0 makes (see ``model_runtime.distributed``), and exit when it stops.
"""

from __future__ import annotations

import argparse
from typing import Any

from assistant.errors import UsageError


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


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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


def run(args: argparse.Namespace) -> int:
    from assistant.config import load_config
    from assistant.server import bootstrap

    config, _ = load_config(flags_of(args))
    multihost = bool(getattr(args, "coordinator", None) or getattr(args, "multihost_auto", False))
    if multihost:
        from assistant.cli.model_options import init_multihost
        from model_runtime.errors import DiffuError

        try:
            init_multihost(args)  # join the process group before anything touches a device
        except DiffuError as exc:
            raise UsageError(str(exc)) from None
    return bootstrap.run(config, notify_fd=args.notify_fd, multihost=multihost)
