"""Shared by the sharding and multi-host tests: one checkpoint whose heads split 4 and 8 ways."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def shard_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from model_runtime.tiny import write_tiny_checkpoint

    # 8 query heads so that tp=8 shards heads too; 2 KV heads stay replicated at tp=4 and tp=8.
    return write_tiny_checkpoint(
        tmp_path_factory.mktemp("shard") / "tiny", num_attention_heads=8, num_key_value_heads=2
    )


@pytest.fixture(scope="session")
def generate_argv(shard_dir: Path) -> list[str]:
    """A greedy two-prompt ``diffu generate --json`` on that checkpoint, for runs on several meshes."""
    return [
        sys.executable,
        "-m",
        "assistant",
        "generate",
        "--model",
        str(shard_dir),
        "--raw",
        "--prompt",
        "def add(a, b):",
        "--prompt",
        "import os",
        "--max-new-tokens",
        "16",
        "--json",
    ]
