"""What a coupled-GRPO run is asked to do: ``RLConfig`` (what changes the computed weights, recorded in
run.json), ``Reward`` (a reward function and its weight) and ``RLOptions`` (how the loop runs).

Plain dataclasses, no JAX: a setting is checked when the config is built, before anything loads.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from model_runtime.errors import InputError


@dataclass(frozen=True)
class RLConfig:
    """Everything that changes the computed weights (recorded in run.json). Defaults: the published
    recipe (recipes/config_coupled_code.yaml with TRL's defaults), except ``steps`` and
    ``mask_seed_pick`` (docs/training.md says why)."""

    steps: int = 100
    prompts_per_step: int = 8  # unique prompts per rollout: 8 x 10 = 5 per device x 8 GPUs x 2 accum.
    num_generations: int = 10
    chunk: int = 5  # rows per token-level normalisation (per_device_train_batch_size)
    # Published gradient_accumulation_steps: a device group (one mask draw) is chunk x accumulation rows.
    accumulation: int = 2
    # "iteration": step s uses the masks of iteration s % num_iterations for every row. "published": the
    # published pick, made after TRL's micro-step counter has moved (see RLTrainer.iterations_at).
    mask_seed_pick: str = "iteration"
    num_iterations: int = 2
    beta: float = 0.01
    epsilon: float = 0.5
    ref_sync_steps: int = 64
    ref_mixup_alpha: float = 0.6
    learning_rate: float = 1e-6
    warmup_steps: int = 0
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    b1: float = 0.9
    b2: float = 0.99
    grad_clip: float = 0.2
    max_prompt_length: int = 200
    max_completion_length: int = 256
    diffusion_steps: int = 256
    temperature: float = 1.0
    top_p: float = 0.95
    generation_batch_size: int = 10
    # Not the recipe: "fast" samples rollouts with diffu's block-wise decoder (see rollout.py).
    rollout_decoder: str = "reference"
    block_length: int = 32
    threshold: float = 0.9
    random_masking: bool = True
    seed: int = 42

    def __post_init__(self) -> None:
        def need(cond: bool, name: str, msg: str) -> None:
            if not cond:
                raise InputError(f"{name}: {msg}, got {getattr(self, name)}")

        for name in (
            "steps",
            "prompts_per_step",
            "chunk",
            "accumulation",
            "num_iterations",
            "ref_sync_steps",
        ):
            need(getattr(self, name) >= 1, name, "must be >= 1")
        for name in (
            "max_prompt_length",
            "max_completion_length",
            "diffusion_steps",
            "generation_batch_size",
        ):
            need(getattr(self, name) >= 1, name, "must be >= 1")
        need(self.num_generations >= 2, "num_generations", "must be >= 2 (the advantage leaves one out)")
        need(self.rows % self.chunk == 0, "chunk", f"must divide the {self.rows} completions per rollout")
        need(
            self.rows % self.device_rows == 0,
            "accumulation",
            f"chunk x accumulation ({self.device_rows} rows per device group) must divide the {self.rows} "
            "completions per rollout",
        )
        need(
            self.mask_seed_pick in ("iteration", "published"),
            "mask_seed_pick",
            "must be iteration or published",
        )
        need(self.beta >= 0, "beta", "must be >= 0")
        need(0 < self.epsilon < 1, "epsilon", "must be in (0, 1)")
        need(0 <= self.ref_mixup_alpha <= 1, "ref_mixup_alpha", "must be in [0, 1]")
        need(self.learning_rate > 0, "learning_rate", "must be > 0")
        need(0 <= self.warmup_steps <= self.steps, "warmup_steps", f"must be in [0, steps={self.steps}]")
        need(self.temperature >= 0, "temperature", "must be >= 0")
        need(0 < self.top_p <= 1, "top_p", "must be in (0, 1]")
        need(self.rollout_decoder in ("reference", "fast"), "rollout_decoder", "must be reference or fast")
        need(self.block_length >= 1, "block_length", "must be >= 1")
        need(0 < self.threshold <= 1, "threshold", "must be in (0, 1]")

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

    checkpoint_every: int = 10
    keep_checkpoints: int = 2
    micro_batch: int | None = None  # rows per forward/backward (a multiple of chunk); None: all at once
    show_progress: bool = True
    log: Callable[[str], None] = print
    on_step: Callable[[int, dict[str, Any]], None] | None = None
    stop_at: int | None = None  # end this invocation after this step (checkpointed), short of cfg.steps
