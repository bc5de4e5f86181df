"""The engine thread on the fake runtime: batching, cancellation, budgets, the bounded queue, shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import resource
import time
from typing import Any

import pytest

from assistant.config import Config
from assistant.server.fake_runtime import FakeRuntime
from assistant.server.job import Job, JobDone, JobError, JobStep, JobWaiting
from assistant.server.job_builder import warm_task
from assistant.server.scheduler import Scheduler
from assistant.server.status import NotReady, QueueFull, ShuttingDown
from assistant.server.warmup import Shape, WarmTask
from model_runtime.errors import ModelError
from model_runtime.params import SamplingParams
from tests.assistant.helpers import wait_until


def make_job(
    rt: FakeRuntime,
    prompt: str,
    tokens: int = 8,
    *,
    max_seconds: float = 60.0,
    session: str | None = None,
    **params: Any,
) -> Job:
    ids = rt.tokenizer.encode(prompt)
    row = rt.rows.make_row(ids, tokens, chat=False)
    params.setdefault("steps", tokens)
    return Job(
        row=row,
        params=SamplingParams(max_new_tokens=tokens, **params),
        chat=False,
        prompt_tokens=len(ids),
        canvas_tokens=tokens,
        row_length=len(row.ids),
        max_seconds=max_seconds,
        session=session,
    )


async def final(job: Job) -> JobDone | JobError:
    async for event in job.events():
        if isinstance(event, JobDone | JobError):
            return event
    raise AssertionError("no final event")


async def first_step(job: Job) -> JobStep:
    async for event in job.events():
        if isinstance(event, JobWaiting):  # its program compiles first
            continue
        assert isinstance(event, JobStep), event
        return event
    raise AssertionError("no step")


async def started_engine(rt: FakeRuntime, **kwargs: Any) -> Scheduler:
    engine = Scheduler(
        lambda progress: rt,
        queue_size=kwargs.pop("queue_size", 16),
        max_batch=kwargs.pop("max_batch", 16),
        planner=kwargs.pop("planner", None),
    )
    ready = asyncio.Event()
    loop = asyncio.get_running_loop()

    def listen(status: Any) -> None:
        if status.stage in ("compiling", "warming", "ready", "failed"):
            with contextlib.suppress(RuntimeError):  # a compile that outlives the test's event loop
                loop.call_soon_threadsafe(ready.set)

    engine.add_listener(listen)
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
            single = list(
                alone.run(
                    [alone.rows.make_row(alone.tokenizer.encode(prompt), 8, chat=False)],
                    SamplingParams(max_new_tokens=8, steps=8),
                )
            )[-1]
            assert isinstance(result, JobDone) and result.text == single.texts[0]
        assert engine.counters.batched_rows == 5 and engine.counters.largest_batch == 5

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
        assert engine.cancel(long.id)
        nxt = engine.submit(make_job(rt, "next", 4, steps=2))
        done = await final(long)
        result = await final(nxt)
        engine.stop()
        assert isinstance(done, JobDone) and done.finish_reason == "cancelled" and done.steps_run < 10
        assert isinstance(result, JobDone) and result.finish_reason in ("stop", "length")
        # Counted, not timed: the long job stopped at the step in flight, nowhere near its 500; the next
        # job ran its 2.
        assert rt.forwards < 50, rt.forwards
        assert engine.counters.cancelled == 1

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
        assert engine.counters.rejected == 1
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
        assert old_done.stats.cancel_reason == "superseded"
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

        engine = Scheduler(loader, queue_size=4, max_batch=4)
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


def warm_tasks(rt: FakeRuntime, *shapes: Shape) -> list[WarmTask]:
    return [warm_task(rt, shape, Config()) for shape in shapes]


def test_warmup_progress_goes_from_loading_through_compiling_and_warming_to_ready() -> None:
    async def main() -> None:
        rt = FakeRuntime(batch_buckets=(1, 2), length_buckets=(32, 64), max_context=64, warmup_delay=0.01)
        plan = warm_tasks(rt, Shape(8, 16), Shape(40, 16), Shape(40, 16, batch=2), Shape(8, 16))
        plan[0] = dataclasses.replace(plan[0], ready=True)  # the chat's first program
        engine = Scheduler(lambda progress: rt, queue_size=4, max_batch=4, planner=lambda runtime: plan)
        seen: list[tuple[str, float, str, float | None]] = []
        ready = asyncio.Event()
        loop = asyncio.get_running_loop()

        runs_when: dict[str, int] = {}

        def listen(st: Any) -> None:
            seen.append((st.stage, st.progress, st.detail, st.eta_seconds))
            runs_when.setdefault(st.stage, len(rt.runs))
            if st.stage == "ready":
                loop.call_soon_threadsafe(ready.set)

        engine.add_listener(listen)
        engine.start()
        await ready.wait()
        assert engine.status.warmed == 4 and engine.max_batch == 2  # clamped to the largest batch bucket
        engine.stop()
        stages = [s for s, *_ in seen]
        assert stages[0] == "loading" and stages[-2:] == ["ready", "stopping"]
        # Serving from "compiling" on; "warming" only once the chat's first program is in.
        assert list(dict.fromkeys(stages)) == ["loading", "compiling", "warming", "ready", "stopping"]
        compiling = [d for s, _, d, _ in seen if s == "compiling"]
        assert compiling[0] == "compiling the clients' first programs (0 of 1)"
        warming = [(p, d, eta) for s, p, d, eta in seen if s == "warming"]
        assert list(dict.fromkeys(d for _, d, _ in warming)) == [
            "warming (1 of 4)",
            "warming (2 of 4)",
            "warming (3 of 4)",
        ]
        assert [p for p, _, _ in warming] == sorted(p for p, _, _ in warming)
        # No estimate before one compile was timed, one after it.
        assert [eta for s, _, _, eta in seen if s == "compiling"][0] is None and warming[-1][2] is not None
        assert len(rt.programs) == 3  # the fourth shape's program was the first's: found compiled
        # Each program compiled by the warm-up ran once on made-up rows (its first run costs more than the
        # next, so a request does not pay it); the chat's before "warming" (ready) was said.
        assert rt.runs == [1, 1, 2] and runs_when["warming"] == 1

    asyncio.run(main())


def test_ready_is_said_only_once_every_warm_up_task_is_done() -> None:
    # The last task is found compiled already (the first's program) while the first still has its first
    # run on the device thread: "ready" must wait for that run, not come with 1 of 2 warmed.
    async def main() -> None:
        class FirstRunFirst(FakeRuntime):
            def compiled(self, rows: Any, params: SamplingParams, *, stream: bool = True) -> bool:
                if self.programs:  # the second task: checked once the first one's first run is under way
                    assert wait_until(lambda: ("run", 1) in self.log, 5)
                return super().compiled(rows, params, stream=stream)

        rt = FirstRunFirst(step_delay=0.3, warmup_delay=0.05, length_buckets=(16, 32))
        plan = warm_tasks(rt, Shape(8, 8), Shape(8, 8))
        engine = Scheduler(lambda progress: rt, queue_size=4, max_batch=4, planner=lambda runtime: plan)
        seen: list[tuple[str, int, int]] = []
        ready = asyncio.Event()
        loop = asyncio.get_running_loop()

        def listen(st: Any) -> None:
            seen.append((st.stage, st.warmed, st.shapes))
            if st.stage == "ready":
                loop.call_soon_threadsafe(ready.set)

        engine.add_listener(listen)
        engine.start()
        await ready.wait()
        assert engine.status.warmed == engine.status.shapes == 2
        engine.stop()
        assert [s for s in seen if s[0] == "ready"] == [("ready", 2, 2)]
        assert rt.runs == [1]  # the program ran once: the second task found it compiled and primed

    asyncio.run(main())


def test_a_request_is_served_while_the_warm_up_goes_on_and_waits_for_its_own_program_only() -> None:
    async def main() -> None:
        rt = FakeRuntime(step_delay=0.001, warmup_delay=0.4, length_buckets=(16, 32, 64, 128, 256, 512))
        plan = warm_tasks(rt, *(Shape(n - 8, 8) for n in (16, 32, 64, 128, 256, 512)))  # 2.4 s of compiles
        engine = await started_engine(rt, planner=lambda runtime: plan)

        def compiling() -> Any:  # the warm-up compile under way, if one is
            started = [k for e, k in list(rt.log) if e == "compile"]
            return started[-1] if started and ("compiled", started[-1]) not in rt.log else None

        while compiling() is None:
            await asyncio.sleep(0.01)
        in_progress = compiling()
        assert engine.status.stage == "warming"
        t0 = time.monotonic()
        # Another shape than any of the plan: it compiles its own program beside the one in progress.
        job = engine.submit(make_job(rt, "def f(x):", 8, temperature=0.5))
        alive = ("compiled", in_progress) not in rt.log  # still compiling when the job came
        events = [e async for e in job.events()]
        waited = time.monotonic() - t0
        assert engine.status.stage == "warming" and engine.status.warmed < len(plan)  # before its end
        reasons = [e.reason for e in events if isinstance(e, JobWaiting)]
        assert reasons == ["compiling"]  # its own program, said once; never the warm-up's
        done = events[-1]
        assert isinstance(done, JobDone) and done.finish_reason in ("stop", "length")
        # Its own compile began before the one in progress ended: beside it, not after it (in order, not
        # in time).
        own = rt._programs([job.row], job.params, True)
        if alive:
            # On a busy machine the warm-up's compile (at a lower priority) may still be under way now:
            # then it has not ended yet, and the job's began before its end all the same.
            log = list(rt.log)
            end = log.index(("compiled", in_progress)) if ("compiled", in_progress) in log else len(log)
            assert log.index(("compile", own)) < end
        # Its time and rate count generation only: the compile is reported apart, so the two add up to no
        # more than the time it took.
        assert done.stats.compile_seconds >= 0.4 and done.stats.compiled_programs == 1
        assert done.stats.compile_seconds + done.stats.generate_seconds <= waited
        engine.stop()

    asyncio.run(main())


def test_a_request_whose_program_is_in_starts_during_a_warm_up_compile() -> None:
    async def main() -> None:
        rt = FakeRuntime(step_delay=0.001, warmup_delay=1.0, length_buckets=(16, 32, 64))
        plan = warm_tasks(rt, Shape(8, 8), *(Shape(n - 8, 8, infill=True) for n in (16, 32, 64)))
        plan[0] = dataclasses.replace(plan[0], ready=True)
        engine = await started_engine(rt, planner=lambda runtime: plan)
        while engine.status.stage != "warming" or not engine.status.compiling:  # an editor compile runs
            await asyncio.sleep(0.01)
        job = engine.submit(make_job(rt, "a" * 4, 8))  # the chat's shape (bucket 16), compiled
        events = [e async for e in job.events()]
        assert not [e for e in events if isinstance(e, JobWaiting)]
        assert isinstance(events[-1], JobDone) and events[-1].stats.compiled_programs == 0
        assert engine.status.compiling and "infill" in engine.status.compiling  # still compiling
        engine.stop()

    asyncio.run(main())


def test_a_request_needing_the_program_the_warm_up_compiles_waits_for_that_compile_only() -> None:
    async def main() -> None:
        rt = FakeRuntime(step_delay=0.001, warmup_delay=0.6, length_buckets=(16, 32))
        plan = warm_tasks(rt, Shape(8, 8))
        engine = await started_engine(rt, planner=lambda runtime: plan)
        while not engine.status.compiling:
            await asyncio.sleep(0.01)
        job = engine.submit(make_job(rt, "a" * 4, 8))  # the program being compiled
        done = await final(job)
        assert isinstance(done, JobDone)
        # It waited for the warm-up's compile; nothing was compiled twice.
        assert done.stats.compiled_programs == 0 and done.stats.compile_seconds > 0.1
        assert len(rt.programs) == 1
        engine.stop()

    asyncio.run(main())


def test_the_warm_up_starts_no_compile_while_a_request_runs() -> None:
    async def main() -> None:
        rt = FakeRuntime(step_delay=0.02, warmup_delay=0.2, length_buckets=(16, 32, 64, 128))
        engine = await started_engine(rt)  # no plan: the warm-up starts with the request below
        rt.compile([make_job(rt, "a" * 4, 8).row], SamplingParams(max_new_tokens=8, steps=20))
        starts: list[float] = []
        engine.add_listener(lambda st: st.compiling and starts.append(time.monotonic()))
        job = engine.submit(make_job(rt, "a" * 4, 8, steps=20))  # 0.4 s of steps
        await first_step(job)
        engine.warm(warm_tasks(rt, *(Shape(n - 8, 8, infill=True) for n in (16, 32))))
        await final(job)
        ended = time.monotonic()
        while engine.status.stage != "ready":
            await asyncio.sleep(0.02)
        engine.stop()
        assert starts and min(starts) >= ended - 0.05  # both compiles after the request's last step

    asyncio.run(main())


def test_warm_requests_go_ahead_of_the_generic_warm_up() -> None:
    async def main() -> None:
        rt = FakeRuntime(warmup_delay=0.05, length_buckets=(16, 32, 64, 128))
        plan = warm_tasks(rt, *(Shape(n - 8, 8) for n in (16, 32, 64, 128)))
        engine = await started_engine(rt, planner=lambda runtime: plan)
        order: list[str] = []
        engine.add_listener(
            lambda st: st.compiling and st.compiling not in order and order.append(st.compiling)
        )
        mine = warm_tasks(rt, Shape(3, 4, infill=True, sampling={"temperature": 0.2}))
        assert engine.warm(mine) == 1
        while engine.status.stage != "ready":
            await asyncio.sleep(0.02)
        assert engine.status.warmed == engine.status.shapes == 5
        engine.stop()
        # Next after the task compiling when the request came (if the first had started yet).
        mine_at = next(i for i, what in enumerate(order) if mine[0].label in what)
        assert mine_at <= 1 and len(order) == 5

    asyncio.run(main())


def test_stop_does_not_wait_for_a_compile_it_cannot_interrupt() -> None:
    async def main() -> None:
        rt = FakeRuntime(warmup_delay=1.5)
        plan = warm_tasks(rt, Shape(8, 8))
        engine = Scheduler(lambda progress: rt, queue_size=4, max_batch=4, planner=lambda runtime: plan)
        engine.start()
        while not engine.status.compiling:
            await asyncio.sleep(0.01)
        t0 = time.monotonic()
        await asyncio.to_thread(engine.stop, 30)
        assert time.monotonic() - t0 < 0.5 and engine.abandoned  # serve exits without finalizing then

    asyncio.run(main())


def test_a_request_waiting_for_a_warm_up_compile_of_its_program_gives_that_thread_its_priority_back() -> None:
    # The warm-up compiles at niceness 15 once the clients' first programs are in; a request that needs the
    # program being compiled waits for that compile, which at a load of 8 took minutes at that priority (a
    # fresh-clone CI run beside a CPU-burning loop: the chat's answer still compiling after 60 s).
    base = os.getpriority(os.PRIO_PROCESS, 0)
    if os.geteuid() != 0 and resource.getrlimit(resource.RLIMIT_NICE)[0] < 20 - base:
        pytest.skip("raising a thread's priority back needs root or RLIMIT_NICE (CI runs as root)")

    async def main() -> None:
        rt = FakeRuntime(step_delay=0.001, warmup_delay=1.5, length_buckets=(16, 32))
        plan = warm_tasks(rt, Shape(8, 8), Shape(20, 8))
        engine = await started_engine(rt, planner=lambda runtime: plan)
        while not engine.status.compiling:
            await asyncio.sleep(0.01)
        (thread,) = engine.warm_up.threads
        assert thread.native_id is not None

        def niceness() -> int:
            return os.getpriority(os.PRIO_PROCESS, thread.native_id or 0)

        lowered = min(19, base + 15)
        assert niceness() == lowered
        job = engine.submit(make_job(rt, "a" * 4, 8))  # the program the warm-up compiles
        restored = False
        while not rt.programs:  # the warm-up's compile of that program goes on
            restored = restored or niceness() == base
            await asyncio.sleep(0.01)
        assert restored
        done = await final(job)
        assert isinstance(done, JobDone) and done.stats.compiled_programs == 0
        # The next warm-up task (another bucket) lowers it again.
        again = False
        while len(rt.programs) < 2:
            again = again or niceness() == lowered
            await asyncio.sleep(0.01)
        assert again
        engine.stop()

    asyncio.run(main())
