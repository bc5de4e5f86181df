"""Fixtures for the chat tests: isolated diffu directories and an app factory.

The real daemons (``fake_daemon``, ``tiny_daemon``) are the session fixtures of tests/conftest.py, shared
with the daemon and LSP tests. Every test gets its own config/runtime/log/data directories, so nothing
touches the user's chat database or finds a daemon it did not start. Apps run with cursor blink and
animations off, so Pilot timings and SVG snapshots do not depend on when a frame is taken.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.tui.helpers import ScriptedBackend
from tui.app import ChatApp
from tui.settings import ChatSettings
from tui.store import ChatStore

# Small canvases keep the fake answers' steps few; the scripted answers fit in 160 tokens.
TEST_SETTINGS = ChatSettings(max_new_tokens=160, steps=16, temperature=0.0)


@pytest.fixture(autouse=True)
def diffu_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's diffu directories (config, runtime, logs, chat data) under tmp_path."""
    for key in list(os.environ):
        if key.startswith("DIFFU_") and key not in ("DIFFU_JAX_CACHE_DIR", "DIFFU_CODE_EXECUTED_MARKER"):
            monkeypatch.delenv(key)
    # The same layout as tests.assistant.helpers.isolated_env, so its cleanup helpers apply.
    for var, name in (("CONFIG", "config"), ("RUNTIME", "run"), ("LOG", "log"), ("DATA", "data")):
        monkeypatch.setenv(f"DIFFU_{var}_DIR", str(tmp_path / name))
    return tmp_path


@pytest.fixture
def store(diffu_home: Path) -> Iterator[ChatStore]:
    s = ChatStore()
    yield s
    s.close()


@pytest.fixture
def make_app(store: ChatStore) -> Callable[..., ChatApp]:
    """``make_app(backend=None, **kwargs)``: a ChatApp on a scripted backend, test settings, no blink."""

    def make(backend: Any = None, **kwargs: Any) -> ChatApp:
        backend = backend if backend is not None else ScriptedBackend()
        kwargs.setdefault("baseline", TEST_SETTINGS)
        app = ChatApp(backend, store, cursor_blink=False, **kwargs)
        app.animation_level = "none"
        return app

    return make
