"""The scripts the README quotes run in the venv its quick start makes (``pip install -e .``, no extra).

``scripts/lsp_latency.py`` and ``scripts/fuzz_lsp.py`` crashed there with ``No module named
'pytest_asyncio'`` (issue #45): the raw LSP client they share lived beside the test fixtures and imported
``tests/lsp/conftest.py``. Each quoted script is run here as ``python scripts/NAME.py --help`` with every
module of the ``test`` extra made unimportable, which is what that venv lacks.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# The import names of pyproject.toml's test extra (textual, rich and Pygments are pinned there but are
# installed without it).
TEST_ONLY = (
    "pytest",
    "_pytest",
    "pytest_timeout",
    "xdist",
    "pytest_lsp",
    "pytest_asyncio",
    "pytest_textual_snapshot",
    "torch",
    "regex",
    "matplotlib",
    "mypy",
)
# As ``python scripts/NAME.py`` starts it: the script's directory first on the path, no test module.
RUN = """
import importlib.abc, runpy, sys

class TestExtra(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, TestExtra())
sys.path[0] = {directory!r}
sys.argv = [{script!r}, "--help"]
runpy.run_path({script!r}, run_name="__main__")
"""


def quoted_scripts() -> list[str]:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    return sorted(set(re.findall(r"scripts/\w+\.py", readme)))


def test_the_readme_quotes_the_two_lsp_scripts() -> None:
    assert {"scripts/lsp_latency.py", "scripts/fuzz_lsp.py"} <= set(quoted_scripts())


@pytest.mark.parametrize("script", quoted_scripts())
def test_a_quoted_script_runs_without_the_test_extra(script: str) -> None:
    code = RUN.format(blocked=TEST_ONLY, directory=str(REPO / "scripts"), script=str(REPO / script))
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith("usage: ")
