"""The rows the reference sampler gathers (``programs.row_buckets``, ``DIFFU_ROW_BUCKETS``): the shipped
sizes, a single size (what the test line runs: tests/conftest.py) and none decode the same tokens.

Each size is a branch every reference program compiles; the suite runs one size to compile half as much,
so this file is where the shipped sizes are checked, every one of them below the window used."""

from __future__ import annotations

from pathlib import Path

import pytest

import model_runtime
from model_runtime import SamplingParams
from model_runtime.errors import InputError
from model_runtime.interface import BatchDone, BatchStep
from model_runtime.kernels import row_sizes
from model_runtime.programs import ROW_BUCKETS, ROW_BUCKETS_ENV, row_buckets

# A 48-token answer, one token a step: a row's masks go 48 -> 1, through every shipped size below 48.
NEW = 48
LADDERS = {"shipped": None, "one size": "8", "none": ""}


def _set_sizes(monkeypatch: pytest.MonkeyPatch, value: str | None) -> None:
    """``DIFFU_ROW_BUCKETS`` set to ``value`` for this test, or unset (None: the shipped sizes)."""
    if value is None:
        monkeypatch.delenv(ROW_BUCKETS_ENV, raising=False)
    else:
        monkeypatch.setenv(ROW_BUCKETS_ENV, value)


def _decodes(tiny_dir: Path, monkeypatch: pytest.MonkeyPatch, ladder: str | None) -> dict[str, object]:
    _set_sizes(monkeypatch, ladder)
    # A fresh runtime: its programs are traced (and their branches made) under this ladder.
    rt = model_runtime.load(tiny_dir, length_buckets=(64,), batch_buckets=(2,))
    sizes = row_buckets()
    _set_sizes(monkeypatch, "12")  # read once, at load: a later change reaches no program of this runtime
    assert rt.programs.row_buckets == sizes
    tok = rt.tokenizer
    prompts = [tok.encode("def add(a, b):\n    return"), tok.encode("import os")]  # left padding
    greedy = SamplingParams(max_new_tokens=NEW, steps=NEW)
    events = list(rt.generate(prompts, greedy, chat=False))
    canvases = [e.canvas for e in events if isinstance(e, BatchStep)]
    sampled = SamplingParams(
        max_new_tokens=NEW, steps=NEW, temperature=0.7, top_p=0.95, alg="entropy", seed=3
    )
    done = list(rt.generate(prompts, sampled, chat=False, stream=False))[-1]
    assert isinstance(events[-1], BatchDone) and isinstance(done, BatchDone)
    return {"greedy steps": canvases, "greedy": events[-1].sequences, "sampled": done.sequences}


def test_the_shipped_sizes_one_size_and_none_decode_the_same_tokens(tiny_dir, monkeypatch) -> None:
    _set_sizes(monkeypatch, None)
    # The shipped sizes this decode goes through.
    assert row_sizes(NEW, row_buckets()) == [8, 12, 16, 24, 32, 48]
    got = {name: _decodes(tiny_dir, monkeypatch, ladder) for name, ladder in LADDERS.items()}
    assert len(got["shipped"]["greedy steps"]) == NEW  # type: ignore[arg-type]
    for name in ("one size", "none"):
        for what in ("greedy steps", "greedy", "sampled"):
            assert got[name][what] == got["shipped"][what], (name, what)


@pytest.mark.parametrize(
    ("value", "sizes"),
    [(None, ROW_BUCKETS), ("8", (8,)), ("", ()), (" 32, 8,8 ", (8, 32)), ("16,", (16,))],
)
def test_the_setting_reads_comma_separated_sizes(monkeypatch, value, sizes) -> None:
    _set_sizes(monkeypatch, value)
    assert row_buckets() == sizes
    assert row_sizes(64, row_buckets()) == [m for m in sizes if m < 64] + [64]


@pytest.mark.parametrize("value", ["x", "0", "8,-16", "8;16", "1.5"])
def test_a_bad_setting_is_refused_before_the_weights_are_read(tiny_dir, monkeypatch, capsys, value) -> None:
    from assistant.cli.main import main

    monkeypatch.setenv(ROW_BUCKETS_ENV, value)
    with pytest.raises(InputError, match=f"{ROW_BUCKETS_ENV}=.*row counts of at least 1"):
        model_runtime.load(Path("/nonexistent/model"))  # refused before the missing model is noticed
    args = ["generate", "--model", str(tiny_dir), "--raw", "--prompt", "def f", "--max-new-tokens", "8"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"diffu: error: {ROW_BUCKETS_ENV}="), err
