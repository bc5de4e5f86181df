"""``diffu lsp``: the language server for editors, over stdio.

It talks to the daemon like the other clients (the editor's settings, then ``DIFFU_URL``/``DIFFU_API_KEY``,
then the discovery file, then auto-start) and answers ``initialize`` at once: pygls and the server are
imported inside :func:`run`, and the model is never loaded in this process.
"""

from __future__ import annotations

import argparse
import logging
import sys


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "lsp",
        help="run the language server (infill completions, fill holes) over stdio",
        description="Run the diffu language server over stdio. Editors start it (see docs/editors.md).",
    )
    parser.add_argument(
        "--stdio",
        action="store_true",
        help="talk LSP over stdin/stdout (the default and only transport; accepted because editors pass it)",
    )
    parser.add_argument(
        "--log-file",
        dest="log_file",
        default=None,
        help="also write the server's log to this file (stderr gets it in any case)",
    )
    parser.add_argument(
        "--log-level", dest="log_level", default="warning", choices=("debug", "info", "warning", "error")
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # stdout carries the protocol: every log line goes to stderr (editors show it in their LSP log).
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if args.log_file:
        handlers.append(logging.FileHandler(args.log_file, encoding="utf-8"))
    logging.basicConfig(
        level=args.log_level.upper(),
        handlers=handlers,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.log_level != "debug":
        # pygls logs every message it sends at INFO; that is debugging output for us.
        logging.getLogger("pygls").setLevel(max(logging.WARNING, logging.getLogger().level))
    from lsp.server import main

    main()
    return 0
