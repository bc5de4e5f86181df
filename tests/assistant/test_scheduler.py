"""The engine thread on the fake runtime: batching, cancellation, budgets, the bounded queue, shutdown."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from assistant.fake_runtime import FakeRuntime
from assistant.job import Job, JobDone, JobError, JobStep
from assistant.scheduler import NotReady, QueueFull, Scheduler, ShuttingDown
from model_runtime.errors import ModelError
from model_runtime.params import SamplingParams


def make_job(rt: FakeRuntime, prompt: str, tokens: int = 8, *, max_seconds: float = 60.0,
             session: str | None = None, **params: Any) -> Job:
    ids = rt.tokenizer.encode(prompt)
    row = rt.make_row(ids, tokens, chat=False)
    params.setdefault("steps", tokens)
    return Job(row=row, params=SamplingParams(max_new_tokens=tokens, **params), chat=False,
               prompt_tokens=len(ids), canvas_tokens=tokens, row_length=len(row.ids), max_seconds=max_seconds,
               session=session)


async def final(job: Job) -> JobDone | JobError:
    async for event in job.events():
        if isinstance(event, JobDone | JobError):
            return event
    raise AssertionError("no final event")


async def first_step(job: Job) -> JobStep:
    async for event in job.events():
        assert isinstance(event, JobStep), event
        return event
    raise AssertionError("no step")


async def started_engine(rt: FakeRuntime, **kwargs: Any) -> Scheduler:
    engine = Scheduler(lambda progress: rt, queue_size=kwargs.pop("queue_size", 16),
                    max_batch=kwargs.pop("max_batch", 16), warmup_params=None)
    ready = asyncio.Event()
    loop = asyncio.get_running_loop()
    engine.add_listener(lambda st: st.stage in ("ready", "failed") and loop.call_soon_threadsafe(ready.set))
    engine.start()
    await ready.wait()
    return engine


def test_queued_jobs_with_equal_params_run_as_one_batch_with_unchanged_results() -> None:
    async def main() -> None:
        rt = FakeRuntime(step_delay=0.01)
        engine = await started_engine(rt)
        blocker = engine.submit(make_job(rt, "block", 8, steps=20))
        await first_step(blocker)  # the engine is busy: the next jobs queue up together
        prompts = [f"def f{i}(x):" for i in range(5)]
        jobs = [engine.submit(make_job(rt, p)) for p in prompts]
        odd = engine.submit(make_job(rt, "other params", steps=4))
        results = await asyncio.gather(*(final(j) for j in jobs))
        await final(odd)
        await final(blocker)
        engine.stop()
        assert rt.runs == [1, 5, 1]  # the blocker, the five together, then the one with other steps
        alone = FakeRuntime()
        for prompt, result in zip(prompts, results, strict=True):
            single = list(alone.run([alone.make_row(alone.tokenizer.encode(prompt), 8, chat=False)],
                                    SamplingParams(max_new_tokens=8, steps=8)))[-1]
            assert isinstance(result, JobDone) and result.text == single.texts[0]
        assert engine.counters["batched_rows"] == 5 and engine.counters["largest_batch"] == 5

    asyncio.run(main())


def test_batches_respect_the_largest_bucket() -> None:
    async def main() -> None:
        rt = FakeRuntime(step_delay=0.005, batch_buckets=(1, 4))
        engine = await started_engine(rt, max_batch=16)
        blocker = engine.submit(make_job(rt, "block", 8, steps=10))
        await first_step(blocker)
        jobs = [engine.submit(make_job(rt, f"p{i}")) for i in range(6)]
        await asyncio.gather(*(final(j) for j in jobs), final(blocker))
        engine.stop()
        assert rt.runs == [1, 4, 2]

    asyncio.run(main())


def test_cancel_between_steps_frees_the_engine_for_the_next_job() -> None:
    async def main() -> None:
        rt = FakeRuntime(step_delay=0.02)
        engine = await started_engine(rt)
        long = engine.submit(make_job(rt, "long", 16, steps=500))  # 10 s if left alone
        await first_step(long)
        t0 = time.monotonic()
        assert engine.cancel(long.id)
        nxt = engine.submit(make_job(rt, "next", 4, steps=2))
        done = await final(long)
        result = await final(nxt)
        engine.stop()
        assert isinstance(done, JobDone) and done.finish_reason == "cancelled" and done.steps_run < 10
        assert isinstance(result, JobDone) and result.finish_reason in ("stop", "length")
        # The next job waited for at most the step in flight (20 ms), not the 10 s the long one needed.
        assert result.stats["queue_seconds"] < 0.5
        assert time.monotonic() - t0 < 1.0
        assert engine.counters["cancelled"] == 1

    asyncio.run(main())


def test_full_queue_is_refused_with_retry_after() -> None:
    async def main() -> None:
        rt = FakeRuntime(step_delay=0.01)
        engine = await started_engine(rt, queue_size=2)
        running = engine.submit(make_job(rt, "run", 8, steps=50))
        await first_step(running)
        queued = [engine.submit(make_job(rt, f"q{i}", steps=2, seed=i)) for i in range(2)]
        with pytest.raises(QueueFull) as info:
            engine.submit(make_job(rt, "one too many"))
        assert info.value.retry_after is not None and info.value.retry_after >= 1
        assert engine.counters["rejected"] == 1
        engine.cancel(running)
        for job in queued:
            assert isinstance(await final(job), JobDone)
        engine.stop()

    asyncio.run(main())


def test_time_budget_ends_with_the_text_unmasked_so_far() -> None:
    async def main() -> None:
        rt = FakeRuntime(step_delay=0.02)
        engine = await started_engine(rt)
        job = engine.submit(make_job(rt, "slow", 32, steps=200, max_seconds=0.1))
        done = await final(job)
        engine.stop()
        assert isinstance(done, JobDone) and done.finish_reason == "time"
        assert done.steps_run < 20
        assert "\u2591" not in done.text and len(done.text) <= 32

    asyncio.run(main())


def test_a_newer_request_of_the_same_session_supersedes_the_older() -> None:
    async def main() -> None:
        rt = FakeRuntime(step_delay=0.01)
        engine = await started_engine(rt)
        old = engine.submit(make_job(rt, "old", 8, steps=300, session="editor:file.py"))
        await first_step(old)
        new = engine.submit(make_job(rt, "new", 8, session="editor:file.py"))
        old_done, new_done = await final(old), await final(new)
        engine.stop()
        assert isinstance(old_done, JobDone) and old_done.finish_reason == "cancelled"
        assert old_done.stats["cancel_reason"] == "superseded"
        assert isinstance(new_done, JobDone) and new_done.finish_reason != "cancelled"

    asyncio.run(main())


def test_a_bad_row_fails_alone_and_its_batch_neighbours_finish() -> None:
    async def main() -> None:
        rt = FakeRuntime(step_delay=0.01, max_context=64)
        engine = await started_engine(rt)
        blocker = engine.submit(make_job(rt, "block", 8, steps=10))
        await first_step(blocker)
        good = engine.submit(make_job(rt, "good"))
        bad = make_job(rt, "x" * 70)  # longer than the context; the HTTP layer would have refused it
        bad.row_length = 10  # lie about it, so the engine batches it
        engine.submit(bad)
        good_done, bad_done = await final(good), await final(bad)
        await final(blocker)
        engine.stop()
        assert isinstance(good_done, JobDone) and good_done.finish_reason != "cancelled"
        assert isinstance(bad_done, JobError) and bad_done.status == 400 and "context" in bad_done.message

    asyncio.run(main())


def test_load_failure_is_reported_and_requests_are_refused() -> None:
    async def main() -> None:
        def loader(progress: Any) -> FakeRuntime:
            progress("reading", 0.5)
            raise ModelError("config.json: hidden_size: missing")

        engine = Scheduler(loader, queue_size=4, max_batch=4, warmup_params=None)
        failed = asyncio.Event()
        loop = asyncio.get_running_loop()
        engine.add_listener(lambda st: st.stage == "failed" and loop.call_soon_threadsafe(failed.set))
        engine.start()
        await failed.wait()
        assert engine.status.error == "config.json: hidden_size: missing"
        with pytest.raises(NotReady):
            engine.submit(make_job(FakeRuntime(), "x"))
        engine.stop()

    asyncio.run(main())


def test_stop_answers_queued_jobs_and_refuses_new_ones() -> None:
    async def main() -> None:
        rt = FakeRuntime(step_delay=0.01)
        engine = await started_engine(rt)
        running = engine.submit(make_job(rt, "run", 8, steps=400))
        await first_step(running)
        queued = engine.submit(make_job(rt, "queued", seed=5))
        await asyncio.to_thread(engine.stop, 5)
        queued_end, running_end = await final(queued), await final(running)
        assert isinstance(queued_end, JobError) and queued_end.status == 503
        assert isinstance(running_end, JobDone) and running_end.finish_reason == "cancelled"
        with pytest.raises(ShuttingDown):
            engine.submit(make_job(rt, "late"))

    asyncio.run(main())


def test_warmup_progress_goes_from_loading_through_compiling_to_ready() -> None:
    async def main() -> None:
        rt = FakeRuntime(batch_buckets=(1, 2), length_buckets=(64,), max_context=64)
        engine = Scheduler(lambda progress: rt, queue_size=4, max_batch=4, warmup_params=SamplingParams())
        seen: list[tuple[str, float]] = []
        ready = asyncio.Event()
        loop = asyncio.get_running_loop()

        def listen(st: Any) -> None:
            seen.append((st.stage, st.progress))
            if st.stage == "ready":
                loop.call_soon_threadsafe(ready.set)

        engine.add_listener(listen)
        engine.start()
        await ready.wait()
        engine.stop()
        stages = [s for s, _ in seen]
        assert stages[0] == "loading" and "compiling" in stages and stages[-2:] == ["ready", "stopping"]
        compiling = [p for s, p in seen if s == "compiling"]
        assert compiling == sorted(compiling) and compiling[-1] == 1.0
        assert engine.max_batch == 2  # clamped to the runtime's largest batch bucket

    asyncio.run(main())
