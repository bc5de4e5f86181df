"""Helpers for the chat tests: an in-process stand-in for the daemon, and Pilot helpers.

The scripted backend is the daemon's own pipeline minus HTTP: the fake runtime
(``assistant.server.fake_runtime``) builds the chat row and unmasks it step by step, and the daemon's
``Pieces`` renders each step into the canvas text and spans the real SSE stream carries. Only the answers
are scripted (so tests can put Markdown and code blocks in them) and every step reports
``step_seconds``, so tokens/s in snapshots is stable.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from textual.pilot import Pilot
from textual.widgets import Markdown

from assistant.client import APIError, DaemonUnavailable, Done, Step, Waiting
from assistant.infill.holes import FillOptions
from assistant.server.fake_runtime import EOS_ID, IM_END_ID, FakeRuntime
from assistant.server.http.native import Pieces
from assistant.wire import DoneStats
from model_runtime.interface import BatchDone, BatchStep, CanvasRow
from model_runtime.params import SamplingParams
from model_runtime.rows import mask_runs
from tui.settings import ChatSettings
from tui.widgets import AnswerView, ConnectPanel, PromptInput

ANSWER = """Here is a function that adds two numbers:

```python
def add(a, b):
    return a + b
```

Call it as `add(2, 3)`."""

# What a small model writes too often: a def line without its colon (the chat decodes it again).
BROKEN = """Here is the function:

```python
def add(a, b)
    return a + b
```"""

SECOND = """A faster way to sum a list:

