"""What every training loop here shares: RUN/checkpoints, RUN/metrics.jsonl, resume, and stopping on a
signal with a checkpoint. Pre-training and SFT (``loop.Trainer``) and coupled-GRPO
(``rl.trainer.RLTrainer``) use it the same way::

    with interruptible(lambda: self.state, self.save) as stop:
        while self.step < last:
            ...one step...
            if checkpoint_due(self.step, every, last):
                self.save()
            stop.check()

A checkpoint holds the training state as its flat list of leaves: the tree structure (optax
namedtuples, an NNX State with integer layer keys) is rebuilt from the live state on restore, never from
disk. A loop may add named extras (the RL loop's current rollout), saved beside the state.

SIGTERM and the first Ctrl-C only set a flag: raising inside a jitted step that donates its state would
leave the state deleted and nothing to save. ``StopSignals.check`` raises KeyboardInterrupt between
steps, and ``interruptible`` saves the last completed step on the way out, so a resumed run loses
nothing. A second Ctrl-C raises at once; if it lands inside a step, the donated buffers are gone and
the last periodic checkpoint is what a resume gets.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, Protocol

import jax
from jax.sharding import Sharding

if TYPE_CHECKING:
    import orbax.checkpoint as ocp


def _orbax() -> Any:
    # orbax costs about a second to import; only a run that saves or restores pays it (the evaluation
    # and export code next to the loops import this module too).
    import orbax.checkpoint as ocp

    return ocp


@dataclass(frozen=True)
class Restored:
    """A checkpoint read back: its step, the state (the live state's tree) and the named extras."""

    step: int
    state: Any
    extras: dict[str, Any] = field(default_factory=dict)


class RunCheckpoints:
    """The orbax checkpoints (RUN/checkpoints) and the metrics log (RUN/metrics.jsonl) of one run."""

    def __init__(self, run_dir: Path, keep: int) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.keep = keep
        self._manager: ocp.CheckpointManager | None = None

    @property
    def manager(self) -> ocp.CheckpointManager:
        if self._manager is None:
            ocp = _orbax()
            self._manager = ocp.CheckpointManager(
                (self.run_dir / "checkpoints").absolute(),
                options=ocp.CheckpointManagerOptions(max_to_keep=self.keep, create=True),
            )
        return self._manager

    def save(self, step: int, state: Any, extras: Mapping[str, Any] | None = None) -> bool:
        """Checkpoint ``state`` (and ``extras``, each a tree of arrays) at ``step``, blocking: a kill right
        after must not lose it. Returns False when ``step`` is saved already."""
        if step in self.manager.all_steps():
            return False
        ocp = _orbax()
        leaves = ocp.args.StandardSave(jax.tree.leaves(state))
        if extras is None:
            args = leaves
        else:
            args = ocp.args.Composite(
                state=leaves, **{k: ocp.args.StandardSave(v) for k, v in extras.items()}
            )
        self.manager.save(step, args=args)
        self.manager.wait_until_finished()
        return True

    def restore_latest(
        self, state: Any, *, sharding: Sharding | None = None, extras: Sequence[str] | None = None
    ) -> Restored | None:
        """The newest checkpoint with ``state``'s tree, or None when there is none. Each leaf is placed
        as ``sharding`` says (default: as the live leaf is). ``extras`` names what ``save`` was given
        beside the state (None: it was given none); they come back as saved.

        Lines of the metrics log past that step (a hard kill after the checkpoint) are dropped: the
        resumed run computes those steps again and logs them once."""
        step = self.manager.latest_step()
        if step is None:
            return None
        ocp = _orbax()
        leaves, treedef = jax.tree.flatten(state)
        abstract = [
            jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding if sharding is not None else x.sharding)
            for x in leaves
        ]
        if extras is None:
            restored, more = self.manager.restore(step, args=ocp.args.StandardRestore(abstract)), {}
        else:
            args = {k: ocp.args.StandardRestore() for k in extras}
            out = self.manager.restore(
                step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract), **args)
            )
            restored, more = out["state"], {k: out[k] for k in extras}
        self._drop_records_after(int(step))
        return Restored(int(step), jax.tree.unflatten(treedef, list(restored)), more)

    def log(self, record: Mapping[str, Any]) -> None:
        """Append one JSON line (with a ``step`` key) to RUN/metrics.jsonl."""
        with (self.run_dir / "metrics.jsonl").open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")

    def records(self) -> list[dict[str, Any]]:
        """Every line of RUN/metrics.jsonl, oldest first."""
        path = self.run_dir / "metrics.jsonl"
        if not path.is_file():
            return []
        return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()]

    def _drop_records_after(self, step: int) -> None:
        path = self.run_dir / "metrics.jsonl"
        if path.is_file():
            lines = path.read_text(encoding="utf-8").splitlines()
            kept = [x for x in lines if json.loads(x)["step"] <= step]
            path.write_text("".join(x + "\n" for x in kept), encoding="utf-8")

    def close(self) -> None:
        if self._manager is not None:
            self._manager.close()
            self._manager = None


