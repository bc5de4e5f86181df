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

DEFAULT_LR = 1e-6  # recipes/config_coupled_code.yaml
DEFAULT_CHECKPOINT_EVERY = 10  # an RL step is a rollout's worth of work: checkpoint often


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "reinforcement learning (--rl coupled-grpo; --steps defaults to one epoch of the tasks, --lr to 1e-6,"
        " --warmup to 0; --warmup 1 is the recipe's one step at learning rate 0)"
    )
    g.add_argument("--rl", choices=("coupled-grpo",), default=None, help="improve --init-from with rewards")
    g.add_argument("--tasks", type=Path, default=None, metavar="TASKS", help="AceCode-format JSONL tasks")
    g.add_argument(
        "--reward",
        action="append",
        default=None,
        metavar="NAME[=WEIGHT]",
        help="a reward: code, code_format, or a callable's import path (pkg.mod:fn); repeatable "
        "(default: code=2.0 and code_format=0.5)",
    )
    g.add_argument("--num-generations", type=int, default=10, help="completions per prompt (10)")
    g.add_argument("--prompts-per-step", type=int, default=8, help="prompts per rollout (8)")
    g.add_argument("--chunk", type=int, default=5, help="completions per token-normalised loss chunk (5)")
    g.add_argument(
        "--accumulation",
        type=int,
        default=2,
        help="chunks per published device (its gradient_accumulation_steps); each --chunk x this rows draw "
        "their own masks (2)",
    )
    g.add_argument("--num-iterations", type=int, default=2, help="updates per rollout (2)")
    g.add_argument(
        "--mask-seed-pick",
        choices=("iteration", "published"),
        default="iteration",
        help="iteration: step s uses iteration s %% num-iterations's masks; published: the published pick, "
        "after its micro-step counter moved (default iteration)",
    )
    g.add_argument("--beta", type=float, default=0.01, help="KL weight (0.01)")
    g.add_argument("--epsilon", type=float, default=0.5, help="ratio clip (0.5)")
    g.add_argument("--ref-sync-steps", type=int, default=64, help="steps between reference syncs (64)")
    g.add_argument("--ref-mixup-alpha", type=float, default=0.6, help="policy share in a ref sync (0.6)")
    g.add_argument(
        "--max-prompt-length", type=int, default=200, help="prompt tokens kept, from the end (200)"
    )
    g.add_argument("--max-completion-length", type=int, default=256, help="completion tokens (256)")
    g.add_argument(
        "--diffusion-steps",
        type=int,
        default=None,
        help="denoising steps (default: one per completion token)",
    )
    g.add_argument("--rollout-temperature", type=float, default=1.0, help="sampling temperature (1.0)")
    g.add_argument("--rollout-top-p", type=float, default=0.95, help="nucleus (0.95)")
    g.add_argument("--generation-batch-size", type=int, default=10, help="rows generated together (10)")
    g.add_argument(
        "--rollout-decoder",
        choices=("reference", "fast"),
        default="reference",
        help="reference (published: one token per step) or fast (block-wise; for small models whose "
        "reference rollouts collapse); default reference",
    )
    g.add_argument("--rollout-block-length", type=int, default=32, help="fast rollouts: block (32)")
    g.add_argument("--rollout-threshold", type=float, default=0.9, help="fast rollouts: threshold (0.9)")
    g.add_argument(
        "--micro-batch", type=int, default=None, help="rows per forward/backward (default: the whole batch)"
    )
    g.add_argument("--tp", type=int, default=1, help="tensor-parallel devices per model replica (1)")
    g.add_argument("--dp", type=int, default=None, help="data-parallel replicas (default: the other devices)")


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
        options = RLOptions(
            checkpoint_every=args.checkpoint_every or DEFAULT_CHECKPOINT_EVERY,
            micro_batch=args.micro_batch,
            show_progress=not args.quiet,
            log=log,
            stop_at=args.stop_at,
        )
        facts = train_rl(
            args.out,
            args.tasks,
            init_from=args.init_from,
            rewards=rewards,
            cfg=cfg,
            options=options,
            tp=args.tp,
            dp=args.dp,
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
    if args.checkpoint_every is not None and args.checkpoint_every < 1:
        raise UsageError("--checkpoint-every: must be >= 1")
    if args.stop_at is not None and args.stop_at < 1:
        raise UsageError("--stop-at: must be >= 1")
    return parse_rewards(args.reward)


def _rl_config(args: argparse.Namespace) -> Any:
    """The flags as the trainer's RLConfig; without --steps, one epoch as the recipe (every task once,
    each rollout used num_iterations times)."""
    from model_runtime.train.rl.config import RLConfig
    from model_runtime.train.rl.tasks import read_tasks

    steps = args.steps
    if steps is None:
        n_tasks = len(read_tasks(args.tasks))
        steps = max(1, n_tasks // max(args.prompts_per_step, 1)) * max(args.num_iterations, 1)
    return RLConfig(
        steps=steps,
        prompts_per_step=args.prompts_per_step,
        num_generations=args.num_generations,
        chunk=args.chunk,
        accumulation=args.accumulation,
        num_iterations=args.num_iterations,
        mask_seed_pick=args.mask_seed_pick,
        beta=args.beta,
        epsilon=args.epsilon,
        ref_sync_steps=args.ref_sync_steps,
        ref_mixup_alpha=args.ref_mixup_alpha,
        learning_rate=args.lr if args.lr is not None else DEFAULT_LR,
        warmup_steps=args.warmup or 0,
        min_lr_ratio=args.min_lr_ratio,
        weight_decay=args.weight_decay,
        max_prompt_length=args.max_prompt_length,
        max_completion_length=args.max_completion_length,
        diffusion_steps=args.diffusion_steps or args.max_completion_length,
        temperature=args.rollout_temperature,
        top_p=args.rollout_top_p,
        generation_batch_size=args.generation_batch_size,
        rollout_decoder=args.rollout_decoder,
        block_length=args.rollout_block_length,
        threshold=args.rollout_threshold,
        seed=args.seed,
    )
