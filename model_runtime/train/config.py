"""What a pre-training or instruction-tuning run is asked to do, declared once (``model_runtime.options``):
``TrainConfig`` (the optimisation: what changes the weights, recorded in run.json), ``ModelShape`` (a
from-scratch model's architecture), ``CorpusOptions`` (which files become the corpus), ``SFTOptions``
(how a conversation file becomes rows), ``LoopOptions`` and ``RunOptions`` (how the loop runs, evaluates
and exports; never what it computes).

Each option's type, default, bounds and help are here; ``diffu train``'s flags are derived from them
(``assistant/cli/train.py``), and a value is checked on construction with the same code as every other
option. Plain Python, no JAX: the command line reads these declarations whenever it builds its parser.
The coupled-GRPO settings are ``model_runtime/train/rl/config.py``'s, which takes the shared ones from
here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from model_runtime.errors import InputError
from model_runtime.options import like, option, validate

# Directories nobody wants in a code corpus: VCS data, caches, virtual environments, build outputs.
DEFAULT_EXCLUDES = (".*", "__pycache__", "site-packages", "node_modules", "venv", "build", "dist")
DEFAULT_SUFFIXES = (".py",)
# Generated tables and data dumps (unicode databases, pydoc topic text) teach a code model little and
# would take a large share of a small corpus.
DEFAULT_MAX_FILE_BYTES = 300_000
# The smallest masking ratio t of the objective (t ~ U[eps, 1]): the loss weight 1/t stays bounded.
DEFAULT_EPS = 1e-3


def input_error(name: str, problem: str) -> InputError:
    """A declared option's problem as the trainer's error (the CLI shows it as one line)."""
    return InputError(f"{name}: {problem}")


def default_warmup(steps: int) -> int:
    """Warm-up steps when none are asked for: 10% of the run, at most 100 (the old fixed default), so a
    short run (``--steps 50``) gets a warm-up it can hold instead of an error."""
    return min(100, steps // 10)


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings. Everything that changes the computed weights is here (and in run.json)."""

    steps: int = option(1000, ge=1, help="optimizer steps")
    batch_size: int = option(16, ge=1, help="sequences per step, over all devices")
    # Position 0 is never a target (the objective shifts the logits by one), so a sequence needs two.
    seq_len: int = option(256, ge=2, help="tokens per training sequence")
    learning_rate: float = option(1e-3, gt=0, help="peak learning rate")
    warmup_steps: int = option(100, ge=0, help="linear warmup steps")
    min_lr_ratio: float = option(0.1, ge=0, le=1, help="cosine floor / peak")
    weight_decay: float = option(0.1, ge=0, help="AdamW's decoupled weight decay")
    b1: float = option(0.9, ge=0, lt=1, help="AdamW's first-moment decay")
    b2: float = option(0.95, ge=0, lt=1, help="AdamW's second-moment decay")
    grad_clip: float = option(1.0, gt=0, help="the gradients' global norm is clipped to this")
    ema_decay: float = option(0.995, ge=0, lt=1, help="decay of the exponential moving average of weights")
    eps: float = option(DEFAULT_EPS, gt=0, lt=1, help="the smallest masking ratio the objective draws")
    seed: int = option(0, help="seed of the initial weights, the batches and the masks")

    def __post_init__(self) -> None:
        validate(self, input_error)
        if not self.warmup_steps <= self.steps:
            raise InputError(f"warmup_steps: must be in [0, steps={self.steps}], got {self.warmup_steps}")


@dataclass(frozen=True)
class ModelShape:
    """Architecture of a from-scratch model (ignored with ``init_from``); the names are config.json's."""

    vocab_size: int = option(8192, ge=1, help="BPE vocabulary incl. special tokens")
    hidden_size: int = option(256, ge=1, help="hidden_size: the width of the residual stream")
    intermediate_size: int = option(768, ge=1, help="intermediate_size: the MLP's hidden width")
    num_hidden_layers: int = option(6, ge=1, help="num_hidden_layers")
    num_attention_heads: int = option(4, ge=1, help="num_attention_heads")
    num_key_value_heads: int = option(2, ge=1, help="num_key_value_heads")
    max_position_embeddings: int = option(1024, ge=1, help="max_position_embeddings")
    rope_theta: float = option(10000.0, gt=0, help="rope_theta: the rotary embedding's base")

    def __post_init__(self) -> None:
        validate(self, input_error)


