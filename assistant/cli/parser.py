"""The one argparse parser class every ``diffu`` command uses: mistakes get one line that names them.

Python 3.11's argparse prints the whole usage (15 lines for ``diffu generate``) and, for a mistyped flag
that stands beside a required one, complains about the required one instead (``--promt x``: "the
following arguments are required: --prompt"). This class checks the flags first, suggests the closest
option or choice (``difflib``, as Python 3.14's ``suggest_on_error`` does), and prints one line:

    diffu generate: error: unknown option --promt; did you mean --prompt? (diffu generate --help lists them)
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Iterable, Sequence
from typing import Any, NoReturn


def did_you_mean(value: str, options: Iterable[str], *, prefix: str = "") -> str:
    """``"; did you mean X?"`` for the option closest to ``value``, or ``""`` when none is close. Values
    and options are compared without ``prefix`` (``--``: two dashes in common would make any short
    flag look close)."""
    bare = {o.removeprefix(prefix): o for o in options}
    close = difflib.get_close_matches(value.removeprefix(prefix), list(bare), n=1, cutoff=0.6)
    return f"; did you mean {bare[close[0]]}?" if close else ""


class Parser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` with one-line errors and "did you mean" for flags and choices.

    Sub-command parsers are made of the same class (``add_subparsers`` uses the parent's class).
    """

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        argv = list(sys.argv[1:] if args is None else args)
        self._check_flags(argv)
        return super().parse_known_args(argv, namespace)

    def _check_flags(self, argv: list[str]) -> None:
        """An error for the first ``--flag`` this parser does not know (before argparse would report a
        missing required one instead). Stops at ``--`` and at a sub-command, whose parser checks the rest."""
        commands = {
            name for action in self._actions if isinstance(action, argparse._SubParsersAction)
            for name in action.choices
        }  # fmt: skip
        known = [s for s in self._option_string_actions if s.startswith("--")]
        for arg in argv:
            if arg == "--" or arg in commands:
                return
            if not arg.startswith("--") or " " in arg:  # argparse reads a spaced "--x y" as a value too
                continue
            flag = arg.split("=", 1)[0]
            # argparse takes a unique prefix (--max-new for --max-new-tokens): leave those to it.
            if flag in known or (self.allow_abbrev and any(s.startswith(flag) for s in known)):
                continue
            self.error(f"unknown option {flag}{did_you_mean(flag, known, prefix='--')}")

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        choices = action.choices
        if choices is not None and value not in choices:
            names = [str(c) for c in choices]
            hint = did_you_mean(str(value), names)
            message = f"invalid choice {value!r} (one of {', '.join(names)}){hint}"
            raise argparse.ArgumentError(action, message)

    def error(self, message: str) -> NoReturn:
        """One line on stderr, exit code 2 (the usage is what ``--help`` is for)."""
        self.exit(2, f"{self.prog}: error: {message} ({self.prog} --help lists the options)\n")
