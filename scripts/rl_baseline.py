"""The control curve of a coupled-GRPO run: the *starting* model's rewards on the run's own rollouts.

    python scripts/rl_baseline.py RUN_DIR OUT.jsonl [--first 0] [--last N]

For rollout r the run drew its tasks and its sampling seed from ``(seed, r)``; this script draws the same
tasks with the same seed but samples them from the model the run started from, with the run's rollout
settings and rewards (from ``RUN_DIR/run.json``). The difference between the run's reward at rollout r and
this one is what training changed, with the prompts held fixed (one line per rollout, appended, so an
interrupted call can continue with ``--first``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_dir", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--first", type=int, default=0)
    p.add_argument("--last", type=int, default=None, help="one past the last rollout (default: the run's)")
    args = p.parse_args(argv)

    from assistant.evals import rewards as builtins
    from model_runtime.train.rl import rollout
    from model_runtime.train.rl.config import Reward, RLConfig, RLOptions
    from model_runtime.train.rl.run import load_policy
    from model_runtime.train.rl.tasks import read_tasks
    from model_runtime.train.rl.trainer import RLTrainer, rate_of

    run = json.loads((args.run_dir / "run.json").read_text(encoding="utf-8"))
    cfg = RLConfig(**run["rl"])
    rewards = [
        Reward(
            name, builtins.builtin(name) if name in ("code", "code_format") else builtins.load_reward(name), w
        )
        for name, w in run["rewards"]
    ]
    rt = load_policy(run["init_from"], cfg)
    scratch = args.out.with_suffix(".scratch")
    trainer = RLTrainer(scratch, rt, read_tasks(run["tasks"]["path"]), rewards, cfg, RLOptions(log=print))
    weights = np.array([r.weight for r in rewards], np.float32)
    last = args.last if args.last is not None else -(-cfg.steps // cfg.num_iterations)
    with args.out.open("a", encoding="utf-8") as out:
        for r in range(args.first, last):
            rows = [t for t in trainer.tasks_for(r) for _ in range(cfg.num_generations)]
            prompts = rollout.encode_prompts(rt, [t.messages() for t in rows], cfg.max_prompt_length)
            seed = int(np.random.default_rng([cfg.seed, r, 0]).integers(0, 2**31))  # as make_rollout
            ro = rollout.generate(
                rt, rt.state, prompts, trainer.sampling, batch_size=cfg.generation_batch_size, seed=seed
            )
            per, _ = trainer.rewards_of(rows, ro.texts, 0)
            record = {
                "rollout": r,
                "step": r * cfg.num_iterations + 1,
                "reward": float(np.nansum(per * weights, axis=1).mean()),
                "completion_length": float(ro.completion_mask.sum(axis=1).mean()),
            }
            for j, reward in enumerate(rewards):
                rate = rate_of(reward.name)
                if rate:
                    record[rate] = float(np.mean(np.nan_to_num(per[:, j]) >= 1.0))
            out.write(json.dumps(record) + "\n")
            out.flush()
            print(json.dumps(record), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
