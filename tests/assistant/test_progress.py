"""The CLI's progress when stderr is not a terminal: quiet for quick steps, a line every few seconds for
long ones (scaled down here), never nothing for long."""

from __future__ import annotations

import io
import time

import pytest

from assistant.cli import progress as progress_module
from assistant.cli.progress import Progress


def test_piped_a_quick_step_says_nothing_and_a_long_one_says_how_it_goes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(progress_module, "EVERY", 0.1)
    monkeypatch.setattr(progress_module, "QUIET", 0.3)
    out = io.StringIO()
    with Progress("diffu eval", stream=out) as progress:
        quick = progress.step("loading the model", 1.0, fraction=True)
        quick.update(1.0)
        step = progress.step("generating", 4)
        time.sleep(0.25)
        step.note("compiling the program for 4 x 512 tokens")  # a long compile: the count stands still
        time.sleep(0.5)
        step.note("")
        step(4)
    lines = out.getvalue().splitlines()
    assert lines and all(line.startswith("diffu eval: generating: ") for line in lines), lines
    assert lines[0].startswith("diffu eval: generating: 0/4 (") and lines[-1].startswith(
        "diffu eval: generating: 4/4 in "
    )
    # The note is shown while it holds; standing still, a line every QUIET seconds at most.
    noted = [line for line in lines if "compiling the program for 4 x 512 tokens" in line]
    assert 1 <= len(noted) <= 3
