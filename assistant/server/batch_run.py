"""One canvas batch on the device thread: the runtime's batch events become each job's own events.

The scheduler (``assistant.server.scheduler``) decides *which* jobs run together and when; this module runs
them. It compiles the batch's programs if they are missing (telling each job it waits), runs the batch,
hands every job its step events, drops a job that was cancelled or ran out of its time budget at the
next step boundary, and ends each job with exactly one ``JobDone`` or ``JobError``. When no job of the
batch is left it closes the runtime's generator, which stops the device work before the next step.

``counters`` are the scheduler's totals (``/v1/diffu/status``); these functions add to them.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence

from assistant.server.job import Job, JobDone, JobError, JobStep, JobWaiting
from assistant.wire import DaemonCounters, ErrorType
from model_runtime.errors import InputError
from model_runtime.interface import BatchDone, BatchStep, CanvasRow, CompileReport, RuntimeProtocol
from model_runtime.params import SamplingParams

log = logging.getLogger("diffu.engine")

Compile = Callable[[Sequence[CanvasRow], SamplingParams, str], CompileReport]
"""``compile(rows, params, what)``: compile what the batch needs, showing ``what`` in the status."""


def run_batch(
    runtime: RuntimeProtocol,
    jobs: list[Job],
    counters: DaemonCounters,
    compile: Compile,
    waiting_estimate: Callable[[], float | None],
    ran: Callable[[float], None],
) -> None:
    """Run ``jobs`` (same sampling parameters, rows that fit one bucket) as one canvas batch.

    ``waiting_estimate()`` is the seconds one compile is expected to take; ``ran(seconds)`` is told how long
    each batch that started ran, compiling not included (for the scheduler's Retry-After estimate).
    """
    _count(counters, jobs)
    rows, params = [j.row for j in jobs], jobs[0].params
    try:
        t0 = _compile_and_start(runtime, jobs, compile, waiting_estimate)
        # An event per forward, whether or not a client reads them: a job cancelled meanwhile (its client
        # gone, a newer request of its session) stops the device work within two forwards.
        gen = runtime.run(rows, params)
    except InputError as exc:
        if len(jobs) > 1:
            # One bad row must not fail its neighbours: run each alone so only it gets the error.
            for job in jobs:
                run_batch(runtime, [job], counters, compile, waiting_estimate, ran)
            return
        counters.failed += 1
        jobs[0].emit(JobError(400, str(exc), ErrorType.INVALID_REQUEST, param=exc.field, details=exc.details))
        return
    active = dict(enumerate(jobs))
    steps_run = 0
    forwards = runtime.forwards
    try:
        for event in gen:
            if isinstance(event, BatchStep):
                steps_run = event.step + 1
                _hand_out_step(runtime, counters, active, event, time.monotonic() - t0, len(jobs))
                if not active:
                    break  # everyone left: closing the generator stops the device work
            elif isinstance(event, BatchDone):
                for i, job in active.items():
                    finish_done(runtime, counters, job, event, i, len(jobs))
                active.clear()
    finally:
        gen.close()  # after this the device is idle: a forward queued ahead has run and been counted
        counters.forwards += runtime.forwards - forwards
        ran(time.monotonic() - t0)
    for job in active.values():
        # The runtime ended without a BatchDone: report it rather than leave the client waiting.
        counters.failed += 1
        job.emit(
            JobError(500, f"the runtime stopped after {steps_run} steps without a result", ErrorType.SERVER)
        )


def _count(counters: DaemonCounters, jobs: list[Job]) -> None:
    counters.batches += 1
    counters.rows += len(jobs)
    if len(jobs) > 1:
        counters.batched_rows += len(jobs)
    counters.largest_batch = max(counters.largest_batch, len(jobs))


def _compile_and_start(
    runtime: RuntimeProtocol, jobs: list[Job], compile: Compile, waiting_estimate: Callable[[], float | None]
) -> float:
    """Compile the batch's programs if they are missing (telling each job it waits), then mark the jobs
    started; returns the start (monotonic seconds). InputError for rows the runtime refuses."""
    rows, params = [j.row for j in jobs], jobs[0].params
    compiled = CompileReport()
    if not runtime.compiled(rows, params):
        # Only this batch's programs, now: the warm-up may come to them much later.
        what = f"{len(rows)} x {max(j.row_length for j in jobs)} tokens, {params.decoder} decoder"
        for job in jobs:
            job.emit(JobWaiting("compiling", f"compiling the program for {what}", waiting_estimate()))
        # The status says what is compiled for whom: the requests, and what kind each is.
        whom = ", ".join(f"{j.id} ({'chat' if j.chat else j.kind})" for j in jobs)
        compiled = compile(rows, params, f"{whom}: {what}")
    t0 = time.monotonic()
    for job in jobs:
        job.started = t0
        job.compiled = compiled
    return t0


def _hand_out_step(
    runtime: RuntimeProtocol,
    counters: DaemonCounters,
    active: dict[int, Job],
    event: BatchStep,
    elapsed: float,
    batch_size: int,
) -> None:
    """Each active job's part of a batch step: to the job, or its end (cancelled, or out of time: then
    it leaves ``active``)."""
    mask_id = runtime.rows.tokenizer.mask_id
    for i, job in list(active.items()):
        step = JobStep(
            event.step,
            event.steps,
            list(event.canvas[i]),
            list(event.unmasked[i]),
            _masks_left(event, i, mask_id),
            event.seconds,
            event.block,
            event.blocks,
        )
        if job.cancelled:
            finish_cancelled(counters, job, step.ids, event.step + 1)
            del active[i]
        elif elapsed > job.max_seconds and event.step + 1 < event.steps:
            finish_partial(runtime, counters, job, step, batch_size=batch_size)
            del active[i]
        elif job.want_steps:
            job.emit(step)


# -- endings -------------------------------------------------------------------------------------------
def finish_done(
    runtime: RuntimeProtocol, counters: DaemonCounters, job: Job, event: BatchDone, i: int, batch_size: int
) -> None:
    ids = list(event.generated[i])
    stops = set(runtime.rows.tokenizer.stop_ids(chat=job.chat))
    cut = next((k for k, t in enumerate(ids) if t in stops), None)
    new_tokens = len(ids) if cut is None else cut
    if event.answer_tokens:  # the runtime's count: a single-line answer ends at its newline
        new_tokens = event.answer_tokens[i]
        cut = None if new_tokens == len(ids) else new_tokens
    counters.completed += 1
    counters.generated_tokens += new_tokens
    stats = job.stats(steps=event.stats.steps, new_tokens=new_tokens, batch_size=batch_size, done=event.stats)
    reason = "length" if cut is None else "stop"
    job.emit(JobDone(event.texts[i], ids, reason, new_tokens, event.stats.steps, stats))


def finish_partial(
    runtime: RuntimeProtocol, counters: DaemonCounters, job: Job, step: JobStep, *, batch_size: int
) -> None:
    """Out of time: answer with the text committed so far, left to right up to the first mask."""
    tok = runtime.rows.tokenizer
    stops = set(tok.stop_ids(chat=job.chat)) | {tok.mask_id}
    cut = next((k for k, t in enumerate(step.ids) if t in stops), len(step.ids))
    counters.timed_out += 1
    counters.generated_tokens += cut
    stats = job.stats(steps=step.step + 1, new_tokens=cut, batch_size=batch_size)
    log.info(
        "job %s hit its time budget (%.1fs) after %d/%d steps",
        job.id,
        job.max_seconds,
        step.step + 1,
        step.steps,
    )
    job.emit(JobDone(tok.decode(step.ids[:cut]), step.ids, "time", cut, step.step + 1, stats))


def finish_cancelled(counters: DaemonCounters, job: Job, ids: list[int], steps_run: int) -> None:
    counters.cancelled += 1
    log.info("job %s cancelled (%s) after %d steps", job.id, job.cancel_reason, steps_run)
    stats = dataclasses.replace(
        job.stats(steps=steps_run, new_tokens=0, batch_size=0), cancel_reason=job.cancel_reason
    )
    job.emit(JobDone("", ids, "cancelled", 0, steps_run, stats))


def _masks_left(event: BatchStep, i: int, mask_id: int) -> int:
    if event.masks_left:
        return int(event.masks_left[i])
    return sum(1 for t in event.canvas[i] if t == mask_id)
