"""What a coupled-GRPO run is asked to do: ``RLConfig`` (what changes the computed weights, recorded in
run.json), ``Reward`` (a reward function and its weight) and ``RLOptions`` (how the loop runs).

Plain dataclasses, no JAX: a setting is checked when the config is built, before anything loads. Each
option is declared here (``model_runtime.options``), or taken from pre-training's (``TrainConfig``,
``LoopOptions``) or the sampling options (``SamplingParams``) under the recipe's default; ``diffu train
--rl``'s flags are derived from them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from model_runtime.errors import InputError
from model_runtime.options import like, option, validate
from model_runtime.params import SamplingParams
from model_runtime.train.config import LoopOptions, TrainConfig, input_error


@dataclass(frozen=True)
class RLConfig:
    """Everything that changes the computed weights (recorded in run.json). Defaults: the published
    recipe (recipes/config_coupled_code.yaml with TRL's defaults), except ``steps`` and
    ``mask_seed_pick`` (docs/training.md says why). The optimiser's knobs are pre-training's
    (``TrainConfig``) under the recipe's defaults, the rollouts' the sampling options'."""

    steps: int = like(TrainConfig, "steps", default=100)
    # Unique prompts per rollout: 8 x 10 = 5 per device x 8 GPUs x 2 accumulation steps.
    prompts_per_step: int = option(8, ge=1, help="prompts per rollout")
    # At least two: the advantage leaves one out.
    num_generations: int = option(10, ge=2, help="completions per prompt")
    # Rows per token-level normalisation (per_device_train_batch_size).
    chunk: int = option(5, ge=1, help="completions per token-normalised loss chunk")
    # Published gradient_accumulation_steps: a device group (one mask draw) is chunk x accumulation rows.
    accumulation: int = option(
        2,
        ge=1,
        help="chunks per published device (its gradient_accumulation_steps); each --chunk x this rows draw "
        "their own masks",
    )
    # "iteration": step s uses the masks of iteration s % num_iterations for every row. "published": the
    # published pick, made after TRL's micro-step counter has moved (see RLTrainer.iterations_at).
    mask_seed_pick: str = option(
        "iteration",
        choices=("iteration", "published"),
        help="iteration: step s uses iteration s % num-iterations's masks; published: the published pick, "
        "after its micro-step counter moved",
    )
    num_iterations: int = option(2, ge=1, help="updates per rollout")
    beta: float = option(0.01, ge=0, help="KL weight")
    epsilon: float = option(0.5, gt=0, lt=1, help="ratio clip")
    ref_sync_steps: int = option(64, ge=1, help="steps between reference syncs")
    ref_mixup_alpha: float = option(0.6, ge=0, le=1, help="policy share in a ref sync")
    learning_rate: float = like(TrainConfig, "learning_rate", default=1e-6)
    warmup_steps: int = like(TrainConfig, "warmup_steps", default=0)
    min_lr_ratio: float = like(TrainConfig, "min_lr_ratio")
    weight_decay: float = like(TrainConfig, "weight_decay")
    b1: float = like(TrainConfig, "b1")
    b2: float = like(TrainConfig, "b2", default=0.99)
    grad_clip: float = like(TrainConfig, "grad_clip", default=0.2)
    max_prompt_length: int = option(200, ge=1, help="prompt tokens kept, from the end")
    max_completion_length: int = option(256, ge=1, help="completion tokens")
    diffusion_steps: int = like(SamplingParams, "steps", default=256)
    temperature: float = like(SamplingParams, "temperature", default=1.0, help="sampling temperature")
    top_p: float = like(SamplingParams, "top_p", default=0.95, help="nucleus")
    generation_batch_size: int = option(10, ge=1, help="rows generated together")
    # Not the recipe: another decoder samples rollouts with one of diffu's (see rollout.py).
    rollout_decoder: str = like(
        SamplingParams,
        "decoder",
        default="reference",
        help="reference (published: one token per step), or a decoder of diffu's (fast, sliding: faster, "
        "approximate; for small models whose reference rollouts collapse)",
    )
    block_length: int = like(SamplingParams, "block_length", help="fast rollouts: block")
    threshold: float = like(SamplingParams, "threshold", help="fast rollouts: threshold")
    random_masking: bool = True
    seed: int = like(TrainConfig, "seed", default=42)

    def __post_init__(self) -> None:
        def need(cond: bool, name: str, msg: str) -> None:
            if not cond:
                raise InputError(f"{name}: {msg}, got {getattr(self, name)}")

        validate(self, input_error)
        need(self.rows % self.chunk == 0, "chunk", f"must divide the {self.rows} completions per rollout")
        need(
            self.rows % self.device_rows == 0,
            "accumulation",
            f"chunk x accumulation ({self.device_rows} rows per device group) must divide the {self.rows} "
            "completions per rollout",
        )
        need(0 <= self.warmup_steps <= self.steps, "warmup_steps", f"must be in [0, steps={self.steps}]")

    @property
    def rows(self) -> int:
        return self.prompts_per_step * self.num_generations

    @property
    def device_rows(self) -> int:
        """Rows of one published device: a micro-batch (chunk) per accumulation step."""
        return self.chunk * self.accumulation

    @property
    def device_groups(self) -> int:
        """How many devices the published run would spread a rollout over (8 in the recipe)."""
        return self.rows // self.device_rows


@dataclass(frozen=True)
class Reward:
    """A reward function (TRL's signature), its name in metrics and logs, and its weight."""

    name: str
    fn: Callable[..., Sequence[float | None]]
    weight: float


@dataclass
class RLOptions:
    """How the loop runs (never what it computes)."""

    # An RL step is a rollout's worth of work: checkpoint often.
    checkpoint_every: int = like(LoopOptions, "checkpoint_every", default=10)
    keep_checkpoints: int = like(LoopOptions, "keep_checkpoints")
    # Rows per forward/backward (a multiple of chunk); None: all at once.
    micro_batch: int | None = option(None, ge=1, help="rows per forward/backward")
    # Where the policy runs: tensor-parallel devices per replica, data-parallel replicas (None: the rest).
    tp: int = option(1, ge=1, help="tensor-parallel devices per model replica")
    dp: int | None = option(None, ge=1, help="data-parallel replicas")
    show_progress: bool = True
    log: Callable[[str], None] = print
    on_step: Callable[[int, dict[str, Any]], None] | None = None
    # End this invocation after this step (checkpointed), short of cfg.steps.
    stop_at: int | None = like(LoopOptions, "stop_at")

    def __post_init__(self) -> None:
        validate(self, input_error)
