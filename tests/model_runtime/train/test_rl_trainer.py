"""``diffu train --rl coupled-grpo`` on tiny models: it raises a reward, resumes exactly (a soft stop and a
hard kill, inside a rollout's iterations too), survives a raising reward, and its CLI refuses bad input."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np
import pytest

from assistant.cli.main import main
from model_runtime.train.rl import synthetic
from model_runtime.train.rl.config import Reward, RLConfig, RLOptions
from model_runtime.train.rl.run import load_policy
from model_runtime.train.rl.tasks import write_tasks
from model_runtime.train.rl.trainer import RLTrainer
from tests.assistant.helpers import virtual_devices_env


def spaces(completions, **_):
    """A reward a random tiny model can climb: the share of spaces in the answer."""
    texts = [c[-1]["content"] for c in completions]
    return [sum(ch == " " for ch in t) / max(len(t), 1) for t in texts]


SMALL = dict(
    prompts_per_step=2, num_generations=4, chunk=4, max_completion_length=16, diffusion_steps=16,
    generation_batch_size=8, max_prompt_length=32,
)  # fmt: skip


@pytest.fixture(scope="module")
def tasks_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tasks") / "train.jsonl"
    write_tasks(path, synthetic.split(synthetic.generate(0), 0.2, 0)[0])
    return path


def _trainer(run_dir: Path, tiny_dir: Path, tasks_file: Path, rewards, on_step=None, **over) -> RLTrainer:
    from model_runtime.train.rl.tasks import read_tasks

    settings = {**SMALL, "steps": 6, "learning_rate": 3e-3, "ref_sync_steps": 4, **over}
    every = settings.pop("checkpoint_every", 2)
    cfg = RLConfig(**settings)
    opts = RLOptions(checkpoint_every=every, show_progress=False, on_step=on_step, log=lambda m: None)
    return RLTrainer(run_dir, load_policy(tiny_dir, cfg), read_tasks(tasks_file), rewards, cfg, opts)


@pytest.mark.parametrize("decoder", ["reference", "fast"])
def test_a_prompts_completions_differ_and_do_not_depend_on_the_batch_size(tiny_dir, decoder):
    """G copies of one prompt under one rollout seed must be G samples, not one sample G times."""
    from model_runtime.train.rl import rollout
    from model_runtime.train.rl.tasks import Task

    cfg = RLConfig(**SMALL)
    rt = load_policy(tiny_dir, cfg)
    task = Task("t", "Write f.", ("assert f() == 1",), {})
    prompts = rollout.encode_prompts(rt, [task.messages()] * 8, cfg.max_prompt_length)
    settings = rollout.sampling(16, 16, 1.0, 0.95, decoder=decoder, block_length=8)
    whole = rollout.generate(rt, rt.state, prompts, settings, batch_size=8, seed=5)
    halves = rollout.generate(rt, rt.state, prompts, settings, batch_size=4, seed=5)
    assert len({tuple(row) for row in whole.completion_ids.tolist()}) >= 6
    np.testing.assert_array_equal(whole.completion_ids, halves.completion_ids)


def test_coupled_grpo_raises_the_reward_of_a_tiny_model(tiny_dir, tasks_file, tmp_path):
    t = _trainer(tmp_path, tiny_dir, tasks_file, [Reward("spaces", spaces, 1.0)], steps=30, beta=0.0)
    history = t.run()
    t.close()
    rewards = [h["reward"] for h in history if "reward" in h]
    assert len(rewards) == 15
    # From about 0.2 (seed 42: 0.22 over the first 4 rollouts, 0.45 over the last 4). The gain depends on
    # the seed (+0.03 to +0.65 for seeds 1 to 3), as it did before the masks were drawn per device group.
    assert np.mean(rewards[-4:]) > np.mean(rewards[:4]) + 0.2, rewards


class _Kill(Exception):
    """Stands in for a hard kill: nothing is saved on the way out."""


def _recording(record: dict, stop_at: int | None = None, exc: type[BaseException] = KeyboardInterrupt):
    def on_step(step: int, metrics: dict) -> None:
        record[step] = (metrics["loss"], metrics.get("reward"), metrics["kl"])
        if step == stop_at:
            raise exc(f"stopped at step {step}")

    return on_step


def test_a_stopped_or_killed_run_resumes_with_the_same_rollouts_and_losses(tiny_dir, tasks_file, tmp_path):
    from assistant.evals.rewards import code_format

    rewards = [Reward("spaces", spaces, 1.0), Reward("code_format", code_format, 0.5)]
    ref: dict[int, tuple] = {}
    t = _trainer(tmp_path / "ref", tiny_dir, tasks_file, rewards, _recording(ref))
    t.run()
    final = [np.asarray(x) for x in jax.tree.leaves(t.state)]
    t.close()
    assert ref[6][2] > 0 and ref[5][1] is not None  # the KL term is live; step 5 made a rollout

    # Ctrl-C / SIGTERM after step 3, between the two iterations of the second rollout: checkpointed.
    got: dict[int, tuple] = {}
    t = _trainer(tmp_path / "soft", tiny_dir, tasks_file, rewards, _recording(got, stop_at=3))
    with pytest.raises(KeyboardInterrupt):
        t.run()
    t.close()
    t = _trainer(tmp_path / "soft", tiny_dir, tasks_file, rewards, _recording(got))
    assert t.restore_latest() and t.step == 3 and t.buffer is not None and t.buffer.rollout == 1
    t.run()
    assert got == ref
    assert all(np.array_equal(a, np.asarray(b)) for a, b in zip(final, jax.tree.leaves(t.state), strict=True))
    t.close()

    # A hard kill at step 5 loses the steps since the periodic checkpoint at step 3, nothing else.
    got = {}
    run = tmp_path / "hard"
    t = _trainer(
        run, tiny_dir, tasks_file, rewards, _recording(got, stop_at=5, exc=_Kill), checkpoint_every=3
    )
    with pytest.raises(_Kill):
        t.run()
    t.close()
    t = _trainer(run, tiny_dir, tasks_file, rewards, _recording(got), checkpoint_every=3)
    assert t.restore_latest() and t.step == 3
    t.run()
    assert got == ref
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2, 3, 4, 5, 6]  # steps 4-5 of the killed run logged once
    t.close()


def test_a_raising_reward_counts_zero_is_logged_and_the_run_goes_on(tiny_dir, tasks_file, tmp_path):
    messages: list[str] = []

    def broken(completions, **_):
        raise ZeroDivisionError("division by zero in my reward")

    def short(completions, **_):
        return [1.0]  # one value for a batch of eight

    rewards = [Reward("spaces", spaces, 1.0), Reward("broken", broken, 1.0), Reward("short", short, 1.0)]
    # The fast decoder's rollouts too (--rollout-decoder fast).
    t = _trainer(tmp_path, tiny_dir, tasks_file, rewards, steps=2, rollout_decoder="fast", block_length=8)
    t.options.log = messages.append
    history = t.run()
    t.close()
    assert history[0]["reward_errors"] == 2 and history[0]["rewards/broken"] == 0.0
    assert history[0]["reward"] == pytest.approx(history[0]["rewards/spaces"], rel=1e-6)
    assert any("reward 'broken' failed at step 0 (ZeroDivisionError: division by zero in my reward)" in m
               and "counted as 0 for tasks" in m for m in messages)  # fmt: skip
    assert any("reward 'short' failed" in m and "returned 1 values for 8 completions" in m for m in messages)
    assert len(history) == 2


def _cli(tasks: Path, tiny_dir: Path, out: Path, *extra: str) -> list[str]:
    return [
        "train", "--rl", "coupled-grpo", "--tasks", str(tasks), "--init-from", str(tiny_dir),
        "--out", str(out),
        # The shapes of SMALL: the programs compiled by the tests above come from the compilation cache.
        "--steps", "2", "--prompts-per-step", "2", "--num-generations", "4", "--chunk", "4",
        "--max-completion-length", "16", "--generation-batch-size", "8", "--max-prompt-length", "32",
        "--export-dtype", "float32", "--quiet", *extra,
    ]  # fmt: skip


def test_the_cli_trains_exports_a_loadable_model_and_refuses_changed_settings(
    tiny_dir, tasks_file, tmp_path, capsys
):
    import model_runtime

    out = tmp_path / "run"
    assert main(_cli(tasks_file, tiny_dir, out)) == 0
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    first = lines[0]
    for key in ("reward", "reward_std", "pass_rate", "format_rate", "kl", "clip_ratio", "completion_length",
                "rollouts_per_s", "loss", "grad_norm", "lr"):  # fmt: skip
        assert key in first, key
    facts = json.loads((out / "model" / "metrics.json").read_text())
    assert facts["rl"]["num_generations"] == 4 and facts["train"]["rollouts"] == 1
    rt = model_runtime.load(out / "model")
    ids = rt.rows.encode_chat([{"role": "user", "content": "hi"}])
    done = list(rt.generate([ids], model_runtime.SamplingParams(max_new_tokens=4, steps=4), chat=True))[-1]
    assert len(done.generated[0]) == 4
    capsys.readouterr()
    assert main(_cli(tasks_file, tiny_dir, out, "--beta", "0.02")) == 2
    assert "rl.beta: was 0.01, now 0.02" in capsys.readouterr().err


def _exported(out: Path) -> tuple[dict, np.ndarray]:
    from safetensors.numpy import load_file

    weights = load_file(out / "model" / "model.safetensors")
    return json.loads((out / "model" / "metrics.json").read_text())["train"], weights["lm_head.weight"]


def test_stop_at_exports_where_it_stopped_and_the_same_command_goes_on(
    tiny_dir, tasks_file, tmp_path, capsys
):
    out = tmp_path / "run"
    # A reward the random tiny model scores unevenly: with the default ones every completion gets 0, every
    # advantage is 0, and the weights after step 4 would differ from step 1's by rounding at most.
    spaces_reward = f"{__name__}:spaces"
    args = _cli(tasks_file, tiny_dir, out, "--steps", "4", "--reward", spaces_reward)
    steps = lambda: [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()]  # noqa: E731
    assert main([*args, "--stop-at", "1"]) == 0
    assert "(stopping after step 1)" in capsys.readouterr().err
    facts, head_1 = _exported(out)
    assert (facts["steps"], facts["steps_done"], facts["rollouts"], steps()) == (4, 1, 1, [1])
    # A run stopped by SIGTERM is exported the same way: resumed at its step, nothing more is trained.
    (out / "model" / "metrics.json").unlink()
    assert main([*args, "--stop-at", "1"]) == 0
    assert "resumed from the checkpoint at step 1" in capsys.readouterr().err
    facts, again = _exported(out)
    assert facts["steps_done"] == 1 and steps() == [1]
    np.testing.assert_array_equal(again, head_1)
    assert main(args) == 0
    facts, head_4 = _exported(out)
    assert (facts["steps_done"], steps()) == (4, [1, 2, 3, 4])
    assert not np.array_equal(head_4, head_1)
    assert main([*args, "--stop-at", "0"]) == 2
    assert "--stop-at: must be >= 1" in capsys.readouterr().err


def test_the_cli_refuses_bad_input_with_one_line(tiny_dir, tasks_file, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    rows = [
        {"id": "ok", "question": "Q?", "test_cases": ["assert True"]},
        {"id": "sum_two", "question": "Sum?", "test_cases": ["assert s(1, 2) == 3", "assert s(1,"]},
    ]
    bad.write_text("".join(json.dumps(r) + "\n" for r in rows))
    good = tasks_file
    cases = [
        (_cli(bad, tiny_dir, tmp_path / "a"), "bad.jsonl:2 (task 'sum_two'): test 2 does not parse"),
        (_cli(good, tiny_dir, tmp_path / "b", "--reward", "no_such_pkg:fn"), "cannot import no_such_pkg"),
        (_cli(good, tiny_dir, tmp_path / "c", "--reward", "code=lots"), "after '=' must be a number"),
        (_cli(good, tiny_dir, tmp_path / "d", "--chunk", "3"), "chunk: must divide the 8 completions"),
        (
            _cli(good, tiny_dir, tmp_path / "e", "--accumulation", "3"),
            "accumulation: chunk x accumulation (12 rows per device group) must divide the 8 completions",
        ),
        (["train", "--rl", "coupled-grpo", "--init-from", str(tiny_dir), "--out", str(tmp_path)], "--tasks"),
    ]
    for argv, message in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, err


def _mesh_run(run_dir: str, tiny_dir: str, tasks_file: str, tp: int, dp: int) -> dict:
    """Two steps on a tp x dp mesh; the subprocess of the sharding test runs this too."""
    from model_runtime.train.rl.tasks import read_tasks

    cfg = RLConfig(**SMALL, steps=2, learning_rate=3e-3)
    opts = RLOptions(show_progress=False, log=lambda m: None)
    rt = load_policy(tiny_dir, cfg, tp=tp, dp=dp)
    t = RLTrainer(Path(run_dir), rt, read_tasks(tasks_file), [Reward("spaces", spaces, 1.0)], cfg, opts)
    history = t.run()
    t.close()
    mesh = rt.info.mesh
    keys = ("reward", "loss", "kl", "grad_norm")
    return {"mesh": [mesh["dp"], mesh["tp"]], "steps": [[h.get(k) for k in keys] for h in history]}


def test_data_and_tensor_parallel_training_matches_one_device(tiny_dir, tasks_file, tmp_path):
    import os
    import subprocess
    import sys

    code = (
        "import json, sys; from tests.model_runtime.train.test_rl_trainer import _mesh_run; "
        "print(json.dumps(_mesh_run(*sys.argv[1:4], 2, 2)))"
    )
    env = {**os.environ, **virtual_devices_env(4)}
    root = Path(__file__).resolve().parents[3]
    args = [str(tmp_path / "mesh"), str(tiny_dir), str(tasks_file)]
    proc = subprocess.run(
        [sys.executable, "-c", code, *args], env=env, cwd=root, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    four = json.loads(proc.stdout.strip().splitlines()[-1])
    one = _mesh_run(str(tmp_path / "one"), str(tiny_dir), str(tasks_file), 1, 1)
    assert four["mesh"] == [2, 2] and one["mesh"] == [1, 1]
    # The same rollouts (rewards equal) and updates; only the order of float reductions differs.
    np.testing.assert_allclose(
        np.array(four["steps"], float), np.array(one["steps"], float), rtol=1e-4, atol=1e-7
    )
