"""Command-line flags derived from declared options (``model_runtime.options``): the flag's name, type,
choices, default and help all come from the declaration, so a flag cannot drift from the option it sets.

argparse converts each flag to the option's type (``--steps x`` is its usual usage error); the bounds are
the declaration's to check, once the flags become the value they set (``SamplingParams``, ``Config``):
:func:`flag_error` turns the option's error into the one-line ``--flag: problem`` every command prints.
"""

from __future__ import annotations

import argparse
from typing import Any

from model_runtime.options import Option, OptionError

_UNSET: Any = object()


def flag(name: str) -> str:
    """The flag of an option: ``block_length`` is ``--block-length``."""
    return "--" + name.replace("_", "-")


def add_flag(
    p: argparse.ArgumentParser,
    opt: Option,
    *,
    default: Any = _UNSET,
    default_text: str | None = None,
    **extra: Any,
) -> None:
    """Add ``opt``'s flag to ``p``.

    ``default``: another default than the declared one (None: "not given", for a command that leaves the
    option to a later layer); ``default_text`` says what that default means in the help. ``extra`` goes
    to ``add_argument`` (``metavar``, ``dest``, ...).
    """
    value = opt.default if default is _UNSET else default
    if default_text is None and value is not None:
        default_text = str(value)
    help_text = opt.help + (f" (default: {default_text})" if default_text else "")
    if opt.kind in (bool, tuple):
        raise TypeError(f"{opt.name}: no derived flag for a {opt.kind.__name__} option; add it by hand")
    # A closed vocabulary of words: argparse lists it in --help and refuses others with the choices.
    choices = opt.choices if opt.kind is str else None
    p.add_argument(flag(opt.name), type=opt.base, choices=choices, default=value, help=help_text, **extra)


def flag_error(exc: OptionError) -> str:
    """An option's error as the command line words it: ``--steps: must be >= 1, got 0``."""
    return f"{flag(exc.field)}: {exc.problem}"