@dataclass(frozen=True)
class CorpusOptions:
    """Which source files become the corpus, and the share held out for evaluation."""

    suffixes: tuple[str, ...] = option(DEFAULT_SUFFIXES, help="file suffix to include; repeatable")
    excludes: tuple[str, ...] = option(
        DEFAULT_EXCLUDES, help="skip paths with a component matching GLOB; repeatable, added to the defaults"
    )
    max_file_bytes: int = option(DEFAULT_MAX_FILE_BYTES, ge=1, help="skip larger files")
    heldout_permille: int = option(
        20, ge=0, lt=1000, help="files (with --sft: conversations) per thousand held out for evaluation"
    )

    def __post_init__(self) -> None:
        validate(self, input_error)


@dataclass(frozen=True)
class SFTOptions:
    """How a data file becomes rows; ``on_bad_line``: ``stop`` (raise, naming the line) or ``skip``."""

    on_bad_line: str = option(
        "stop",
        choices=("stop", "skip"),
        help="a DATA line that cannot be used: stop with its line number, or skip it and say so",
    )
    # Conversations per thousand held out (by a hash of the line) for evaluation: one flag for both.
    heldout_permille: int = like(CorpusOptions, "heldout_permille")
    mix_code: float = option(
        0.0,
        ge=0,
        lt=1,
        help="with SOURCE: this share of every batch is code windows of SOURCE, trained as in pre-training, "
        "so the model keeps completing and infilling raw code; 0: conversations only",
    )

    def __post_init__(self) -> None:
        validate(self, input_error)


@dataclass
class LoopOptions:
    """How the loop runs (not what it computes): changing these never changes the weights."""

    checkpoint_every: int = option(100, ge=1, help="steps between checkpoints")
    keep_checkpoints: int = option(2, ge=1, help="checkpoints kept (the newest)")
    eval_every: int = option(0, ge=0, help="steps between held-out evaluations; 0: only at the end")
    # Stop after this step of the ``steps`` schedule (a time-boxed run); the same command without it
    # resumes towards ``steps``. None: train to the end.
    stop_at: int | None = option(
        None,
        ge=1,
        help="stop after STEP of the --steps schedule, then evaluate (not with --rl) and export (a time-boxed"
        " run); the same command without it continues towards --steps",
    )
    log_every: int = option(10, ge=1, help="steps between lines in OUT/metrics.jsonl")
    show_progress: bool = True
    # Called after every step with (step, metrics); tests use it to record losses or stop a run.
    on_step: Callable[[int, dict[str, float]], None] | None = None
    # Called every eval_every steps with (step, the EMA parameters, an nnx.State); returns metrics to log.
    evaluate: Callable[[int, Any], dict[str, Any]] | None = None

    def __post_init__(self) -> None:
        validate(self, input_error)


@dataclass
class RunOptions:
    """Evaluation and export settings, and where messages go."""

    eval_windows: int = option(256, ge=1, help="held-out windows for the final evaluation")
    eval_infill_cases: int = option(256, ge=0, help="held-out lines for the final infill eval")
    periodic_eval_windows: int = option(32, ge=1, help="held-out windows for a periodic evaluation")
    periodic_eval_infill_cases: int = option(32, ge=0, help="held-out lines for a periodic evaluation")
    export_dtype: str = option("bfloat16", choices=("bfloat16", "float32"), help="weights of OUT/model")
    log: Callable[[str], None] = print
    loop: LoopOptions = field(default_factory=LoopOptions)

    def __post_init__(self) -> None:
        validate(self, input_error)
