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
    p: argparse._ActionsContainer,
    opt: Option,
    *,
    default: Any = _UNSET,
    default_text: str | None = None,
    name: str | None = None,
    show_help: bool = True,
    **extra: Any,
) -> None:
    """Add ``opt``'s flag to ``p`` (a parser or one of its argument groups).

    ``default``: another default than the declared one (None: "not given", for a command that leaves the
    option to a later layer); ``default_text`` says what that default means in the help ("": say
    nothing). ``name``: the flag's name where it is not the option's (``--lr`` for ``learning_rate``); the
    value still lands under the option's name. ``show_help``: False shows the flag alone, without help.
    A tuple option is a repeatable flag (``--suffix .py --suffix .pyi``), None when not given.
    ``extra`` goes to ``add_argument`` (``metavar``, ``dest``, ...).
    """
    if opt.kind is bool:
        raise TypeError(f"{opt.name}: no derived flag for a bool option; add it by hand")
    value = opt.default if default is _UNSET else default
    if default_text is None and value is not None:
        default_text = ", ".join(map(str, value)) if opt.kind is tuple else str(value)
    if default_text is None and opt.kind is tuple:
        default_text = ", ".join(map(str, opt.default))
    help_text = opt.help + (f" (default: {default_text})" if default_text else "")
    if name is not None:
        extra.setdefault("dest", opt.name)
        if not (opt.kind is str and opt.choices):
            extra.setdefault("metavar", name.upper().replace("-", "_"))
    if opt.kind is tuple:
        extra.update(action="append", default=None if default is _UNSET else default)
    else:
        # A closed vocabulary of words: argparse lists it in --help and refuses others with the choices.
        extra.update(choices=opt.choices if opt.kind is str else None, default=value)
    # argparse formats help with %-style placeholders: a literal % is written %%.
    shown = help_text.replace("%", "%%") if show_help else None
    p.add_argument("--" + name if name else flag(opt.name), type=opt.base, help=shown, **extra)


def flag_error(exc: OptionError, name: str | None = None) -> str:
    """An option's error as the command line words it: ``--steps: must be >= 1, got 0`` (``name``: the
    flag's name where it is not the option's)."""
    return f"{'--' + name if name else flag(exc.field)}: {exc.problem}"