class StopSignals:
    """While entered, SIGTERM and SIGINT set ``requested`` instead of stopping; a second one raises
    KeyboardInterrupt at once. Outside the main thread signals cannot be caught here, and whoever owns
    them handles them."""

    def __init__(self) -> None:
        self.requested: int | None = None
        self._previous: dict[signal.Signals, Any] = {}

    def __enter__(self) -> StopSignals:
        self.requested = None
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread
                pass
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested is not None:
            raise KeyboardInterrupt(f"signal {signum}")  # asked twice: stop now
        self.requested = signum

    def check(self) -> None:
        """Raise KeyboardInterrupt if a signal came since entering (call it between steps)."""
        if self.requested is not None:
            raise KeyboardInterrupt(f"signal {self.requested}")


@contextmanager
def interruptible(state: Callable[[], Any], save: Callable[[], None]) -> Iterator[StopSignals]:
    """Run a training loop under ``StopSignals``; on KeyboardInterrupt (Ctrl-C, SIGTERM, or one raised
    by ``check``) call ``save`` if ``state()`` is whole, then let the interrupt go on."""
    with StopSignals() as stop:
        try:
            yield stop
        except KeyboardInterrupt:
            # Whole unless the interrupt hit inside a step (a second Ctrl-C) and its donated buffers
            # are gone: then the last periodic checkpoint is what a resume gets.
            if not any(x.is_deleted() for x in jax.tree.leaves(state())):
                save()
            raise


class Resumable(Protocol):
    """A trainer whose run can resume: ``restore_latest`` loads its newest checkpoint, if any."""

    step: int

    def restore_latest(self) -> bool: ...


def resume(trainer: Resumable, log: Callable[[str], None]) -> None:
    """Resume ``trainer`` from its newest checkpoint, if any, and say so."""
    if trainer.restore_latest():
        log(f"resumed from the checkpoint at step {trainer.step}")


def devices_note() -> str:
    """``N <platform> device(s)``: what a start-up line says the run trains on."""
    devices = jax.devices()
    return f"{len(devices)} {devices[0].platform} device(s)"


def last_step(steps: int, stop_at: int | None) -> int:
    """Where this invocation stops: ``stop_at`` cuts it short without touching the schedule (``steps``
    still sets the learning-rate decay), so the same command without it resumes towards ``steps``."""
    return steps if stop_at is None else min(steps, stop_at)


def stop_note(steps: int, stop_at: int | None) -> str:
    """`` (stopping after step N)`` for a start-up line when ``stop_at`` cuts the run short, else ``""``."""
    return f" (stopping after step {stop_at})" if stop_at is not None and stop_at < steps else ""


def checkpoint_due(step: int, every: int, last: int) -> bool:
    """Whether to checkpoint after ``step``: every ``every`` steps and at the invocation's last step."""
    return step % every == 0 or step == last
