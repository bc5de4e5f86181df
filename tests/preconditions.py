"""What a test needs of the machine: skipped where it is missing, failed where ``CI`` is set.

The CI run is meant to have everything (``.ci/run`` installs Neovim and tmux, builds the VS Code extension
and sets ``CI``; its machine grants the user and network namespaces and Landlock the sandbox relies on),
so a skip there would hide a regression behind a missing precondition.
"""

from __future__ import annotations

import os

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() not in ("", "0", "false")


def precondition(ok: bool, missing: str) -> None:
    """Skip the test (``missing`` says what is not there) unless ``ok``; fail it instead in CI."""
    if ok:
        return
    if in_ci():
        pytest.fail(f"{missing}; CI is set, and the CI run is meant to provide it", pytrace=False)
    pytest.skip(missing)
