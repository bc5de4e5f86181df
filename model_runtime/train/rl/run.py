"""One coupled-GRPO run end to end, resumable: tasks -> load the starting model -> train -> export.

    RUN/run.json        the model config, RLConfig, task file digest and rewards; a resume must match
    RUN/checkpoints/    orbax checkpoints: policy, optimizer, reference model and the current rollout
    RUN/metrics.jsonl   one line per step (loss, KL, clip fraction; at rollout steps reward mean and
                        spread, pass rate, format rate, completion length, rollouts/s)
    RUN/model/          the trained policy in the published layout, with metrics.json

Running the same command again resumes from the last checkpoint (or only re-exports a finished run).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from model_runtime.runtime import Runtime
from model_runtime.train.checkpoints import devices_note, last_step, resume, stop_note
from model_runtime.train.export import export_model
from model_runtime.train.rl.config import Reward, RLConfig, RLOptions
from model_runtime.train.rl.tasks import read_tasks
from model_runtime.train.rl.trainer import RLTrainer
from model_runtime.train.run import check_run_record, hardware_facts


def load_policy(
    init_from: str | os.PathLike[str], cfg: RLConfig, *, tp: int = 1, dp: int | None = None
) -> Runtime:
    """The starting model in float32 (the trained weights), on a tp x dp mesh when asked, with one batch
    bucket of ``generation_batch_size`` rows for the rollouts."""
    from model_runtime.loader import load

    return load(init_from, dtype="float32", tp=tp, dp=dp, batch_buckets=(cfg.generation_batch_size,))


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def train_rl(
    run_dir: str | os.PathLike[str],
    tasks_path: str | os.PathLike[str],
    *,
    init_from: str | os.PathLike[str],
    rewards: Sequence[Reward],
    cfg: RLConfig | None = None,
    options: RLOptions | None = None,
    export_dtype: str = "bfloat16",
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Train (or resume) in ``run_dir``; returns the facts written to ``RUN/model/metrics.json``."""
    cfg = cfg or RLConfig()
    options = options or RLOptions(log=log)
    run_dir, tasks_path = Path(run_dir), Path(tasks_path)
    tasks = read_tasks(tasks_path)
    log(f"{len(tasks)} tasks from {tasks_path}; loading {init_from}")
    rt = load_policy(init_from, cfg, tp=options.tp, dp=options.dp)
    cfg_dict = json.loads((rt.model_dir / "config.json").read_text(encoding="utf-8"))
    record = {
        "model": cfg_dict,
        "rl": asdict(cfg),
        "init_from": str(init_from),
        "tasks": {"path": str(tasks_path), "sha256": _digest(tasks_path), "count": len(tasks)},
        "rewards": [[r.name, r.weight] for r in rewards],
    }
    run_dir.mkdir(parents=True, exist_ok=True)
    check_run_record(run_dir, record)
    trainer = RLTrainer(run_dir, rt, tasks, rewards, cfg, options)
    try:
        resume(trainer, log)
        log(
            f"coupled-GRPO: {rt.config.param_count() / 1e6:.2f}M parameters, {cfg.steps} steps, "
            f"{cfg.prompts_per_step} prompts x {cfg.num_generations} completions per rollout, "
            f"{devices_note()}{stop_note(cfg.steps, options.stop_at)}"
        )
        trainer.run()
        # A time-boxed run (--stop-at) exports the policy where it stopped; the run stays resumable.
        if trainer.step < last_step(cfg.steps, options.stop_at):
            return {"stopped_at": trainer.step}
        facts = _facts(run_dir, cfg, init_from, tasks_path, trainer.step)
        out = export_model(
            run_dir / "model",
            cfg_dict,
            trainer.state["params"],
            rt.model_dir,
            dtype=export_dtype,
            extra_files={"metrics.json": facts},
        )
        # The starting model's generation defaults (decoder, chat settings) still describe this model.
        if (rt.model_dir / "generation_config.json").is_file():
            shutil.copyfile(rt.model_dir / "generation_config.json", out / "generation_config.json")
        log(f"exported to {out}")
        return facts
    finally:
        trainer.close()


def _facts(run_dir: Path, cfg: RLConfig, init_from: Any, tasks_path: Path, step: int) -> dict[str, Any]:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    rollouts = [x for x in lines if "reward" in x]
    return {
        "weights": "the policy's weights after the last step (no EMA: the published trainer keeps none)",
        "method": "coupled-GRPO (apple/ml-diffucoder DiffuGRPOTrainer), diffu train --rl coupled-grpo",
        "init_from": str(init_from),
        "tasks": str(tasks_path),
        "rl": asdict(cfg),
        "train": {
            "steps": cfg.steps,
            "steps_done": step,  # below ``steps`` when the run was stopped early (--stop-at)
            "rollouts": len(rollouts),
            "seconds": round(sum(x.get("seconds", 0.0) for x in lines), 1),
            "first_reward": rollouts[0]["reward"] if rollouts else None,
            "last_reward": rollouts[-1]["reward"] if rollouts else None,
        },
        "hardware": hardware_facts(),
    }
