"""``diffu train``'s flags are derived from the training options' declarations
(``model_runtime/train/config.py``, ``model_runtime/train/rl/config.py``): each flag's name, type,
choices, default and help are its option's, and a value out of bounds is the option's one-line message,
given before anything loads."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from assistant.cli.main import build_parser, main
from assistant.cli.train_flags import CORPUS, FLAG_NAMES, LOOP, RL, RL_LOOP, RUN, SFT, SHAPE, TRAIN
from model_runtime.options import options
from model_runtime.params import SamplingParams

TABLES = (TRAIN, SHAPE, CORPUS, SFT, LOOP, RUN, RL, RL_LOOP)


def _train_actions() -> dict[str, argparse.Action]:
    return {action.dest: action for action in build_parser()[1]["train"]._actions}


def test_every_flag_of_an_option_is_derived_from_its_declaration() -> None:
    actions = _train_actions()
    derived = set()
    for table in TABLES:
        for name, opt in table.items():
            action = actions.get(name)
            if action is None:
                continue  # an option without a flag (b1, keep_checkpoints, ...)
            derived.add(name)
            assert action.option_strings == ["--" + FLAG_NAMES.get(name, name.replace("_", "-"))]
            assert action.type is opt.base, name
            if opt.kind is str:
                assert tuple(action.choices or ()) == opt.choices, name
            if action.help is not None:  # a few flags keep the bare line they always had
                assert action.help.startswith(opt.help.replace("%", "%%")), name
            # The declared default, or None where the mode decides (--steps, --lr, --warmup, ...).
            declared = {t[name].default for t in TABLES if name in t}
            assert action.default is None or action.default in declared, name
    assert len(derived) == 50
    # --rollout-decoder is the sampling option's, not a narrower copy of it.
    assert actions["rollout_decoder"].choices == options(SamplingParams)["decoder"].choices


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--batch-size", "0"], "diffu: error: --batch-size: must be >= 1, got 0"),
        (["--lr", "0"], "diffu: error: --lr: must be > 0, got 0.0"),
        (["--checkpoint-every", "0"], "diffu: error: --checkpoint-every: must be >= 1, got 0"),
        (["--heldout-permille", "1000"], "diffu: error: --heldout-permille: must be in [0, 1000), got 1000"),
        (["--mix-code", "1"], "diffu: error: --mix-code: must be in [0, 1), got 1.0"),
    ],
)
def test_a_bad_pre_training_flag_is_its_options_message(
    flags: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["train", str(tmp_path), "--out", str(tmp_path / "run"), *flags]) == 2
    assert capsys.readouterr().err.strip() == message


def test_a_bad_rl_flag_is_its_options_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rl = ["train", "--rl", "coupled-grpo", "--tasks", str(tmp_path / "t.jsonl"), "--init-from", "x"]
    rl += ["--out", str(tmp_path / "run")]
    cases = [
        (["--rollout-top-p", "1.5"], "--rollout-top-p: must be in (0, 1], got 1.5"),
        (["--num-generations", "1"], "--num-generations: must be >= 2, got 1"),
        (["--rollout-block-length", "24"], "--rollout-block-length: must be one of 1, 2, 4, 8, 16, 32"),
        (["--stop-at", "0"], "--stop-at: must be >= 1, got 0"),
        (["--tp", "0"], "--tp: must be >= 1, got 0"),
    ]
    for flags, message in cases:
        assert main([*rl, *flags]) == 2
        assert capsys.readouterr().err.startswith("diffu: error: " + message)
    # Any decoder samples rollouts; a name that is none is refused with the sampling option's choices.
    with pytest.raises(SystemExit) as exit_info:
        main([*rl, "--steps", "1", "--rollout-decoder", "slidng"])
    assert exit_info.value.code == 2
    said = capsys.readouterr().err
    assert "invalid choice 'slidng' (one of reference, fast, sliding); did you mean sliding?" in said
