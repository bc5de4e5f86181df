"""The coupled-GRPO progress bar (rich): steps done, the phase, the last reward, pass rate and speed."""

from __future__ import annotations

from typing import Any


class Progress:
    """A rich progress bar: steps done, the phase, the last rollout's reward and rollouts/s."""

    def __init__(self, total: int, start: int, *, enabled: bool) -> None:
        self.enabled, self.total, self.start = enabled, total, start
        self._p, self._info = None, {}

    def __enter__(self) -> Progress:
        if self.enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self._p = Progress(
                TextColumn("[bold]coupled-GRPO"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[info]}"),
                TimeRemainingColumn(),
            )
            self._p.__enter__()
            self._task = self._p.add_task("rl", total=self.total, completed=self.start, info="")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._p is not None:
            self._p.__exit__(*exc)

    def phase(self, name: str) -> None:
        self._info["phase"] = name
        self._show(None)

    def update(self, step: int, record: dict[str, Any]) -> None:
        for key in ("reward", "pass_rate", "rollouts_per_s"):
            if key in record:
                self._info[key] = record[key]
        self._info["loss"] = record["loss"]
        self._show(step)

    def _show(self, step: int | None) -> None:
        if self._p is None:
            return
        i = self._info
        parts = [i.get("phase", "")]
        if "reward" in i:
            parts.append(f"reward {i['reward']:.3f}")
        if "pass_rate" in i:
            parts.append(f"pass {i['pass_rate']:.0%}")
        if "loss" in i:
            parts.append(f"loss {i['loss']:.4f}")
        if "rollouts_per_s" in i:
            parts.append(f"{i['rollouts_per_s']:.2f} rollouts/s")
        kw = {} if step is None else {"completed": step}
        self._p.update(self._task, info="  ".join(parts), **kw)
