"""What ``--model`` names, told without reading it: a local checkpoint directory, a Hugging Face hub id, or
the daemon's fake test backend.

No JAX and no numpy: the clients check a model before they start a daemon for it, so a mistyped local
path is one line at once instead of a daemon that fails to load.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def local_problem(model: str | os.PathLike[str]) -> str:
    """What makes ``model`` unusable before any download ("" when it is a directory, or could be a hub
    id: then only the hub can tell)."""
    path = Path(model).expanduser()
    if path.is_dir():
        return ""
    text = str(model)
    if path.exists():
        return f"{text} is a file; --model takes a checkpoint directory (with config.json) or a hub id"
    if not _HUB_ID.match(text) or text.startswith((".", "/", "~")):
        return f"model directory {text} does not exist"
    return ""


def is_fake_spec(model: str | None) -> bool:
    """Whether ``model`` names the daemon's JAX-free test backend (``fake`` or ``fake:options``), not a
    checkpoint."""
    return model is not None and (model == "fake" or model.startswith("fake:"))


def one_line(text: str) -> str:
    """``text`` with its line breaks and runs of blanks as single spaces (a library's message may span
    lines; ours are one)."""
    return " ".join(text.split())