```python
total = sum(values)
```"""


class ScriptedRuntime(FakeRuntime):
    """The fake runtime with chosen answers: the next one in ``answers`` for every new row."""

    def __init__(self, answers: list[str]) -> None:
        super().__init__(max_context=8192)  # room for long test conversations
        self.scripted = itertools.cycle(answers)

    def answer(self, row: CanvasRow, params: SamplingParams) -> list[int]:
        ids = self.tokenizer.encode(next(self.scripted))[: row.canvas_tokens]
        return ids + [IM_END_ID] * (row.canvas_tokens - len(ids))


@dataclass
class Request:
    messages: list[dict[str, str]]
    params: dict[str, Any]
    session: str | None


@dataclass
class ScriptedBackend:
    """Implements ``tui.backend.Backend``. ``pause_at``: stop after that step until ``resume`` is set."""

    answers: list[str] = field(default_factory=lambda: [ANSWER, SECOND])
    step_delay: float = 0.0
    step_seconds: float = 0.05
    pause_at: int | None = None
    compile_first: bool = False  # a Waiting ("compiling") before the first step, until ``resume`` is set
    connect_error: Exception | None = None
    generate_errors: list[Exception] = field(default_factory=list)
    progress_stages: list[tuple[str, float, str]] = field(
        default_factory=lambda: [
            ("loading", 0.5, "reading weights"),
            ("compiling", 0.9, "bucket 1x128"),
            ("ok", 1.0, ""),
        ]
    )
    requests: list[Request] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    connects: int = 0
    closed: bool = False
    hold_connect: bool = False  # wait before the last progress stage until ``connect_gate`` is set
    chat_defaults: dict[str, Any] = field(default_factory=dict)  # what the model's generation_config says
    fills: list[str] = field(default_factory=list)  # what the scripted model writes in each hole
    fill_requests: list[str] = field(default_factory=list)  # the prompts of fill runs, as sent
    counted: list[str] = field(default_factory=list)  # the texts /tokenize was asked about
    warmed: list[ChatSettings] = field(default_factory=list)  # the settings the chat asked to warm up

    def __post_init__(self) -> None:
        self.runtime = ScriptedRuntime(self.answers)
        self.max_context: int | None = self.runtime.max_context
        self.pieces = Pieces(self.runtime.tokenizer)
        self.resume = asyncio.Event()
        self.connect_gate = asyncio.Event()
        self.steps_sent = 0
        self._ids = itertools.count(1)

    async def connect(self, progress: Callable[[str, float, str], None]) -> str:
        self.connects += 1
        for i, stage in enumerate(self.progress_stages):
            if self.hold_connect and i == len(self.progress_stages) - 1:
                await self.connect_gate.wait()
            progress(*stage)
            await asyncio.sleep(0)
        if self.connect_error is not None:
            raise self.connect_error
        return "fake-scripted"

    async def generate(
        self, messages: list[dict[str, str]], settings: ChatSettings, *, session: str | None = None
    ) -> AsyncIterator[Step | Waiting | Done]:
        params = settings.request_params()
        self.requests.append(Request(messages, dict(params), session))
        if self.generate_errors:
            raise self.generate_errors.pop(0)
        request_id = f"req-{next(self._ids)}"
        tokens = params["max_new_tokens"]
        sampling = SamplingParams(max_new_tokens=tokens, steps=params.get("steps", tokens))
        row = self.runtime.rows.make_row(self.runtime.rows.encode_chat(messages), tokens, chat=True)
        if self.compile_first:
            yield Waiting(request_id, "compiling", "compiling the program for 1 x 256 tokens", 5.0)
            await self.resume.wait()
            if request_id in self.cancelled:
                yield Done(request_id, "", "cancelled", stats=DoneStats(steps=0))
                return
        for event in self.runtime.run([row], sampling):
            if isinstance(event, BatchStep):
                if request_id in self.cancelled:
                    yield Done(request_id, "", "cancelled", stats=DoneStats(steps=event.step))
                    return
                self.steps_sent += 1
                yield Step(
                    id=request_id,
                    step=event.step,
                    steps=event.steps,
                    masks=event.masks_left[0],
                    seconds=self.step_seconds,  # the step's own time, as the daemon reports it
                    **self.pieces.render(event.canvas[0], event.unmasked[0]),
                )
                if self.pause_at is not None and event.step == self.pause_at:
                    await self.resume.wait()
                await asyncio.sleep(self.step_delay)
            else:
                assert isinstance(event, BatchDone)
                seconds = event.stats.steps * self.step_seconds
                new = event.stats.new_tokens
                yield Done(
                    request_id,
                    event.texts[0],
                    "stop",
                    stats=DoneStats(
                        steps=event.stats.steps,
                        new_tokens=new,
                        generate_seconds=seconds,
                        tokens_per_second=new / seconds,
                    ),
                    usage={"prompt_tokens": len(row.ids) - tokens, "completion_tokens": new},
                )

    async def warm(self, settings: ChatSettings) -> None:
        self.warmed.append(settings)

    async def count_tokens(self, text: str) -> int:
        """The daemon's /tokenize: the fake tokenizer's count (a token per character)."""
        self.counted.append(text)
        return len(self.runtime.tokenizer.encode_text(text))

    async def fill(self, prompt: str, options: FillOptions) -> AsyncIterator[Step | Waiting | Done]:
        """A holes run as the daemon streams it: the region from the first hole to the last, its text
        kept and its masks resolving over ``len(masks)`` steps into the scripted fills."""
        self.fill_requests.append(prompt)
        tok = self.runtime.tokenizer
        ids = self.runtime.rows.encode_prompt(prompt, holes=True)
        runs = mask_runs(ids, tok.mask_id)
        lo, hi = runs[0][0], runs[-1][1]
        region = list(ids[lo:hi])
        targets = list(region)
        for (a, b), fill in zip(runs, self.fills, strict=False):
            text = tok.encode(fill)[: b - a]
            targets[a - lo : b - lo] = text + [EOS_ID] * (b - a - len(text))
        masked = [i for i, t in enumerate(region) if t == tok.mask_id]
        steps = len(masked)
        for step, position in enumerate(masked):
            region[position] = targets[position]
            left = steps - step - 1
            yield Step(
                id="fill-1",
                step=step,
                steps=steps,
                masks=left,
                seconds=self.step_seconds,
                **self.pieces.render(region, [position]),
            )
            if self.pause_at is not None and step == self.pause_at:
                await self.resume.wait()
            await asyncio.sleep(self.step_delay)
        fills = [tok.decode([t for t in targets[a - lo : b - lo] if t != EOS_ID]) for a, b in runs]
        yield Done("fill-1", "", "stop", stats=DoneStats(steps=steps), holes=fills)

    async def cancel(self, request_id: str) -> bool:
        self.cancelled.append(request_id)
        self.resume.set()
        return True

    async def aclose(self) -> None:
        self.closed = True


def unreachable() -> DaemonUnavailable:
    return DaemonUnavailable("cannot reach the diffu daemon at http://127.0.0.1:9: connection refused")


def refused_steps() -> APIError:
    return APIError(
        400, "steps: must be <= 1024 (the daemon's max_steps), got 5000", "invalid_request_error", "steps"
    )


def screen_text(app: Any) -> str:
    """What the terminal shows right now, as plain text (for asserting what a user would read)."""
    import io

    from rich.console import Console

    width, height = app.size
    console = Console(
        width=width,
        height=height,
        file=io.StringIO(),
        force_terminal=True,
        record=True,
        color_system="truecolor",
        legacy_windows=False,
    )
    # The same render the SVG screenshots use, exported as text instead.
    console.print(app.screen._compositor.render_update(full=True, screen_stack=app._background_screens))
    return console.export_text()


def open_gate_when_loading(monkeypatch: Any, gate: Path) -> list[tuple[str, float, str]]:
    """Create ``gate`` (a fake model's ``load_gate``) once the chat's connect panel shows the loading stage,
    so a test sees that stage however slowly this machine runs. Returns the stages the panel showed, in
    order, as (stage, fraction, detail)."""
    shown: list[tuple[str, float, str]] = []
    original = ConnectPanel.report

    def report(self: ConnectPanel, stage: str, fraction: float, detail: str) -> None:
        shown.append((stage, fraction, detail))
        if stage == "loading":
            gate.touch()
        original(self, stage, fraction, detail)

    monkeypatch.setattr(ConnectPanel, "report", report)
    return shown


async def until(pilot: Pilot, predicate: Callable[[], Any], timeout: float = 5.0) -> None:
    """Let the app run until ``predicate()`` holds (tests only: the app has nothing to wait on)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting; the screen shows:\n{screen_text(pilot.app)}")
        await pilot.pause(0.02)
    await pilot.pause()  # let the screen repaint before the caller reads it


async def ask(pilot: Pilot, text: str) -> AnswerView:
    """Type ``text`` into the prompt, press Enter, return the answer being generated."""
    app = pilot.app
    before = len(app.query(AnswerView))
    prompt = app.query_one(PromptInput)
    prompt.focus()
    prompt.load_text(text)  # typing is tested key by key elsewhere; each pressed key costs a repaint
    await pilot.press("enter")
    await until(pilot, lambda: len(app.query(AnswerView)) > before)
    return list(app.query(AnswerView))[-1]


async def answered(pilot: Pilot, text: str) -> AnswerView:
    answer = await ask(pilot, text)
    await until(pilot, lambda: not answer.live and answer.query(Markdown))
    return answer
