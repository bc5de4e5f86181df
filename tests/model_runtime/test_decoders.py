"""The decoders as values (issue #41): one registry, strategies that are the same on the host and the
device, program keys the fake runtime shares, and the reference decoder's early stop at a request's
last line (issue #45)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from assistant.server.fake_runtime import FakeRuntime
from model_runtime import SamplingParams, decoders
from model_runtime.batch import answer_length
from model_runtime.decoders.base import HostLimits
from model_runtime.lines import line_table
from model_runtime.params import DECODERS, decoder_knobs
from model_runtime.strategies import EARLY_STOPS, ScopeEnd, commit_rule, finished


def test_the_registry_holds_every_decoder_the_option_offers():
    assert tuple(decoders.REGISTRY) == DECODERS
    assert all(decoders.get(name).name == name for name in DECODERS)
    # What only some decoders read is what the chat's settings screen switches on and off.
    assert decoder_knobs() == {
        "block_length",
        "threshold",
        "factor",
        "window",
        "commit_rule",
        "refresh_every",
    }
    assert decoders.get("reference").knobs == frozenset()
    assert decoders.get("sliding").knobs == {"threshold", "factor", "window", "commit_rule", "refresh_every"}


def test_the_early_stops_decide_alike_on_the_host_and_on_the_device():
    mask, eos, nl = 9, 7, 3
    x = np.array(
        [
            [1, 2, nl, 4, mask, mask],  # a line written before its first mask
            [1, eos, 2, mask, mask, mask],  # a stop token before its first mask
            [1, 2, mask, nl, mask, mask],  # the newline lies after a mask: not written yet
            [1, 2, 4, 5, 6, 1],  # no mask left
        ],
        np.int32,
    )
    fill = np.ones(x.shape, bool)
    stops = np.zeros((4, 10), bool)
    stops[:, eos] = True
    newlines = np.zeros(10, np.int32)
    newlines[nl] = 1
    lines = line_table(["?"] * 10)  # no token here breaks a line for the scope's stop
    scope = np.full(4, -1, np.int32)
    for max_lines, want in ((1, [True, True, False, True]), (0, [False, True, False, True])):
        tables = HostLimits(stops, newlines, max_lines, lines, scope)
        first, host = finished(EARLY_STOPS, np, x, fill, tables, mask)
        on_device = HostLimits(
            jnp.asarray(stops),
            jnp.asarray(newlines),
            jnp.int32(max_lines),
            jnp.asarray(lines),
            jnp.asarray(scope),
        )
        first_d, device = finished(EARLY_STOPS, jnp, jnp.asarray(x), jnp.asarray(fill), on_device, mask)
        assert host.tolist() == want == np.asarray(device).tolist()
        assert first.tolist() == [4, 3, 2, 6] == np.asarray(first_d).tolist()


def test_a_request_names_its_commit_rule_and_the_factor_makes_the_threshold_rule_the_factor_rule():
    assert type(commit_rule("threshold", None)).__name__ == "Threshold"
    assert type(commit_rule("threshold", 2.0)).__name__ == "Factor"
    assert type(commit_rule("credit", None)).__name__ == "Credit"


def test_the_fake_runtime_compiles_what_the_real_one_would():
    """Its program keys are the decoders' own: a sliding request with another commit rule, or a fast one
    with another block length, is another program (the fake's own key once left the rule out)."""
    fake = FakeRuntime()
    rows = [fake.rows.make_infill_row("def f(x):\n", "\n", 16)]
    base = SamplingParams(max_new_tokens=16, decoder="sliding", window=8)
    fake.compile(rows, base)
    assert fake.compiled(rows, base)
    assert not fake.compiled(rows, SamplingParams(**{**base.to_dict(), "commit_rule": "credit"}))
    assert fake.compiled(rows, SamplingParams(**{**base.to_dict(), "threshold": 0.5}))  # a traced value
    fast = SamplingParams(max_new_tokens=16, decoder="fast", block_length=8)
    fake.compile(rows, fast)
    assert not fake.compiled(rows, SamplingParams(**{**fast.to_dict(), "block_length": 16}))
    shape = fake._bucket(rows)
    assert set(decoders.get("fast").keys(fake, rows, fast, shape, True)) <= fake.programs


@pytest.mark.parametrize("stream", [False, True])
def test_the_reference_decoder_stops_at_the_last_line_with_the_same_answers(runtime, monkeypatch, stream):
    """With ``max_lines`` the reference decoder ends once every row's lines are written (on the device in
    its fused loop, on the host when streaming): fewer forwards, the same answers as every step run."""
    vocab = runtime.config.vocab_size
    # The random tiny model writes no real newline: count every fifth token as one, for the stop and the
    # answer's cut alike.
    counts = tuple(int(i % 5 == 0) for i in range(vocab))
    monkeypatch.setattr(runtime.tokenizer, "newlines", lambda: counts)
    monkeypatch.setattr(runtime, "_line_tables", {})
    tok = runtime.tokenizer
    rows = [
        runtime.rows.make_infill_row("def f(x):\n    y = x + 1\n", "\n    return y\n", 20),
        runtime.rows.make_row(tok.encode("import os\n"), 20, chat=False),
    ]
    every = list(runtime.run(rows, SamplingParams(max_new_tokens=20, steps=20), stream=False))[-1]
    assert every.stats.steps == 20
    stopped = list(runtime.run(rows, SamplingParams(max_new_tokens=20, steps=20, max_lines=1), stream=stream))
    done = stopped[-1]
    assert done.stats.steps < 20
    if stream:
        assert len(stopped) == done.stats.steps + 1  # a BatchStep per forward run, then the BatchDone
    stop_ids = set(tok.stop_ids(chat=False))
    for full, got, answer in zip(every.generated, done.generated, done.answer_tokens, strict=True):
        n = answer_length(full, stop_ids, counts, 1)
        assert answer == n and got[:n] == full[:n]
        assert tok.mask_id not in got  # what was never decoded is padding


# A vocabulary of pieces a byte-level BPE makes of code: newlines with and without the next line's
# indentation or code, runs of spaces, code with spaces before it.
PIECES = [
    "\n",
    "\n\n",
    "\n    ",
    "\n  ",
    "\n    return",
    "    ",
    "  ",
    "\t",
    " ",
    "x",
    " = 1",
    "return",
    "):\n",
    "  pass",
]
BLANK = " \t\r"


def leaves_scope(text: str, scope: int) -> bool:
    """The rule on text: a later line whose code is indented less than ``scope``, or a blank line (its
    newline written) after code."""
    lines = text.split("\n")
    code = bool(lines[0].strip(BLANK))
    for i, line in enumerate(lines[1:], 1):
        if line.strip(BLANK):
            if len(line) - len(line.lstrip(BLANK)) < scope:
                return True
            code = True
        elif i < len(lines) - 1 and code:
            return True
    return False


def test_the_scope_stop_reads_a_tokens_lines_as_the_text_reads():
    """``ScopeEnd`` works token by token, on the host and the device alike; on 1,000 random answers made of
    BPE-like pieces it ends exactly the answers whose text leaves the scope."""
    table = line_table(PIECES)
    rng = np.random.default_rng(0)
    x = rng.integers(0, len(PIECES), size=(1000, 12)).astype(np.int32)
    scope = rng.integers(-1, 7, size=1000).astype(np.int32)
    decoded = np.ones(x.shape, bool)
    limits = HostLimits(np.zeros((1000, len(PIECES)), bool), np.zeros(len(PIECES), np.int32), 0, table, scope)
    host = ScopeEnd().ended(np, x, decoded, limits)
    on_device = HostLimits(
        *(jnp.asarray(a) for a in (limits.stops, limits.newlines)), 0, jnp.asarray(table), jnp.asarray(scope)
    )
    device = np.asarray(ScopeEnd().ended(jnp, jnp.asarray(x), jnp.asarray(decoded), on_device))
    want = [
        s >= 0 and leaves_scope("".join(PIECES[t] for t in row), s) for row, s in zip(x, scope, strict=True)
    ]
    assert host.tolist() == want == device.tolist()
    assert 150 < sum(want) < 900  # both outcomes are well represented
    # Only what is decoded counts: the same answers cut at their fourth token.
    decoded[:, 4:] = False
    cut = [
        s >= 0 and leaves_scope("".join(PIECES[t] for t in row[:4]), s)
        for row, s in zip(x, scope, strict=True)
    ]
    assert ScopeEnd().ended(np, x, decoded, limits).tolist() == cut
