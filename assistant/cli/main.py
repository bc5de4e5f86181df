"""The ``diffu`` command line: a thin dispatcher over ``assistant.cli``.

Exit codes: 0 success, 1 an unexpected internal failure, 2 a usage or input error (bad flag, bad
model directory, prompt too long, ...), reported as one ``diffu: error: ...`` line without a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from assistant import __version__
from assistant.cli.parser import Parser
from assistant.errors import UsageError

# Sub-command modules, imported when the parser is built. Keep them light at import time: heavy
# imports (jax, textual, pygls) happen inside each command's ``func``.
COMMAND_MODULES = (
    "assistant.cli.generate",
    "assistant.cli.bench",
    "assistant.cli.serve",
    "assistant.cli.daemon",
    "assistant.cli.config",
    "assistant.cli.train",
    "assistant.cli.lsp",
    "assistant.cli.chat",
    "assistant.cli.fill",
    "assistant.cli.eval",
)


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The parser and each command's own parser (for errors shown with the command's usage)."""
    parser = Parser(
        prog="diffu",
        description="A local code assistant on DiffuCoder, a masked-diffusion code model.",
    )
    parser.add_argument("--version", action="version", version=f"diffu {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser, dict(subparsers.choices)


def main(argv: Sequence[str] | None = None) -> int:
    parser, commands = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        # An unknown flag after a command is that command's error, shown with its usage.
        commands.get(args.command, parser).error(f"unrecognized arguments: {' '.join(extra)}")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except UsageError as exc:
        print(f"diffu: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("diffu: interrupted", file=sys.stderr)
        return 130
