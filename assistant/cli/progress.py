"""Progress of the CLI's long steps on stderr, whether or not stderr is a terminal.

On a terminal: a rich bar per step (description, bar, count or percentage, time left), gone when the
command ends. Piped (a log, CI, ``2> file``): nothing for a step that ends within :data:`EVERY` seconds
(a quick load, or one that fails at once: its error is then the only line); past that a line every
:data:`EVERY` seconds while it moves, every :data:`QUIET` seconds while it does not (so a compile or a
slow batch never looks like a hang), and one when it ends. A step can
carry a note of what it is doing now (``compiling the program for 4 x 512 tokens``), shown beside it.
"""

from __future__ import annotations

import sys
import threading
import time
from types import TracebackType
from typing import TextIO

from rich.console import Console
from rich.progress import BarColumn, TaskID, TextColumn, TimeRemainingColumn
from rich.progress import Progress as RichProgress

EVERY = 5.0  # seconds between piped lines of a running step that moved
QUIET = 30.0  # seconds between piped lines of one that did not (a long compile, a slow batch)


class Step:
    """One long step: ``step(n)`` counts ``n`` more done, ``step.note(text)`` says what it does now."""

    def __init__(self, owner: Progress, description: str, total: float, *, fraction: bool) -> None:
        self._owner = owner
        self.description = description
        self.total = total
        self.fraction = fraction  # total is 1.0 and done a fraction (a load), not a count
        self.done = 0.0
        self.text = ""
        self.started = time.monotonic()
        self.task: TaskID | None = None
        self.shown: tuple[float, str, float] | None = None  # the last piped line's (done, note, when)

    def __call__(self, n: float = 1) -> None:
        self._owner._update(self, done=self.done + n)

    def update(self, done: float, description: str | None = None) -> None:
        """Set how much is done (and, with ``description``, rename the step)."""
        self._owner._update(self, done=done, description=description)

    def note(self, text: str) -> None:
        """What the step is doing now ("" clears it)."""
        self._owner._update(self, text=text)

    def line(self) -> str:
        count = f"{self.done:.0%}" if self.fraction else f"{self.done:g}/{self.total:g}"
        seconds = time.monotonic() - self.started
        what = f"{self.description}: {count}"
        if self.done >= self.total:
            return f"{what} in {seconds:.1f} s"
        return f"{what} ({seconds:.0f} s{'; ' + self.text if self.text else ''})"


class Progress:
    """The steps of one command; a context manager. ``prefix`` starts every piped line."""

    def __init__(self, prefix: str = "diffu", *, stream: TextIO | None = None) -> None:
        self.prefix = prefix
        self._stream = stream
        console = Console(file=stream, stderr=stream is None, soft_wrap=True)
        self.terminal = console.is_terminal
        self._bar = RichProgress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[count]}"),
            TimeRemainingColumn(),
            console=console,
            transient=True,
            disable=not self.terminal,
        )
        self._lock = threading.Lock()
        self._steps: list[Step] = []
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    def __enter__(self) -> Progress:
        self._bar.__enter__()
        if not self.terminal:
            self._ticker = threading.Thread(target=self._tick, name="diffu-progress", daemon=True)
            self._ticker.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        self._bar.__exit__(kind, exc, tb)

    def step(self, description: str, total: float, *, fraction: bool = False) -> Step:
        """Start a step of ``total`` units (``fraction``: total 1.0, shown as a percentage)."""
        step = Step(self, description, total, fraction=fraction)
        with self._lock:
            self._steps.append(step)
            step.task = self._bar.add_task(description, total=total, count=self._count(step))
        return step

    def note(self, text: str) -> None:
        """A note on the latest unfinished step (nothing when none runs)."""
        with self._lock:
            running = [s for s in self._steps if s.done < s.total]
        if running:
            running[-1].note(text)

    def _update(
        self,
        step: Step,
        *,
        done: float | None = None,
        description: str | None = None,
        text: str | None = None,
    ) -> None:
        with self._lock:
            finished = step.done >= step.total
            if done is not None:
                step.done = min(done, step.total)
            if description is not None:
                step.description = description
            if text is not None:
                step.text = text
            shown = step.description + (f" ({step.text})" if step.text else "")
            assert step.task is not None
            self._bar.update(step.task, completed=step.done, description=shown, count=self._count(step))
            # Piped, a step that said nothing while it ran says nothing at its end either.
            ended = not finished and step.done >= step.total and step.shown is not None
        if ended:
            self._print(step.line())

    @staticmethod
    def _count(step: Step) -> str:
        return f"{step.done:.0%}" if step.fraction else f"{step.done:g}/{step.total:g}"

    def _tick(self) -> None:
        while not self._stop.wait(EVERY):
            now = time.monotonic()
            lines = []
            with self._lock:
                for s in self._steps:
                    done, text, when = s.shown or (-1.0, "", now)
                    if s.done < s.total and ((s.done, s.text) != (done, text) or now - when >= QUIET):
                        s.shown = (s.done, s.text, now)
                        lines.append(s.line())
            for line in lines:
                self._print(line)

    def _print(self, text: str) -> None:
        if not self.terminal:
            print(f"{self.prefix}: {text}", file=self._stream or sys.stderr, flush=True)


__all__ = ["EVERY", "QUIET", "Progress", "Step"]
