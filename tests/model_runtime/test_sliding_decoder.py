"""The sliding decoder: a per-row window over the DualCache, early stop, commit rules, batching, streaming."""

from __future__ import annotations

import dataclasses

import pytest

from model_runtime import SamplingParams

# Each method the decoder offers, with a setting that makes it do something on a random tiny model;
# sampled, so that the same answer alone, in a batch and streamed also shows the draws are the seed's.
METHODS = {
    "threshold": dict(window=8, temperature=0.8),
    "factor": dict(window=16, factor=2.0, temperature=0.8),
    "credit": dict(window=8, commit_rule="credit", threshold=0.3, temperature=0.8),
    "refresh": dict(window=8, refresh_every=3, threshold=0.5, temperature=0.8),
}


def sliding(max_new_tokens: int = 24, **kw: object) -> SamplingParams:
    return SamplingParams(max_new_tokens=max_new_tokens, decoder="sliding", **kw)


def rows_of(rt):
    """An infill row, a generation row and a second infill row whose region sits in other columns."""
    tok = rt.tokenizer
    return [
        rt.rows.make_infill_row("def f(x):\n    y = x + 1\n", "\n    return y\n", 20),
        rt.rows.make_row(tok.encode("import os\nimport sys\n"), 20, chat=False),
        rt.rows.make_infill_row("class A:\n", "\n\nprint(A())\n", 20),
    ]


def last(events):
    return list(events)[-1]


@pytest.mark.parametrize("method", sorted(METHODS))
def test_each_method_is_batch_invariant_streams_the_same_and_commits_every_forward(runtime, method):
    rows = rows_of(runtime)
    params = sliding(**METHODS[method])
    fused = list(runtime.run(rows, params, stream=False))
    assert len(fused) == 1  # one program call, one host sync: only the result comes back
    done = fused[0]
    mask = runtime.tokenizer.mask_id
    for i, row in enumerate(rows):
        alone = last(runtime.run([row], params, stream=False))
        assert alone.generated[0] == done.generated[i], f"row {i} differs alone and in the batch"
        assert mask not in done.generated[i]
    streamed = list(runtime.run(rows, params))
    steps = streamed[:-1]
    assert streamed[-1].generated == done.generated and streamed[-1].stats.steps == done.stats.steps
    # One event per forward, numbered in order, never more than one per position. Every forward commits
    # at least one position of every row until the row is done: its masks are filled, or its text has
    # ended (then its last masks became padding).
    assert [s.step for s in steps] == list(range(done.stats.steps)) and done.stats.steps <= 20
    for i in range(len(rows)):
        busy = [bool(s.unmasked[i]) for s in steps]
        ran = busy.index(False) if False in busy else len(busy)
        assert ran >= 1 and not any(busy[ran:])
        if steps[ran - 1].masks_left[i]:
            assert done.answer_tokens[i] < rows[i].canvas_tokens  # it stopped at its end of text


def test_same_seed_same_answer_other_seed_other_answer(runtime):
    rows = rows_of(runtime)[:1]
    params = sliding(window=8, temperature=1.0, top_k=0, seed=3)
    first = last(runtime.run(rows, params, stream=False)).generated
    assert last(runtime.run(rows, params, stream=False)).generated == first
    other = last(runtime.run(rows, dataclasses.replace(params, seed=4), stream=False)).generated
    assert other != first


def test_lower_threshold_means_fewer_forwards(runtime):
    rows = rows_of(runtime)[:1]
    strict = last(runtime.run(rows, sliding(window=8, threshold=1.0), stream=False))
    loose = last(runtime.run(rows, sliding(window=8, threshold=0.01), stream=False))
    assert loose.stats.steps < strict.stats.steps


def test_one_line_stops_once_the_line_is_written_and_keeps_it(runtime, monkeypatch):
    """A single-line request ends where the full decode's first line ends, with the same tokens, in
    fewer forwards; the positions left after the line become padding and the text ends at the line."""
    tok = runtime.tokenizer
    row = rows_of(runtime)[0]
    full = last(runtime.run([row], sliding(window=8), stream=False))
    region = full.generated[0]
    # Call a token of the full answer a newline: the first one not seen before position 5.
    j = next(k for k in range(5, len(region)) if region[k] not in region[:k])
    newlines = [0] * runtime.config.vocab_size
    newlines[region[j]] = 1
    monkeypatch.setattr(tok, "newlines", lambda: tuple(newlines))
    text = lambda ids, **kw: "".join("\n" if t == region[j] else "a" for t in ids)  # noqa: E731
    monkeypatch.setattr(tok, "decode", text)
    one = last(runtime.run([row], sliding(window=8, max_lines=1), stream=False))
    assert one.generated[0][: j + 1] == region[: j + 1]
    # After the line: what the same forwards committed, the rest padding.
    pad = runtime.config.pad_token_id
    assert all(t in (pad, f) for t, f in zip(one.generated[0][j + 1 :], region[j + 1 :], strict=True))
    assert pad in one.generated[0][j + 1 :]
    assert one.stats.steps < full.stats.steps
    assert one.texts[0] == "a" * j and one.answer_tokens == [j + 1]


def test_each_row_stops_at_its_own_end_of_text(runtime, monkeypatch):
    rows = rows_of(runtime)[:2]
    full = last(runtime.run(rows, sliding(window=8), stream=False))
    # A token of the second row's answer ends text: each row keeps its full decode up to that token and
    # leaves the rest (padding, or what it had committed in the same forwards).
    end = full.generated[1][3]
    monkeypatch.setattr(runtime.tokenizer, "stop_ids", lambda chat: (end,))
    stopped = last(runtime.run(rows, sliding(window=8), stream=False))
    pad = runtime.config.pad_token_id
    for i in range(2):
        cut = full.generated[i].index(end) if end in full.generated[i] else len(full.generated[i])
        assert stopped.generated[i][: cut + 1] == full.generated[i][: cut + 1]
        after = zip(stopped.generated[i][cut + 1 :], full.generated[i][cut + 1 :], strict=True)
        assert all(t in (pad, f) for t, f in after)
        assert stopped.answer_tokens[i] == cut
    assert stopped.stats.steps <= full.stats.steps


def test_a_window_larger_than_a_small_bucket_takes_a_larger_bucket(runtime):
    row = runtime.rows.make_row(runtime.tokenizer.encode("x"), 4, chat=False)  # 5 tokens: bucket 32
    done = last(runtime.run([row], sliding(max_new_tokens=4, window=64), stream=False))
    assert done.stats.bucket == (1, 128) and runtime.tokenizer.mask_id not in done.generated[0]
