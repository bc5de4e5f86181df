"""diffu's assistant layer: the resident daemon, its client library, configuration and the CLI.

Nothing here imports JAX at module import time; only the commands that run the model in-process
(``diffu generate`` without ``--daemon``, ``diffu serve``) import ``model_runtime`` lazily.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version


def _installed_version() -> str:
    # pyproject.toml is the one place the version is written; everything else reads it from here.
    try:
        return version("diffu")
    except PackageNotFoundError:
        return "unknown (not installed)"


__version__ = _installed_version()
