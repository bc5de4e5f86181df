"""``diffu train --rl coupled-grpo --tasks TASKS.jsonl --init-from MODEL --out RUN``: DiffuCoder's cpGRPO.

The options of this mode; ``diffu train`` registers them and hands ``--rl`` runs here. Rollouts,
rewards (the sandboxed code reward and the format reward by default, or any callable by import path),
the coupled-GRPO update, checkpoints and the export are in ``model_runtime/train/rl/``; the reward
functions that use the sandbox live in ``assistant/evals/rewards.py`` and are wired in here.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from assistant.cli.train_flags import RL, RL_LOOP, add, check, given
from model_runtime.train.rl.config import RLConfig


def add_arguments(p: argparse.ArgumentParser) -> None:
    from assistant.evals.rewards import DEFAULT_REWARDS

    g = p.add_argument_group(
        f"reinforcement learning (--rl coupled-grpo; --steps defaults to one epoch of the tasks, --lr to "
        f"{RL['learning_rate'].default}, --warmup to {RL['warmup_steps'].default}; --warmup 1 is the "
        "recipe's one step at learning rate 0)"
    )
    g.add_argument("--rl", choices=("coupled-grpo",), default=None, help="improve --init-from with rewards")
    g.add_argument("--tasks", type=Path, default=None, metavar="TASKS", help="AceCode-format JSONL tasks")
    rewards = " and ".join(f"{name}={weight}" for name, weight in DEFAULT_REWARDS)
    g.add_argument(
        "--reward",
        action="append",
        default=None,
        metavar="NAME[=WEIGHT]",
        help="a reward: code, code_format, or a callable's import path (pkg.mod:fn); repeatable "
        f"(default: {rewards})",
    )
    for name in ("num_generations", "prompts_per_step", "chunk", "accumulation", "num_iterations"):
        add(g, RL[name])
    for name in ("mask_seed_pick", "beta", "epsilon", "ref_sync_steps", "ref_mixup_alpha"):
        add(g, RL[name])
    add(g, RL["max_prompt_length"])
    add(g, RL["max_completion_length"])
    add(g, RL["diffusion_steps"], default=None, default_text="one per completion token")
    for name in ("temperature", "top_p", "generation_batch_size", "rollout_decoder", "block_length"):
        add(g, RL[name])
    add(g, RL["threshold"])
    add(g, RL_LOOP["micro_batch"], default_text="the whole batch")
    add(g, RL_LOOP["tp"])
    add(g, RL_LOOP["dp"], default_text="the other devices")


def parse_rewards(specs: list[str] | None) -> list[tuple[str, float]]:
    """``["code=2", "pkg.mod:fn"]`` -> ``[("code", 2.0), ("pkg.mod:fn", 1.0)]``."""
    from assistant.errors import UsageError

    if not specs:
        from assistant.evals.rewards import DEFAULT_REWARDS

        return list(DEFAULT_REWARDS)
    out = []
    for spec in specs:
        name, sep, weight = spec.rpartition("=") if "=" in spec else (spec, "", "1")
        try:
            value = float(weight)
        except ValueError:
            raise UsageError(f"--reward {spec!r}: the weight after '=' must be a number") from None
        if not name:
            raise UsageError(f"--reward {spec!r}: expected NAME[=WEIGHT]")
        out.append((name, value))
    return out


def _build_rewards(specs: list[tuple[str, float]]) -> tuple[list[Any], list[Any]]:
    """(model_runtime Reward objects, things to close afterwards)."""
    from assistant.errors import UsageError
    from assistant.evals import rewards
    from model_runtime.train.rl.config import Reward

    built, closers = [], []
    for name, weight in specs:
        try:
            fn = rewards.builtin(name) if name in ("code", "code_format") else rewards.load_reward(name)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        if hasattr(fn, "close"):
            closers.append(fn)
        built.append(Reward(name, fn, weight))
    return built, closers


def run(args: argparse.Namespace) -> int:
    from assistant.errors import UsageError

    reward_specs = _check(args)

    from rich.console import Console

    from model_runtime.errors import DiffuError
    from model_runtime.train.rl.config import RLOptions
    from model_runtime.train.rl.run import train_rl

    console = Console(stderr=True)
    log = lambda msg: console.print(msg, highlight=False, markup=False)  # noqa: E731
    closers: list[Any] = []
    try:
        cfg = _rl_config(args)
        rewards, closers = _build_rewards(reward_specs)
        options = RLOptions(**given(args, RL_LOOP), show_progress=not args.quiet, log=log)
        facts = train_rl(
            args.out,
            args.tasks,
            init_from=args.init_from,
            rewards=rewards,
            cfg=cfg,
            options=options,
            export_dtype=args.export_dtype,
            log=log,
        )
    except DiffuError as exc:
        raise UsageError(str(exc)) from None
    except KeyboardInterrupt:
        console.print(f"stopped; the run is checkpointed: run the same command to resume ({args.out})")
        return 130
    finally:
        for c in closers:
            c.close()
    print(json.dumps(facts.get("train", facts), indent=2))
    return 0


def _check(args: argparse.Namespace) -> list[tuple[str, float]]:
    """The --rl flags checked (one line each); the parsed --reward specs."""
    from assistant.errors import UsageError

    if args.init_from is None:
        raise UsageError("--rl needs --init-from MODEL: the (instruction-tuned) model to improve")
    if args.tasks is None:
        raise UsageError(
            "--rl needs --tasks TASKS.jsonl (python -m model_runtime.train.rl.synthetic writes some)"
        )
    if args.source is not None or getattr(args, "sft", None) is not None:
        raise UsageError("--rl trains on --tasks only; leave out SOURCE and --sft")
    check(args, (RL, RL_LOOP))
    if args.checkpoint_every is None:  # pre-training's default does not apply
        args.checkpoint_every = RL_LOOP["checkpoint_every"].default
    return parse_rewards(args.reward)


def _rl_config(args: argparse.Namespace) -> RLConfig:
    """The flags as the trainer's RLConfig; without --steps, one epoch as the recipe (every task once,
    each rollout used num_iterations times)."""
    from model_runtime.train.rl.tasks import read_tasks

    steps = args.steps
    if steps is None:
        n_tasks = len(read_tasks(args.tasks))
        steps = max(1, n_tasks // max(args.prompts_per_step, 1)) * max(args.num_iterations, 1)
    values = given(args, RL)
    for name in ("learning_rate", "warmup_steps"):  # the recipe's where the flag is left out
        if values[name] is None:
            values[name] = RL[name].default
    values.update(steps=steps, diffusion_steps=args.diffusion_steps or args.max_completion_length)
    return RLConfig(**values)
