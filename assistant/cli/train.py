"""``diffu train``: train a DiffuCoder-architecture model on a directory of source files, or fine-tune one.

One command runs the whole pipeline in ``--out``: a byte-level BPE tokenizer with DiffuCoder's special
tokens (from scratch only), memory-mapped token shards with a held-out split by file, the masked-diffusion
objective with AdamW + warmup/cosine, orbax checkpoints, periodic held-out evaluation, and an export to
the published layout in ``OUT/model`` (``diffu serve --model OUT/model``). Running the same command again
resumes from the last checkpoint; Ctrl-C or SIGTERM checkpoints before stopping.

``--sft DATA.jsonl --init-from MODEL`` instruction-tunes MODEL on conversations instead
(``model_runtime/train/sft.py``); SOURCE is then optional and, when given, its held-out code is evaluated
as in pre-training.

The flags of the training options are derived from their declarations (``model_runtime/train/config.py``
through ``train_flags.py``); the ones here by hand are the command's shape: SOURCE, --out, --init-from,
--sft, --quiet and --prepare-only.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from assistant.cli import train_rl
from assistant.cli.train_flags import CORPUS, LOOP, RL_LOOP, RUN, SFT, SHAPE, TRAIN, add, check, given

if TYPE_CHECKING:
    from model_runtime.train.config import CorpusOptions, ModelShape, RunOptions, TrainConfig


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
    add(g, SFT["mix_code"], metavar="SHARE")
    add(g, SFT["on_bad_line"])


def _add_corpus_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("corpus")
    add(g, CORPUS["suffixes"])
    add(g, CORPUS["excludes"], metavar="GLOB")
    add(g, CORPUS["max_file_bytes"])
    add(g, CORPUS["heldout_permille"])


def _add_model_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model (from scratch; ignored with --init-from)")
    for name in SHAPE:
        # Bare flags (no help) keep diffu train --help as it was before the options were declared.
        bare = name in ("hidden_size", "intermediate_size")
        if name != "rope_theta":  # not a flag: the architecture's base, as the published model's
            add(g, SHAPE[name], show_help=not bare)


def _add_optimisation_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("optimisation")
    # --steps, --lr and --warmup: --rl has its own defaults (the group's title says), so "not given".
    add(g, TRAIN["steps"], default=None, default_text=str(TRAIN["steps"].default))
    add(g, TRAIN["batch_size"])
    add(g, TRAIN["seq_len"], show_help=False)
    add(g, TRAIN["learning_rate"], default=None, default_text=str(TRAIN["learning_rate"].default))
    add(g, TRAIN["warmup_steps"], default=None, default_text="10% of --steps, at most 100")  # default_warmup
    add(g, TRAIN["min_lr_ratio"])
    for name in ("weight_decay", "ema_decay", "seed"):  # bare, as they always were (see the model's)
        add(g, TRAIN[name], show_help=False)


def _add_run_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("run")
    every = f"{LOOP['checkpoint_every'].default}; --rl: {RL_LOOP['checkpoint_every'].default}"
    add(g, LOOP["checkpoint_every"], default=None, default_text=every)
    add(g, LOOP["log_every"])
    add(g, LOOP["eval_every"])
    add(g, LOOP["stop_at"], metavar="STEP")
    add(g, RUN["eval_infill_cases"])
    add(g, RUN["export_dtype"], default_text="")  # its help never showed the default: it still does not
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
            from model_runtime.train.config import SFTOptions
            from model_runtime.train.sft import train_sft

            sopts = SFTOptions(**given(args, SFT))
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
    """The flags of pre-training and SFT checked (one line each, by their options), and their defaults
    where --rl has its own."""
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
    check(args, (TRAIN, SHAPE, CORPUS, SFT, LOOP, RUN))
    # Defaults that --rl sets its own way (the recipe's); pre-training's and SFT's.
    for name, declared in (("steps", TRAIN), ("learning_rate", TRAIN), ("checkpoint_every", LOOP)):
        if getattr(args, name) is None:
            setattr(args, name, declared[name].default)
    if args.source is not None and not args.source.is_dir():
        raise UsageError(f"SOURCE {args.source} is not a directory")


def _run_options(
    args: argparse.Namespace, log: Callable[[str], None]
) -> tuple[TrainConfig, ModelShape, CorpusOptions, RunOptions]:
    """The flags as the trainer's option objects: (TrainConfig, ModelShape, CorpusOptions, RunOptions)."""
    from model_runtime.train.config import (
        DEFAULT_EXCLUDES,
        CorpusOptions,
        LoopOptions,
        ModelShape,
        RunOptions,
        TrainConfig,
        default_warmup,
    )

    warmup = args.warmup_steps if args.warmup_steps is not None else default_warmup(args.steps)
    cfg = TrainConfig(**{**given(args, TRAIN), "warmup_steps": warmup})
    shape = ModelShape(**given(args, SHAPE))
    copts = CorpusOptions(
        **{
            **given(args, CORPUS),
            "suffixes": tuple(args.suffixes or CORPUS["suffixes"].default),
            # A user's globs are skipped as well as the defaults, not instead of them.
            "excludes": DEFAULT_EXCLUDES + tuple(args.excludes or ()),
        }
    )
    loop = LoopOptions(**given(args, LOOP), show_progress=not args.quiet)
    ropts = RunOptions(**given(args, RUN), log=log, loop=loop)
    return cfg, shape, copts, ropts
