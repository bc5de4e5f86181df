"""The rich progress bar of a training run: steps done, a line of facts, the time left."""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID


class ProgressBar:
    """A rich progress bar titled ``title`` with a line of facts after it, or nothing when not
    ``enabled`` (tests, non-interactive logs)."""

    def __init__(self, title: str, total: int, start: int, *, enabled: bool) -> None:
        self.title, self.total, self.start, self.enabled = title, total, start, enabled
        self._bar: Progress | None = None
        self._task: TaskID | None = None

    def __enter__(self) -> ProgressBar:
        if self.enabled:
            # rich only when a bar is shown: a test or a logged run never imports it.
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self._bar = Progress(
                TextColumn(f"[bold]{self.title}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[info]}"),
                TimeRemainingColumn(),
            )
            self._bar.__enter__()
            self._task = self._bar.add_task(self.title, total=self.total, completed=self.start, info="")
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._bar is not None:
            self._bar.__exit__(exc_type, exc, tb)
            self._bar = None

    def show(self, info: str, completed: int | None = None) -> None:
        """Replace the line of facts; move the bar to ``completed`` steps when given."""
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, completed=completed, info=info)  # None: where it was

    def note(self, text: str) -> None:
        """Print a line above the bar (an evaluation's result)."""
        if self._bar is not None:
            self._bar.console.print(text)
