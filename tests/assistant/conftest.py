"""Fixtures for daemon tests: real ``diffu serve`` subprocesses and isolated diffu directories.

Daemons are session-scoped where tests can share them: starting one on the tiny checkpoint costs a JAX
import plus compiling its buckets.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.assistant.helpers import MICRO_MODEL, TINY_ENV, DaemonProcess, isolated_env, start_daemon


@pytest.fixture(scope="session")
def fake_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    """A daemon on the JAX-free fake runtime: 20 ms a step, 4 queue places, 64 KiB bodies."""
    root = tmp_path_factory.mktemp("fake-daemon")
    env = isolated_env(root, DIFFU_QUEUE_SIZE="4", DIFFU_MAX_BODY_BYTES="65536")
    daemon = start_daemon(root, "fake:step_delay=0.02", env=env)
    yield daemon
    daemon.stop()


@pytest.fixture(scope="session")
def micro_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random checkpoint in the published DiffuCoder layout, shrunk further for daemon tests."""
    from model_runtime.tiny import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("micro") / "DiffuCoder-micro", **MICRO_MODEL)


@pytest.fixture(scope="session")
def tiny_daemon(tmp_path_factory: pytest.TempPathFactory, micro_dir: Path) -> Iterator[DaemonProcess]:
    """A daemon serving a tiny random checkpoint on the real JAX runtime."""
    root = tmp_path_factory.mktemp("tiny-daemon")
    daemon = start_daemon(root, str(micro_dir), env=isolated_env(root, **TINY_ENV))
    yield daemon
    daemon.stop()


@pytest.fixture
def diffu_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point this process's diffu directories (and config env) at a temp dir."""
    for key in list(os.environ):
        if key.startswith("DIFFU_") and key not in ("DIFFU_JAX_CACHE_DIR", "DIFFU_CODE_EXECUTED_MARKER"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("DIFFU_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("DIFFU_RUNTIME_DIR", str(tmp_path / "run"))
    monkeypatch.setenv("DIFFU_LOG_DIR", str(tmp_path / "log"))
    return tmp_path
