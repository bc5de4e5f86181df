"""``diffu train``'s flags, derived from the training options' declarations (``model_runtime/train/
config.py`` for pre-training and instruction tuning, ``model_runtime/train/rl/config.py`` for --rl):
each flag's type, choices, default, help and bounds are its option's. ``train.py`` and ``train_rl.py``
lay the flags out in their groups; this module holds what both need: the declarations, the few flag
names that are not their options', and the check of the values given before anything loads.

The declarations import no JAX, so building the parser stays cheap.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Mapping
from typing import Any

from assistant.cli.flags import add_flag, flag_error
from assistant.errors import UsageError
from model_runtime.options import Option, OptionError, options
from model_runtime.train.config import (
    CorpusOptions,
    LoopOptions,
    ModelShape,
    RunOptions,
    SFTOptions,
    TrainConfig,
)
from model_runtime.train.rl.config import RLConfig, RLOptions

TRAIN = options(TrainConfig)
SHAPE = options(ModelShape)
CORPUS = options(CorpusOptions)
SFT = options(SFTOptions)
LOOP = options(LoopOptions)
RUN = options(RunOptions)
RL = options(RLConfig)
RL_LOOP = options(RLOptions)

# Flags whose names are not their options' (they were named before the options were declared); each
# flag's value lands under its option's name (``args.learning_rate`` for ``--lr``).
FLAG_NAMES = {
    "suffixes": "suffix",
    "excludes": "exclude",
    "num_hidden_layers": "layers",
    "num_attention_heads": "heads",
    "num_key_value_heads": "kv-heads",
    "max_position_embeddings": "max-position",
    "learning_rate": "lr",
    "warmup_steps": "warmup",
    "temperature": "rollout-temperature",
    "top_p": "rollout-top-p",
    "block_length": "rollout-block-length",
    "threshold": "rollout-threshold",
}


def add(group: argparse._ActionsContainer, opt: Option, **kwargs: Any) -> None:
    """``opt``'s flag in ``group``, under its flag name (``flags.add_flag`` says what ``kwargs`` do)."""
    add_flag(group, opt, name=FLAG_NAMES.get(opt.name), **kwargs)


def check(args: argparse.Namespace, declared: Iterable[Mapping[str, Option]]) -> None:
    """Check each given flag (not None) against its option in ``declared``: a bad value is the one line
    ``--flag: problem`` the other commands print, before anything loads."""
    for table in declared:
        for name, opt in table.items():
            value = getattr(args, name, None)
            if value is None:
                continue
            try:
                opt.check(tuple(value) if opt.kind is tuple else value)
            except OptionError as exc:
                raise UsageError(flag_error(exc, FLAG_NAMES.get(name))) from None


def given(args: argparse.Namespace, table: Mapping[str, Option]) -> dict[str, Any]:
    """The values of ``table``'s options that have a flag, by option name."""
    return {name: getattr(args, name) for name in table if hasattr(args, name)}
