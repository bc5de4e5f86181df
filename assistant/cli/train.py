"""``diffu train``: train a DiffuCoder-architecture model on a directory of source files, or fine-tune one.

One command runs the whole pipeline in ``--out``: a byte-level BPE tokenizer with DiffuCoder's special
tokens (from scratch only), memory-mapped token shards with a held-out split by file, the masked-diffusion
objective with AdamW + warmup/cosine, orbax checkpoints, periodic held-out evaluation, and an export to
the published layout in ``OUT/model`` (``diffu serve --model OUT/model``). Running the same command again
resumes from the last checkpoint; Ctrl-C or SIGTERM checkpoints before stopping.

``--sft DATA.jsonl --init-from MODEL`` instruction-tunes MODEL on conversations instead
(``model_runtime/train/sft.py``); SOURCE is then optional and, when given, its held-out code is evaluated
as in pre-training.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from assistant.cli import train_rl


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "train",
        help="train a small DiffuCoder-architecture model, or fine-tune one on your code",
        description="Train (or, with --init-from, fine-tune) a Dream/DiffuCoder masked-diffusion model on "
        "the source files under SOURCE. Re-running the same command resumes the run in --out.",
    )
    p.add_argument(
        "source",
        type=Path,
        nargs="?",
        help="directory of source files (searched recursively); optional with --sft, not with --rl",
    )
    p.add_argument("--out", type=Path, required=True, help="run directory; the model lands in OUT/model")
    p.add_argument(
        "--init-from", default=None, metavar="MODEL", help="fine-tune this checkpoint (directory or hub id)"
    )
    _add_sft_options(p)
    _add_corpus_options(p)
    _add_model_options(p)
    _add_optimisation_options(p)
    _add_run_options(p)
    train_rl.add_arguments(p)
    p.set_defaults(func=run)


def _add_sft_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("instruction tuning")
    g.add_argument(
        "--sft",
        type=Path,
        default=None,
        metavar="DATA",
        help='instruction-tune --init-from on DATA: JSONL, one {"messages": [...]} conversation a line',
    )
    g.add_argument(
        "--mix-code",
        type=float,
        default=0.0,
        metavar="SHARE",
        help="with SOURCE: this share of every batch is code windows of SOURCE, trained as in pre-training, "
        "so the model keeps completing and infilling raw code (default 0: conversations only)",
    )
    g.add_argument(
        "--on-bad-line",
        choices=("stop", "skip"),
        default="stop",
        help="a DATA line that cannot be used: stop with its line number, or skip it and say so (stop)",
    )


def _add_corpus_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("corpus")
    g.add_argument(
        "--suffix", action="append", default=None, help="file suffix to include; repeatable (default .py)"
    )
    g.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="GLOB",
        help="skip paths with a component matching GLOB; repeatable (added to .*, __pycache__, "
        "site-packages, node_modules, venv, build, dist)",
    )
    g.add_argument("--max-file-bytes", type=int, default=300_000, help="skip larger files (default 300000)")
    g.add_argument(
        "--heldout-permille",
        type=int,
        default=20,
        help="files (with --sft: conversations) per thousand held out for evaluation (20)",
    )


def _add_model_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model (from scratch; ignored with --init-from)")
    g.add_argument("--vocab-size", type=int, default=8192, help="BPE vocabulary incl. special tokens (8192)")
    g.add_argument("--hidden-size", type=int, default=256)
    g.add_argument("--intermediate-size", type=int, default=768)
    g.add_argument("--layers", type=int, default=6, help="num_hidden_layers (6)")
    g.add_argument("--heads", type=int, default=4, help="num_attention_heads (4)")
    g.add_argument("--kv-heads", type=int, default=2, help="num_key_value_heads (2)")
    g.add_argument("--max-position", type=int, default=1024, help="max_position_embeddings (1024)")


def _add_optimisation_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("optimisation")
    g.add_argument("--steps", type=int, default=None, help="optimizer steps (1000)")
    g.add_argument("--batch-size", type=int, default=16, help="sequences per step, over all devices (16)")
    g.add_argument("--seq-len", type=int, default=256)
    g.add_argument("--lr", type=float, default=None, help="peak learning rate (1e-3)")
    g.add_argument(
        "--warmup", type=int, default=None, help="linear warmup steps (10%% of --steps, at most 100)"
    )
    g.add_argument("--min-lr-ratio", type=float, default=0.1, help="cosine floor / peak (0.1)")
    g.add_argument("--weight-decay", type=float, default=0.1)
    g.add_argument("--ema-decay", type=float, default=0.995)
    g.add_argument("--seed", type=int, default=0)


def _add_run_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("run")
    g.add_argument(
        "--checkpoint-every", type=int, default=None, help="steps between checkpoints (100; --rl: 10)"
    )
    g.add_argument("--log-every", type=int, default=10, help="steps between lines in OUT/metrics.jsonl (10)")
    g.add_argument("--eval-every", type=int, default=0, help="steps between held-out evaluations (0: end)")
    g.add_argument(
        "--stop-at",
        type=int,
        default=None,
        metavar="STEP",
        help="stop after STEP of the --steps schedule, then evaluate (not with --rl) and export (a time-boxed"
        " run); the same command without it continues towards --steps",
    )
    g.add_argument(
        "--eval-infill-cases", type=int, default=256, help="held-out lines for the final infill eval (256)"
    )
    g.add_argument(
        "--export-dtype", choices=("bfloat16", "float32"), default="bfloat16", help="weights of OUT/model"
    )
    g.add_argument("--quiet", action="store_true", help="no progress bar (logs still go to OUT)")
    g.add_argument(
        "--prepare-only",
        action="store_true",
        help="build the tokenizer and the token shards in OUT, then stop (train later, or elsewhere)",
    )


def run(args: argparse.Namespace) -> int:
    from assistant.errors import UsageError

    if args.rl is not None:
        return train_rl.run(args)
    _check(args)
    # Heavy imports only now: the CLI must start without JAX.
    from rich.console import Console

    from model_runtime.errors import DiffuError
    from model_runtime.train.run import train_model

    console = Console(stderr=True, soft_wrap=True)
    try:
        cfg, shape, copts, ropts = _run_options(args, lambda msg: console.print(msg, highlight=False))
        common = {"init_from": args.init_from, "cfg": cfg, "ropts": ropts, "copts": copts}
        if args.sft is not None:
            from model_runtime.train.sft import train_sft
            from model_runtime.train.sft_data import SFTOptions

            sopts = SFTOptions(
                on_bad_line=args.on_bad_line, heldout_permille=args.heldout_permille, mix_code=args.mix_code
            )
            facts = train_sft(args.out, args.sft, sopts=sopts, source=args.source, **common)
        else:
            facts = train_model(args.out, args.source, shape=shape, prepare_only=args.prepare_only, **common)
    except DiffuError as exc:
        raise UsageError(str(exc)) from None
    except KeyboardInterrupt:
        console.print(f"stopped; the run is checkpointed: run the same command to resume ({args.out})")
        return 130
    if args.prepare_only:
        print(json.dumps(facts["corpus"], indent=2))
        return 0
    held = {
        name: {k: v for k, v in facts[name].items() if not isinstance(v, list)}
        for name in ("heldout", "sft_heldout")
        if name in facts
    }
    print(json.dumps(held["heldout"] if list(held) == ["heldout"] else held, indent=2))
    return 0


def _check(args: argparse.Namespace) -> None:
    """The flags of pre-training and SFT checked (one line each), and their defaults where --rl has its
    own."""
    from assistant.errors import UsageError

    if args.sft is not None:
        if args.init_from is None:
            raise UsageError("--sft needs --init-from MODEL: the model to instruction-tune")
        if args.prepare_only:
            raise UsageError("--prepare-only builds a code corpus; it does not apply to --sft")
        if not args.sft.is_file():
            raise UsageError(f"--sft {args.sft}: no such file")
        if args.mix_code and args.source is None:
            raise UsageError("--mix-code needs SOURCE: the directory whose code windows are mixed in")
    elif args.source is None:
        raise UsageError(
            "SOURCE is required: a directory of source files (or instruction-tune with --sft, "
            "or --rl with --tasks)"
        )
    # Defaults that --rl sets its own way (the recipe's); pre-training's and SFT's.
    args.steps = 1000 if args.steps is None else args.steps
    args.lr = 1e-3 if args.lr is None else args.lr
    args.checkpoint_every = 100 if args.checkpoint_every is None else args.checkpoint_every
    if args.source is not None and not args.source.is_dir():
        raise UsageError(f"SOURCE {args.source} is not a directory")
    if args.checkpoint_every < 1:
        raise UsageError("--checkpoint-every: must be >= 1")
    if args.log_every < 1:
        raise UsageError("--log-every: must be >= 1")
    if args.eval_every < 0:
        raise UsageError("--eval-every: must be >= 0")
    if args.stop_at is not None and args.stop_at < 1:
        raise UsageError("--stop-at: must be >= 1")


def _run_options(args: argparse.Namespace, log: Callable[[str], None]) -> tuple[Any, Any, Any, Any]:
    """The flags as the trainer's option objects: (TrainConfig, ModelShape, CorpusOptions, RunOptions)."""
    from model_runtime.train.corpus import DEFAULT_EXCLUDES
    from model_runtime.train.loop import LoopOptions, TrainConfig, default_warmup
    from model_runtime.train.run import CorpusOptions, ModelShape, RunOptions

    cfg = TrainConfig(
        steps=args.steps,
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        learning_rate=args.lr,
        warmup_steps=args.warmup if args.warmup is not None else default_warmup(args.steps),
        min_lr_ratio=args.min_lr_ratio,
        weight_decay=args.weight_decay,
        ema_decay=args.ema_decay,
        seed=args.seed,
    )
    shape = ModelShape(
        vocab_size=args.vocab_size,
        hidden_size=args.hidden_size,
        intermediate_size=args.intermediate_size,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        max_position_embeddings=args.max_position,
    )
    copts = CorpusOptions(
        suffixes=tuple(args.suffix or (".py",)),
        excludes=DEFAULT_EXCLUDES + tuple(args.exclude),
        max_file_bytes=args.max_file_bytes,
        heldout_permille=args.heldout_permille,
    )
    ropts = RunOptions(
        eval_infill_cases=args.eval_infill_cases,
        export_dtype=args.export_dtype,
        log=log,
        loop=LoopOptions(
            checkpoint_every=args.checkpoint_every,
            eval_every=args.eval_every,
            log_every=args.log_every,
            show_progress=not args.quiet,
            stop_at=args.stop_at,
        ),
    )
    return cfg, shape, copts, ropts
