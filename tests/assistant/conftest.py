"""Fixtures for daemon tests: isolated diffu directories (the shared daemons live in tests/conftest.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.assistant.helpers import SUITE_SETTINGS


@pytest.fixture
def diffu_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point this process's diffu directories (and config env) at a temp dir."""
    for key in list(os.environ):
        if key.startswith("DIFFU_") and key not in SUITE_SETTINGS:
            monkeypatch.delenv(key)
    monkeypatch.setenv("DIFFU_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("DIFFU_RUNTIME_DIR", str(tmp_path / "run"))
    monkeypatch.setenv("DIFFU_LOG_DIR", str(tmp_path / "log"))
    return tmp_path
