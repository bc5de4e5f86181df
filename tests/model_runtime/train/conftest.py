"""Fixtures for the trainer tests: a small, fixed directory of real Python source."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

_MODULES = ("textwrap", "heapq", "bisect", "fnmatch", "colorsys", "string", "glob", "shlex", "queue", "sched")


@pytest.fixture(scope="session")
def source_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Ten standard-library modules copied into a tree with a subpackage and files to skip."""
    import importlib

    root = tmp_path_factory.mktemp("src")
    (root / "pkg").mkdir()
    for i, name in enumerate(_MODULES):
        text = inspect.getsource(importlib.import_module(name))
        (root / ("pkg" if i % 2 else ".") / f"{name}.py").write_text(text, encoding="utf-8")
    # Never part of a corpus: caches, non-source files, undecodable files.
    (root / "__pycache__").mkdir()
    (root / "__pycache__" / "cached.py").write_text("SECRET_CACHE = 1\n")
    (root / "notes.txt").write_text("not python\n")
    (root / "latin1.py").write_bytes(b"x = '\xe9'\n")
    return root
