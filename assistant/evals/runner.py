"""Generate answers for benchmark tasks (in this process or through the daemon), run them, score them.

A benchmark run is: a list of generation jobs (one per task and sample), a generator that answers them
in batches, a program per answer, the sandbox, and a report with pass rates beside tokens/s and
seconds of generation, so quality and speed always come from the same run.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

from assistant.evals import humaneval as he
from assistant.evals import judge
from assistant.evals.sandbox import Limits
from assistant.evals.scoring import Advance, Report, score
from assistant.evals.stats import confidence_interval, pass_at_k
from assistant.infill.context import Mode, canvas_tokens, classify
from assistant.infill.postprocess import postprocess, scope_of
from model_runtime import decoders

if TYPE_CHECKING:
    from assistant.daemon_status import DaemonStatus

__all__ = [
    "Advance",
    "DaemonGenerator",
    "Generated",
    "Generator",
    "Job",
    "LocalGenerator",
    "Report",
    "Task",
    "confidence_interval",
    "humaneval_tasks",
    "infill_tasks",
    "line_tasks",
    "pass_at_k",
    "run_benchmark",
    "score",
    "task_file_tasks",
]


@dataclass(frozen=True)
class Job:
    """One generation: a raw prompt (``suffix`` None) or an infill between ``prompt`` and ``suffix``."""

    prompt: str
    tokens: int
    suffix: str | None = None
    chat: bool = False  # the prompt is a chat transcript: cut the answer at end-of-turn too
    seed: int = 0
    # An editor's block or empty-line suggestion: the scope its code must stay in (``block_scope``).
    scope: int | None = None


@dataclass
class Generated:
    text: str
    seconds: float  # this job's share of its batch's generation time
    tokens: int  # the answer's tokens (up to its end of text, or its line's end for one line)
    error: str | None = None
    forwards: int = 0  # forwards of the model its batch ran (each decoder step is one)


class Generator(Protocol):
    """Answers jobs; ``describe`` says what answered (model, device, decoder settings)."""

    def generate(self, jobs: Sequence[Job], advance: Advance) -> list[Generated]: ...

    def describe(self) -> dict[str, Any]: ...


class LocalGenerator:
    """The model in this process, batched: left-padded rows of up to ``batch`` jobs with the same seed.

    The fast decoder needs every row's region in the same columns, so its batches also share the
    number of tokens after the region (infill jobs with different suffix lengths run apart).
    """

    def __init__(self, rt: Any, params: Any, batch: int, note: Callable[[str], None] | None = None) -> None:
        self.rt = rt
        self.params = params
        self.batch = max(1, batch)
        # Told what takes long besides generating (compiling a batch's program), for the progress shown.
        self.note = note or (lambda text: None)

    def describe(self) -> dict[str, Any]:
        return {
            "model": self.rt.info.model_name,
            "device": self.rt.info.device,
            "dtype": self.rt.info.dtype,
            "through": "in-process",
            "sampling": self.params.to_dict(),
        }

    def _row(self, job: Job) -> Any:
        if job.suffix is not None:
            return self.rt.rows.make_infill_row(job.prompt, job.suffix, job.tokens)
        # A chat job's prompt is the template already (its markup is control tokens); a raw one is text,
        # encoded as the daemon's raw route encodes it.
        ids = self.rt.tokenizer.encode(job.prompt) if job.chat else self.rt.rows.encode_prompt(job.prompt)
        return self.rt.rows.make_row(ids, job.tokens, chat=job.chat)

    def generate(self, jobs: Sequence[Job], advance: Advance) -> list[Generated]:
        import dataclasses

        out: list[Generated | None] = [None] * len(jobs)
        groups: dict[tuple, list[tuple[int, Any]]] = {}
        for i, job in enumerate(jobs):
            row = self._row(job)
            if len(row.ids) > self.rt.info.max_context:
                out[i] = Generated(
                    "",
                    0.0,
                    0,
                    f"prompt too long: {len(row.ids)} tokens with the canvas, "
                    f"the model's context is {self.rt.info.max_context}",
                )
                advance(1)
                continue
            # A decoder that runs a batch's regions in the same columns batches rows with as many tokens after
            # theirs (infill suffixes) only.
            after = len(row.ids) - row.region[1] if decoders.get(self.params.decoder).aligned_rows else 0
            groups.setdefault((job.seed, job.tokens, after, job.scope), []).append((i, row))
        for (seed, tokens, _, scope), members in groups.items():
            # Similar lengths together: less padding, and fewer distinct shapes to compile.
            members.sort(key=lambda m: len(m[1].ids))
            steps = min(self.params.steps, tokens)
            params = dataclasses.replace(self.params, seed=seed, max_new_tokens=tokens, steps=steps)
            if scope is not None:
                params = dataclasses.replace(params, block_scope=scope)
            for lo in range(0, len(members), self.batch):
                chunk = members[lo : lo + self.batch]
                rows = [row for _, row in chunk]
                if not self.rt.compiled(rows, params, stream=False):
                    longest = max(len(r.ids) for r in rows)
                    self.note(
                        f"compiling the program for {len(rows)} x {longest} tokens, {params.decoder} decoder"
                    )
                    self.rt.compile(rows, params, stream=False)
                    self.note("")
                done = None
                for event in self.rt.run(rows, params, stream=False):
                    done = event
                assert done is not None, "a run ends with its BatchDone"
                share = done.stats.generate_seconds / len(chunk)
                for k, ((i, row), text) in enumerate(zip(chunk, done.texts, strict=True)):
                    tokens = done.answer_tokens[k] if done.answer_tokens else row.canvas_tokens
                    out[i] = Generated(text, share, tokens, forwards=done.stats.steps)
                advance(len(chunk))
        return [g for g in out if g is not None]


class DaemonGenerator:
    """The running daemon: ``concurrency`` requests in flight, which the daemon batches itself."""

    def __init__(self, config: Any, knobs: dict[str, Any], concurrency: int) -> None:
        self.config = config
        self.knobs = knobs
        self.concurrency = max(1, concurrency)
        self._status: DaemonStatus | None = None  # the daemon's, once a generation asked for it

    def describe(self) -> dict[str, Any]:
        return {
            "model": self._status.model if self._status is not None else None,
            "device": self._status.device if self._status is not None else None,
            "through": "daemon",
            "sampling": self.knobs,
        }

    def generate(self, jobs: Sequence[Job], advance: Advance) -> list[Generated]:
        import threading

        from assistant.client import APIError, Client, SamplingOptions

        local = threading.local()
        clients: list[Client] = []
        lock = threading.Lock()

        def client() -> Client:
            if not hasattr(local, "client"):
                local.client = Client(config=self.config, wait_compiled=False)
                with lock:
                    clients.append(local.client)
            return local.client

        def one(job: Job) -> Generated:
            knobs = {
                **self.knobs,
                "seed": job.seed,
                "steps": min(self.knobs.get("steps") or job.tokens, job.tokens),
            }
            if job.scope is not None:
                knobs["block_scope"] = job.scope
            sampling = SamplingOptions(**knobs)
            try:
                if job.suffix is not None:
                    done = client().infill(
                        job.prompt, job.suffix, canvas_tokens=job.tokens, sampling=sampling
                    )
                else:
                    done = client().generate(prompt=job.prompt, max_new_tokens=job.tokens, sampling=sampling)
            except APIError as exc:
                if exc.status != 400:
                    raise
                advance(1)
                return Generated("", 0.0, 0, exc.message)  # this task's input (too long a prompt)
            advance(1)
            # The daemon reports the time of the batch the request ran in: its share is what the
            # in-process generator counts too, so generate s sums to the device's time, not a multiple.
            stats = done.stats
            share = stats.generate_seconds / max(1, stats.batch_size)
            return Generated(done.text, share, stats.new_tokens or job.tokens, forwards=stats.steps)

        try:
            self._status = client().status()
            with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
                return list(pool.map(one, jobs))
        finally:
            for c in clients:
                c.close()


@dataclass
class Task:
    """What to generate for one benchmark task and how to judge an answer: its ``code`` run against
    the ``suite``'s cases outside the program (``assistant/evals/judge.py``), or its ``program`` (the
    code with its tests) in the fallback, or (``check``, for tasks without tests) the answer itself."""

    task_id: str
    job: Job
    program: Callable[[str], str] | None
    completion: Callable[[str], str] = field(default=lambda text: text)
    check: Callable[[str], bool] | None = None
    code: Callable[[str], str] | None = None
    suite: judge.Suite | judge.Fallback | None = None
    expected: str | None = None  # an infill's hidden lines (the soft scores of ``stats.edit_similarity``)


def humaneval_tasks(problems: Sequence[he.Problem], style: str, tokens: int) -> list[Task]:
    from model_runtime.tokenizer import chat_prompt

    tasks = []
    for p in problems:
        suite = judge.humaneval_suite(p)
        if style == "base":
            tasks.append(Task(p.task_id, Job(p.prompt, tokens), p.program, he.cut_base, None, p.code, suite))
        else:
            prompt = chat_prompt(he.instruct_messages(p)) + he.instruct_response_start()
            job = Job(prompt, tokens, chat=True)
            program, code = partial(he.instruct_program, p), partial(he.instruct_code, p)
            tasks.append(Task(p.task_id, job, program, he.cut_instruct, None, code, suite))
    return tasks


def task_file_tasks(items: Sequence[Any], tokens: int) -> list[Task]:
    """Tasks of an AceCode-format file (``model_runtime.train.rl.tasks``), answered as in coupled-GRPO's
    rollouts: the task's chat prompt; the first ```` ```python ```` block of the answer is the code, which
    passes when every test assert holds (judged against the task's ``solution`` column where it has one,
    else against the asserts' own expected values)."""
    from assistant.evals.rewards import extract_code
    from model_runtime.tokenizer import chat_prompt

    def program(tests: Sequence[str]) -> Callable[[str], str]:
        return lambda code: "\n".join([code, *tests]) + "\n"

    return [
        Task(
            t.task_id,
            Job(chat_prompt(t.messages()), tokens, chat=True),
            program(t.test_cases),
            extract_code,
            None,
            str,
            judge.assert_suite(t.test_cases, t.extra.get("solution")),
        )
        for t in items
    ]


BLOCK_TOKENS = 64  # the editors' canvas for a block (``lsp.settings.Settings.max_tokens``)


def editor_mode(prefix: str, single_line: bool) -> tuple[Mode, str]:
    """The editor's mode for a cursor at the start of an empty line after ``prefix``, and the line above:
    one line (single-line mode), or the mode the server's classifier picks there (a block body after a
    line ending in ``:``, else the next statement)."""
    above = prefix.rstrip("\n").rsplit("\n", 1)[-1]
    return (Mode.SINGLE_LINE if single_line else classify("", "", above)), above


def editor_job(prefix: str, suffix: str, tokens: int | None, single_line: bool) -> Job:
    """An infill as the editor asks it there: a block or an empty line ends where its code leaves the
    cursor's scope (``block_scope``), as the post-processing cuts it; ``tokens`` None: the editor's canvas
    for the mode (an empty line 32, a block 64)."""
    mode, above = editor_mode(prefix, single_line)
    scope = None if single_line else scope_of("", above, mode)
    return Job(prefix, tokens or canvas_tokens(mode, BLOCK_TOKENS), suffix=suffix, scope=scope)


def infill_cleaner(prefix: str, suffix: str, single_line: bool) -> Callable[[str], str]:
    """The language server's post-processing of an infill whose cursor is at the start of an empty line
    after ``prefix`` (``editor_mode``): one line (single-line mode: the text up to its first newline, as
    the single-line infilling benchmarks cut it), a block body, or the next statements."""
    mode, above = editor_mode(prefix, single_line)

    def run(text: str) -> str:
        fill = postprocess(text, suffix=suffix, mode=mode, cursor_line="", line_above=above, min_chars=1)
        return fill or ""

    return run


def infill_tasks(
    items: Sequence[he.InfillTask], tokens: int | None, *, single_line: bool = False
) -> list[Task]:
    """Infill through the editor's path: the daemon's infill canvas, then the LSP's post-processing.

    The hidden lines' place is an empty line with the cursor at its start, as when a user opens a line
    to write (``infill_cleaner``); ``single_line`` (the single-line variant) keeps the fill's first line.
    ``tokens`` None: the editor's canvas for each task's mode, which ends where its scope does
    (``editor_job``).
    """
    return [
        Task(
            t.task_id,
            editor_job(t.prefix, t.suffix, tokens, single_line),
            t.program,
            infill_cleaner(t.prefix, t.suffix, single_line),
            None,
            t.code,
            judge.humaneval_suite(t.problem),
            t.middle,
        )
        for t in items
    ]


def line_tasks(items: Sequence[Any], tokens: int | None, *, single_line: bool = True) -> list[Task]:
    """Held-out infills (``assistant.evals.lines``): the editor's one-line path (or, ``single_line``
    off, its empty-line and block path for the multi-line spans), judged by the fill being the hidden
    lines."""
    return [
        Task(
            t.task_id,
            editor_job(t.prefix, t.suffix, tokens, single_line),
            None,
            infill_cleaner(t.prefix, t.suffix, single_line),
            check=t.correct,
            expected=t.middle,
        )
        for t in items
    ]


def run_benchmark(
    tasks: Sequence[Task],
    generator: Generator,
    *,
    samples: int,
    seed: int,
    ks: Sequence[int],
    limits: Limits,
    workers: int | None,
    progress: Callable[[str, int], Advance],
) -> Report:
    """Generate ``samples`` answers per task (sample j with seed ``seed + j``), then score them."""
    jobs = [
        Job(t.job.prompt, t.job.tokens, t.job.suffix, t.job.chat, seed + j)
        for j in range(samples)
        for t in tasks
    ]
    start = time.perf_counter()
    generated = generator.generate(jobs, progress("generating", len(jobs)))
    wall = time.perf_counter() - start
    per_task = [[generated[j * len(tasks) + i] for j in range(samples)] for i in range(len(tasks))]
    completions = [[t.completion(g.text) for g in gs] for t, gs in zip(tasks, per_task, strict=True)]
    start = time.perf_counter()
    report = score(
        tasks,
        completions,
        ks=ks,
        sandbox_limits=limits,
        workers=workers,
        advance=progress("running tests", len(jobs)),
        gen_seconds=[[g.seconds for g in gs] for gs in per_task],
        errors=[[g.error for g in gs] for gs in per_task],
    )
    tested = time.perf_counter() - start
    gen_s = sum(g.seconds for g in generated)
    ok = [g for g in generated if g.error is None]
    tokens = sum(g.tokens for g in ok)
    forwards = sum(g.forwards for g in ok)
    report.summary.update(
        {
            "generate_seconds": round(gen_s, 3),
            "wall_seconds": round(wall, 3),  # generating, compiles and queueing included
            "test_seconds": round(tested, 3),
            "new_tokens": tokens,
            "tokens_per_second": round(tokens / gen_s, 2) if gen_s > 0 else 0.0,
            # Per answer: the forwards its batch ran (a batch's rows share them), and the answer's tokens
            # per forward (the decoder's parallelism, whatever the batch and the machine).
            "forwards_per_answer": round(forwards / len(ok), 2) if ok else 0.0,
            "tokens_per_forward": round(tokens / forwards, 3) if forwards else 0.0,
            **generator.describe(),
        }
    )
    return report
