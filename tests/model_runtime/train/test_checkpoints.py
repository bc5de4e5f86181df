"""The training-run helper both loops share (model_runtime/train/checkpoints.py): a signal stops the loop
between steps with a checkpoint, a second one stops it at once, a deleted (donated) state is not saved,
and a checkpoint comes back with its extras while the metrics log forgets the steps after it."""

from __future__ import annotations

import json
import os
import signal

import jax.numpy as jnp
import numpy as np
import pytest

from model_runtime.train.checkpoints import RunCheckpoints, interruptible


def _state() -> dict:
    return {"params": {"w": jnp.arange(6.0).reshape(2, 3)}, "count": jnp.int32(7)}


def test_sigterm_stops_between_steps_with_a_save_and_the_handlers_come_back():
    before = signal.getsignal(signal.SIGTERM)
    state, saved, steps = _state(), [], []
    with pytest.raises(KeyboardInterrupt, match=f"signal {int(signal.SIGTERM)}"):
        with interruptible(lambda: state, lambda: saved.append(len(steps))) as stop:
            for step in range(1, 10):
                steps.append(step)
                if step == 3:
                    os.kill(os.getpid(), signal.SIGTERM)  # arrives mid-step: only noted
                stop.check()
    assert steps == [1, 2, 3] and saved == [3]  # the step in progress finished, then one save
    assert signal.getsignal(signal.SIGTERM) == before


def test_a_second_signal_stops_at_once_and_a_deleted_state_is_not_saved():
    state, saved = _state(), []
    with pytest.raises(KeyboardInterrupt):
        with interruptible(lambda: state, lambda: saved.append(True)):
            os.kill(os.getpid(), signal.SIGINT)
            state["params"]["w"].delete()  # as a jitted step that donated its input and never returned
            os.kill(os.getpid(), signal.SIGINT)  # raises here, inside the "step"
            raise AssertionError("the second signal did not stop the loop")
    assert saved == []


def test_a_checkpoint_restores_state_and_extras_and_later_log_lines_are_dropped(tmp_path):
    ckpt = RunCheckpoints(tmp_path, keep=2)
    state = _state()
    rollout = {"ids": np.arange(4, dtype=np.int32), "rollout": np.int64(2)}
    for step in range(1, 5):
        ckpt.log({"step": step, "loss": 1.0 / step})
    assert ckpt.save(2, state, {"rollout": rollout})
    assert not ckpt.save(2, state, {"rollout": rollout})  # a step is saved once
    ckpt.close()

    ckpt = RunCheckpoints(tmp_path, keep=2)
    zeros = {"params": {"w": jnp.zeros((2, 3))}, "count": jnp.int32(0)}
    got = ckpt.restore_latest(zeros, extras=("rollout",))
    assert got is not None and got.step == 2
    np.testing.assert_array_equal(got.state["params"]["w"], state["params"]["w"])
    assert int(got.state["count"]) == 7
    np.testing.assert_array_equal(np.asarray(got.extras["rollout"]["ids"]), rollout["ids"])
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 2]  # steps 3-4 will be computed and logged again
    ckpt.close()
    assert RunCheckpoints(tmp_path / "fresh", keep=2).restore_latest(zeros) is None
