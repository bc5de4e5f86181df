"""A job that does not stream, superseded while it runs on the real (tiny) model, stops within two
forwards with either fast decoder, counted by the daemon's ``forwards`` counter (issue #34, finding F;
the reference decoder runs one call per step anyway)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from assistant.server.job import Job, JobDone
from model_runtime.interface import BatchEvents, BatchStep, CanvasRow
from model_runtime.params import SamplingParams
from tests.assistant.test_scheduler import final, started_engine

CANCEL_AFTER = 3  # the newer request arrives as forward 3 ends


class Superseded:
    """The real runtime; ``on_step(step)`` is told of each forward's event before the scheduler sees it."""

    def __init__(self, runtime: Any) -> None:
        self._runtime = runtime
        self.on_step: Callable[[int], None] = lambda step: None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runtime, name)

    def run(self, rows: Sequence[CanvasRow], params: SamplingParams, *, stream: bool = True) -> BatchEvents:
        events = self._runtime.run(rows, params, stream=stream)

        def relay() -> BatchEvents:
            try:
                for event in events:
                    if isinstance(event, BatchStep):
                        self.on_step(event.step)
                    yield event
            finally:
                events.close()

        return relay()


def job(rt: Any, prompt: str, tokens: int, params: SamplingParams, *, stream: bool) -> Job:
    ids = rt.tokenizer.encode(prompt)
    row = rt.rows.make_row(ids, tokens, chat=False)
    return Job(
        row=row,
        params=params,
        chat=False,
        prompt_tokens=len(ids),
        canvas_tokens=tokens,
        row_length=len(row.ids),
        max_seconds=600.0,
        session="editor:a.py",
        want_steps=stream,
    )


@pytest.mark.parametrize("decoder", ["fast", "sliding"])
def test_a_superseded_job_that_does_not_stream_stops_within_two_forwards(runtime, decoder):
    # One token per forward (threshold 1), 32 of them in one block: left alone it runs 32 forwards.
    params = SamplingParams(
        max_new_tokens=32, steps=32, decoder=decoder, block_length=32, window=32, threshold=1.0
    )
    rt = Superseded(runtime)

    async def main() -> tuple[JobDone, JobDone, int]:
        engine = await started_engine(rt)
        old = job(rt, "def f(x):", 32, params, stream=False)
        short = SamplingParams(max_new_tokens=4, steps=4, decoder=decoder)
        newer = job(rt, "def g(y):", 4, short, stream=True)

        def arrive(step: int) -> None:
            if step == CANCEL_AFTER and not newer.id:  # once: the newer job's own steps pass here too
                engine.submit(newer)

        rt.on_step = arrive
        engine.submit(old)
        old_done, new_done = await final(old), await final(newer)
        engine.stop()
        return old_done, new_done, engine.counters.forwards

    old_done, new_done, forwards = asyncio.run(main())
    assert isinstance(old_done, JobDone) and old_done.finish_reason == "cancelled"
    assert old_done.stats.cancel_reason == "superseded"
    assert isinstance(new_done, JobDone) and new_done.finish_reason != "cancelled"
    # The old job ran forwards 0..CANCEL_AFTER before the newer request came, then at most two more
    # (the one running when it came, and one queued ahead); the counter holds the newer job's too.
    ran = forwards - new_done.steps_run
    assert old_done.steps_run == CANCEL_AFTER + 1
    assert CANCEL_AFTER + 1 <= ran <= CANCEL_AFTER + 3
