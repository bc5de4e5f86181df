"""The coupled-GRPO progress bar (rich): steps done, the phase, the last reward, pass rate and speed."""

from __future__ import annotations

from types import TracebackType
from typing import Any

from model_runtime.train.progress import ProgressBar


class Progress:
    """A rich progress bar: steps done, the phase, the last rollout's reward and rollouts/s."""

    def __init__(self, total: int, start: int, *, enabled: bool) -> None:
        self._bar = ProgressBar("coupled-GRPO", total, start, enabled=enabled)
        self._info: dict[str, Any] = {}

    def __enter__(self) -> Progress:
        self._bar.__enter__()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._bar.__exit__(exc_type, exc, tb)

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
        self._bar.show("  ".join(parts), step)
