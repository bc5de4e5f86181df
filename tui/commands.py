"""The chat's slash commands: which there are, what each takes, and reading a prompt as one.

A prompt whose first word is ``/name`` is a command, not a message to the model; ``//`` at its start
sends the rest as a prompt (a prompt that must begin with a slash). Arguments are split as a shell splits
them, so a path with spaces is quoted.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

# name -> (its arguments, what it does): the /help listing and docs/chat.md.
COMMANDS = {
    "add": ("PATH[:FIRST-LAST]...", "put files (or line ranges) in the conversation's context"),
    "drop": ("[PATH...]", "take files out of the context (every file without a path)"),
    "files": ("", "list the files in context, each with its tokens, against the prompt's limit"),
    "apply": ("[PATH] [--force]", "apply the selected (or last) code block to PATH as a reviewed diff"),
    "undo": ("[--force]", "put back the bytes the last applied change replaced"),
    "fill": ("PATH[:FIRST-LAST]", "fill the holes (??? or <|mask|>) of a file in one run, live; review"),
    "help": ("", "these commands"),
}
TAKES_PATHS = ("add", "drop", "apply", "fill")  # Tab completes paths in their arguments


class CommandError(ValueError):
    """A prompt that reads as a command but is not a valid one; the message says how to write it."""


@dataclass(frozen=True)
class Command:
    name: str
    args: tuple[str, ...] = ()
    force: bool = False


def parse_command(text: str) -> Command | None:
    """The command ``text`` is, None for a prompt (``//`` included), or a CommandError."""
    if not text.startswith("/") or text.startswith("//"):
        return None
    try:
        words = shlex.split(text[1:])
    except ValueError as exc:
        raise CommandError(f"cannot read the command's arguments ({exc})") from None
    if not words:
        raise CommandError(f"a command needs a name: {usage()}")
    name, args = words[0], words[1:]
    if name not in COMMANDS:
        raise CommandError(f"unknown command /{name} ({usage()}; // sends a prompt that starts with /)")
    force = "--force" in args
    args = [a for a in args if a != "--force"]
    if force and name not in ("apply", "undo"):
        raise CommandError(f"/{name} has no --force")
    unknown = next((a for a in args if a.startswith("--")), None)
    if unknown is not None:
        raise CommandError(f"/{name}: unknown option {unknown} (/{name} {COMMANDS[name][0]})")
    needs = {"add": (1, None), "drop": (0, None), "files": (0, 0), "apply": (0, 1), "undo": (0, 0)}
    low, high = needs.get(name, (1, 1) if name == "fill" else (0, 0))
    if len(args) < low or (high is not None and len(args) > high):
        raise CommandError(f"usage: /{name} {COMMANDS[name][0]}".rstrip())
    return Command(name, tuple(args), force)


def usage() -> str:
    return "commands: " + " ".join(f"/{name}" for name in COMMANDS)


def prompt_text(text: str) -> str:
    """The prompt to send for ``text`` that is not a command: ``//`` stands for one ``/``."""
    return text[1:] if text.startswith("//") else text


def help_text() -> str:
    width = max(len(f"/{n} {a}".rstrip()) for n, (a, _) in COMMANDS.items())
    return "\n".join(f"{f'/{n} {a}'.rstrip():<{width}}  {what}" for n, (a, what) in COMMANDS.items())


def path_argument(text: str, cursor: int) -> tuple[int, str] | None:
    """Where Tab completes a path in the prompt: (where the partial path starts, the partial path), for
    an ``@`` word or an argument of a command that takes paths; None elsewhere."""
    before = text[:cursor]
    start = max(before.rfind(" "), before.rfind("\n"), before.rfind("\t")) + 1
    word = before[start:]
    if word.startswith("@"):
        return start + 1, word[1:]
    first = before.split(maxsplit=1)
    if start > 0 and first and first[0].lstrip("/") in TAKES_PATHS and before.startswith("/"):
        return start, word
    return None
