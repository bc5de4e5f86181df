"""``diffu lsp`` against a daemon serving a tiny random checkpoint on the real JAX runtime.

The model's text is noise (random weights, a 300-token vocabulary), so these tests check what the user
would see of the machinery: a suggestion arrives in the right place, holes are filled in one edit, the
prompt is fitted to the model's 128-token context, and the LSP and HTTP layers cost little beside the
engine. The noise is deterministic (fixed weights, greedy decoding) and not empty at these places: a
test that gets nothing fails, since nothing shown is exactly what a broken path would show. Should a
change of the decoder make the tiny model put end-of-text first here, move the cursor or the holes, not
the assertions. The latency figures are printed (``-s``) for the closing note of the lsp issue.
"""

from __future__ import annotations

import statistics
import time

import pytest
from lsprotocol import types

from tests.lsp.conftest import daemon_counter, wait_for

pytestmark = pytest.mark.asyncio

LONG_FILE = "".join(f"def function_{i}(value):\n    return value * {i} + {i}\n\n\n" for i in range(60))


async def test_inline_completion_fits_a_small_context(lsp, tiny_daemon) -> None:
    """A file far larger than the model's context still gets a suggestion: the windows shrink to fit."""
    session = await lsp("neovim-0.12", daemon=tiny_daemon, settings={"minChars": 1})
    text = LONG_FILE + "def tail(items):\n    total = \n" + LONG_FILE
    line = LONG_FILE.count("\n") + 1
    uri = session.open("long.py", text)
    result = await session.inline(uri, line, 12, invoked=True)
    status = await session.status()
    assert status["max_context"] == 128
    assert status["counters"]["errors"] == 0, session.logs()
    assert result.items, session.logs()
    for item in result.items:
        assert item.range.start == types.Position(line, 12) and item.insert_text.strip()
        assert "\n" not in item.insert_text
    # The model ran once (its time is recorded whether or not it said anything worth showing).
    assert status["counters"]["requests"] == 1 and len(status["timings"]) == 1


async def test_fill_holes_with_the_real_runtime(lsp, tiny_daemon) -> None:
    """Two holes, one edit, filled in one diffusion run (the daemon reports the ``holes`` feature)."""
    session = await lsp("vscode-proposed", daemon=tiny_daemon)
    uri = session.open("h.py", "def f(x):\n    y = <|mask|><|mask|><|mask|>\n    return ???\n")
    requests = daemon_counter(tiny_daemon, "requests")
    edit = await session.command("diffu.fillHoles", uri)
    status = await session.status()
    assert "holes" in status["daemon_features"]
    assert daemon_counter(tiny_daemon, "requests") - requests == 1
    assert edit is not None, session.logs()
    edits = edit["documentChanges"][0]["edits"]
    starts = [(e["range"]["start"]["line"], e["range"]["start"]["character"]) for e in edits]
    assert starts == [(1, 8), (2, 11)]  # both holes, in one edit
    assert all(e["newText"].strip() for e in edits)
    assert all("\n" not in e["newText"] and "<|mask|>" not in e["newText"] for e in edits)
    assert session.applied_edits and status["counters"]["holes_filled"] == 2


async def test_fill_holes_in_a_selection_with_a_hole_outside(lsp, tiny_daemon) -> None:
    """Finding 4 on the one-run path: the hole outside the selection is a mask in the prompt too, so the
    daemon's fills match the prompt's holes, and only the selection's fill is applied."""
    session = await lsp("neovim-0.12", daemon=tiny_daemon)
    text = "x = <|mask|><|mask|>\n\n\ndef f(y):\n    return <|mask|><|mask|><|mask|>\n"
    uri = session.open("h.py", text)
    selection = {"start": {"line": 3, "character": 0}, "end": {"line": 5, "character": 0}}
    requests = daemon_counter(tiny_daemon, "requests")
    edit = await session.command("diffu.fillHoles", uri, selection)
    assert daemon_counter(tiny_daemon, "requests") == requests + 1  # one run
    assert not session.logs(types.MessageType.Error), session.logs()
    assert edit is not None, session.logs()
    (only,) = edit["changes"][uri]
    assert only["range"]["start"] == {"line": 4, "character": 11} and only["newText"].strip()


async def test_every_invoked_request_runs_the_model_and_times_its_parts(lsp, tiny_daemon, capsys) -> None:
    """Invoked requests skip the debounce and the cache, so every one runs the model (a single-line canvas
    of 24 tokens in 12 steps on the tiny checkpoint), and the server times each part of it, one inside the
    other: the engine's time within the daemon's round trip within the handler's. How fast is the
    benchmark's business (``scripts/lsp_latency.py``): the medians are printed, not bounded."""
    session = await lsp("neovim-0.12", daemon=tiny_daemon, settings={"steps": 12, "minChars": 1})
    uri = session.open("bench.py", "import math\n\n\ndef area(r):\n    return math.pi * \n")
    await session.inline(uri, 4, 21, invoked=True)  # warm: connection, learned ratio, compiled program
    await wait_for(lambda: session.client.log_messages, what="the connection")
    walls = []
    for _ in range(15):
        t0 = time.perf_counter()
        await session.inline(uri, 4, 21, invoked=True)
        walls.append((time.perf_counter() - t0) * 1000)
    timings = (await session.status())["timings"][-15:]
    assert len(timings) == 15, "every benchmark request must have been answered by the model"
    engine = [t["engine_ms"] for t in timings]
    daemon = [t["daemon_ms"] for t in timings]
    handler = [t["wall_ms"] for t in timings]
    overhead = [w - e for w, e in zip(walls, engine, strict=True)]
    figures = {
        "request->response (editor)": statistics.median(walls),
        "LSP handler": statistics.median(handler),
        "daemon round trip (HTTP)": statistics.median(daemon),
        "engine (daemon generate_seconds)": statistics.median(engine),
        "LSP + HTTP overhead (editor - engine)": statistics.median(overhead),
    }
    with capsys.disabled():
        print("\ndiffu lsp latency on the tiny checkpoint, median of 15 (ms):")
        for name, value in figures.items():
            print(f"  {name:<40} {value:8.1f}")
    for e, d, h, w in zip(engine, daemon, handler, walls, strict=True):
        assert 0 < e <= d <= h <= w, (e, d, h, w)
