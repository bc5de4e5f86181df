"""Shared fixtures: tiny checkpoints in the published layout, one loaded runtime, an isolated JAX cache.

Everything expensive is session-scoped: the suite must stay well under 15 minutes on 2 CPU cores.
"""

from __future__ import annotations

import atexit
import gc
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# Hundreds of subprocesses (daemons, CLIs, language servers) import the project's modules: with bytecode
# writing off (PYTHONDONTWRITEBYTECODE, which these machines set) each compiled every module from source
# again, 0.2 s of CPU for a daemon's imports. The first one writes the bytecode, the rest read it.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False
# One persistent JAX compilation cache for the whole run, shared with subprocesses (CLI, daemon), in a
# temp dir so runs never see a developer's cache. Set before anything imports the runtime.
_SESSION_TMP = Path(tempfile.mkdtemp(prefix="diffu-tests-"))
# Gone when this process ends (each xdist worker's with the worker, the controller's with the run): a run
# left about 300 MB in /tmp, every run again.
atexit.register(shutil.rmtree, _SESSION_TMP, ignore_errors=True)
os.environ.setdefault("DIFFU_JAX_CACHE_DIR", str(_SESSION_TMP / "jax-cache"))
os.environ.setdefault("DIFFU_CODE_EXECUTED_MARKER", str(_SESSION_TMP / "custom-code-executed"))
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Every test process (each pytest-xdist worker, or a plain run) makes its temp files in a directory of its
# own, so the tests that count what sandboxed programs leave behind (temp entries, running processes)
# count their own run's only, whatever else runs sandboxed programs on the machine. Workers share the
# compilation cache above: the controller set it before they started.
_WORKER_TMP = _SESSION_TMP / "tmp"
_WORKER_TMP.mkdir(exist_ok=True)
tempfile.tempdir = str(_WORKER_TMP)
# The tests run tiny models, whose time is mostly XLA compiling: without LLVM's optimizations and with
# the CPU backend's older fusion emitters it compiles in about half the time (10.0 -> 5.9 s for one
# program of each decoder; every test, parity with the PyTorch reference included, passes the same). One
# LLVM module per program instead of split for parallel codegen: 14% less CPU again (16.0 -> 13.75 s, four
# interleaved pairs), as a tiny program's parts are mostly fixed cost. Shared with subprocesses; tests
# that need virtual devices append --xla_force_host_platform_device_count.
# The reference sampler's programs gather a step's masked rows into one of 7 sizes below a 64-token window
# (model_runtime.programs.ROW_BUCKETS), each a branch every such program compiles; the suite runs one size,
# which compiles them in about half the time (26.7 -> 14.5 s of CPU for a streamed and a fused program of
# each decoder, 32 tokens). No size changes a token: tests/model_runtime/test_row_buckets.py decodes with
# the shipped sizes, this one and none, and compares every step.
os.environ.setdefault("DIFFU_ROW_BUCKETS", "8")
os.environ.setdefault(
    "XLA_FLAGS",
    "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
    " --xla_cpu_use_fusion_emitters=false --xla_cpu_parallel_codegen_split_count=1",
)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Once every test module is imported (JAX, torch, the project), the garbage collector's full passes
    leave those objects alone (``gc.freeze``) and young collections run every 50,000 allocations, not 700:
    tracing a JAX program allocates millions of short-lived objects, and the default thresholds spent
    several percent of a JAX-heavy test file's CPU walking the imported heap again and again."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)


@pytest.fixture(scope="session")
def code_marker() -> Path:
    """A file the decoy custom-code modules in tiny checkpoints write if anyone imports them."""
    return Path(os.environ["DIFFU_CODE_EXECUTED_MARKER"])


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random DiffuCoder-layout checkpoint (2 shards, float32, Instruct-style special tokens)."""
    from model_runtime.tiny import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "DiffuCoder-tiny")


@pytest.fixture(scope="session")
def runtime(tiny_dir: Path):
    import model_runtime

    return model_runtime.load(tiny_dir, length_buckets=(32, 64, 128), batch_buckets=(1, 2, 4))


# -- daemons shared by the daemon, LSP and chat tests: real ``diffu serve`` subprocesses ---------------


@pytest.fixture(scope="session")
def fake_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """A daemon on the JAX-free fake runtime: 20 ms a step, 4 queue places, 64 KiB bodies."""
    from tests.assistant.helpers import isolated_env, start_daemon

    root = tmp_path_factory.mktemp("fake-daemon")
    env = isolated_env(root, DIFFU_QUEUE_SIZE="4", DIFFU_MAX_BODY_BYTES="65536")
    daemon = start_daemon(root, "fake:step_delay=0.02", env=env)
    yield daemon
    daemon.stop()


@pytest.fixture(scope="session")
def micro_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random checkpoint in the published DiffuCoder layout, shrunk further for daemon tests."""
    from model_runtime.tiny import write_tiny_checkpoint
    from tests.assistant.helpers import MICRO_MODEL

    return write_tiny_checkpoint(tmp_path_factory.mktemp("micro") / "DiffuCoder-micro", **MICRO_MODEL)


@pytest.fixture(scope="session")
def tiny_daemon(tmp_path_factory: pytest.TempPathFactory, micro_dir: Path) -> Iterator:
    """A daemon serving a tiny random checkpoint on the real JAX runtime."""
    from tests.assistant.helpers import TINY_ENV, isolated_env, start_daemon

    root = tmp_path_factory.mktemp("tiny-daemon")
    daemon = start_daemon(root, str(micro_dir), env=isolated_env(root, **TINY_ENV))
    yield daemon
    daemon.stop()


@pytest.fixture(scope="session")
def bundled_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """A daemon serving the bundled demo model: a trained model, whose answers hold code blocks and whose
    fills are code (a random checkpoint's are not). One 512-token bucket and no warm-up, so the tests
    compile only the programs they run."""
    from model_runtime.bundled import bundled_model_dir
    from tests.assistant.helpers import isolated_env, start_daemon

    root = tmp_path_factory.mktemp("bundled-daemon")
    env = isolated_env(
        root,
        DIFFU_LENGTH_BUCKETS="512",
        DIFFU_BATCH_BUCKETS="1",
        DIFFU_MAX_CONTEXT="512",
        DIFFU_WARMUP="0",
    )
    daemon = start_daemon(root, str(bundled_model_dir()), env=env)
    yield daemon
    daemon.stop()
