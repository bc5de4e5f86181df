"""Put together the bundled chat model's metrics.json from the runs that made it.

    python scripts/bundled_metrics.py STAGE2_RUN --stage1 STAGE1_RUN --pretraining BASE_MODEL \\
        --corpus STAGE1_RUN/corpus --record HELDOUT_REQUESTS.json [--before OLD_MODEL] --out FILE \\
        [--stage3 STAGE3_RUN --two-turn TWO_TURN.json [--two-turn-before STAGE2_TWO_TURN.json]]

``scripts/train_bundled_sft.sh`` calls this and installs FILE as the model's metrics.json. Each stage's
own ``RUN/model/metrics.json`` only knows its stage (and is left as it is), and stage 2 passes no corpus,
so the weights that ship would have no held-out code figures (tests/model_runtime/train/test_train.py
reads them). FILE gets:

- ``heldout``: the held-out code evaluation of the final weights (what ``diffu train SOURCE`` reports at
  its end: masked-token accuracy at three mask rates, line infill) on the pre-training's held-out files;
- ``sft``: stage 1 and stage 2 (and stage 3, the topic changes, with ``--stage3``: then its weights are
  the final ones), their schedules, data and held-out conversation figures;
- ``topic_change`` (with ``--two-turn``): the held-out two-turn conversations' leak of the final weights,
  ``topic_change_before`` that of stage 2's (``--two-turn-before``), answers left out;
- ``heldout_requests`` (the chat defaults ``sft_heldout.py --record`` chose), ``heldout_requests_grid``
  (every setting it tried) and ``heldout_requests_before`` (the model being replaced, from ``--before``);
- ``pretraining``: the pre-trained model's metrics.json, as it is.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from assistant.evals import instructions as ins


def _read(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def _last_train_line(run: Path) -> dict[str, Any]:
    """The last logged training step of RUN/metrics.jsonl (where a stopped schedule stood)."""
    text = (run / "metrics.jsonl").read_text(encoding="utf-8")
    lines = [json.loads(x) for x in text.splitlines() if x.strip()]
    return next((x for x in reversed(lines) if "loss" in x and "final_eval" not in x), {})


def stage(run: Path, facts: dict[str, Any], init_from: str) -> dict[str, Any]:
    """One stage's entry under ``sft``, from its run directory and its own metrics.json ``facts``."""
    t = facts["train"]
    out = {
        "init_from": init_from,
        "steps_done": t["steps_done"],
        "schedule_steps": t["steps"],
        "batch": f"{t['batch_size']} conversations x {t['seq_len']} tokens",
        "lr": (
            f"AdamW, peak {t['learning_rate']:g} after {t['warmup_steps']} warmup steps, cosine to "
            f"{t['learning_rate'] * t['min_lr_ratio']:g}"
        ),
        "ema_decay": t["ema_decay"],
        "seed": t["seed"],
        "seconds": t["seconds"],
        "data": facts["sft_data"],
        "train_metrics_at_stop": _last_train_line(run),
    }
    if "sft_heldout" in facts:
        out["sft_heldout"] = facts["sft_heldout"]
    out["hardware"] = facts["hardware"]
    return out


def code_eval(model: Path, corpus: Path, seq_len: int, windows: int, cases: int) -> dict[str, Any]:
    """The held-out code evaluation ``diffu train SOURCE`` ends with, of ``model`` on ``corpus``."""
    from model_runtime.loader import load
    from model_runtime.train.config import TrainConfig
    from model_runtime.train.evaluate import evaluate
    from model_runtime.train.run import CodeEval

    loaded = load(model, dtype="float32")  # its config and tokenizer are the ones diffu train evaluates with
    cfg = TrainConfig(seq_len=seq_len)
    code = CodeEval(corpus, loaded.tokenizer, loaded.config, cfg)
    out = evaluate(
        loaded.graphdef,
        loaded.state,
        code.eval_set(windows, cases),
        code.tok,
        eps=cfg.eps,
        return_samples=8,
    )
    out["method"] = (
        f"diffu train's final code evaluation on the pre-training's {len(code.texts)} held-out files: "
        f"{out['heldout_windows']} windows of {seq_len} tokens, {out['infill_cases']} line-infill cases"
    )
    return out


def _results(path: Path) -> list[dict[str, Any]]:
    """The settings' results of an ``sft_heldout.py --json`` file, without their answers."""
    return [{k: v for k, v in r.items() if k != "samples"} for r in _read(path)["results"]]


def merge(
    stage2: Path,
    stage1: Path,
    pretraining: Path,
    corpus: Path,
    record: Path,
    before: Path | None,
    stage3: Path | None = None,
) -> dict[str, Any]:
    results = _results(record)
    stage1_facts = _read(stage1 / "model" / "metrics.json")
    stage2_facts = _read(stage2 / "model" / "metrics.json")
    s1 = stage(stage1, stage1_facts, "the pre-trained demo model")
    s2 = stage(stage2, stage2_facts, "stage 1's model")
    stages = {"stage1": s1, "stage2": s2}
    described = (
        "diffu-demo, instruction-tuned: the pre-trained demo model (under 'pretraining') after "
        f"scripts/train_bundled_sft.sh: stage 1, {s1['steps_done']} steps on conversations (under "
        f"'sft.stage1'), then stage 2, a {s2['steps_done']}-step anneal on the conversations that fit "
        f"{stage2_facts['train']['seq_len']} tokens (under 'sft.stage2')"
    )
    final = stage2
    if stage3 is not None:
        stages["stage3"] = stage(stage3, _read(stage3 / "model" / "metrics.json"), "stage 2's model")
        described += (
            f", then stage 3, {stages['stage3']['steps_done']} steps on stage 2's conversations and "
            "conversations with topic changes (under 'sft.stage3')"
        )
        final = stage3
    out: dict[str, Any] = {
        "model": described + "; EMA weights",
        # Stage 1's evaluation (its context, window and case counts), of the final weights.
        "heldout": code_eval(
            final / "model",
            corpus,
            stage1_facts["train"]["seq_len"],
            stage1_facts["heldout"]["heldout_windows"],
            stage1_facts["heldout"]["infill_cases"],
        ),
        "sft": stages,
        "heldout_requests": ins.best_setting(results),
        "heldout_requests_grid": results,
    }
    if before is not None and (before / "metrics.json").is_file():
        old = _read(before / "metrics.json").get("heldout_requests")
        if old:
            out["heldout_requests_before"] = old | {"model": "the bundled model this one replaced"}
    out["pretraining"] = _read(pretraining / "metrics.json")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("stage2", type=Path, help="stage 2's run directory (its model/ ships)")
    parser.add_argument("--stage1", type=Path, required=True, help="stage 1's run directory")
    parser.add_argument("--pretraining", type=Path, required=True, help="the pre-trained model directory")
    parser.add_argument("--corpus", type=Path, required=True, help="STAGE1_RUN/corpus (tokenized)")
    parser.add_argument("--record", type=Path, required=True, help="sft_heldout.py --record --json's file")
    parser.add_argument("--before", type=Path, default=None, help="the bundled model being replaced")
    parser.add_argument("--out", type=Path, required=True, help="the metrics.json to write")
    parser.add_argument(
        "--stage3", type=Path, default=None, help="stage 3's run directory (its model/ ships)"
    )
    parser.add_argument(
        "--two-turn", type=Path, default=None, help="sft_heldout.py --json of the two-turn set"
    )
    parser.add_argument("--two-turn-before", type=Path, default=None, help="the same, of stage 2's model")
    args = parser.parse_args()
    facts = merge(
        args.stage2, args.stage1, args.pretraining, args.corpus, args.record, args.before, args.stage3
    )
    for key, path in (("topic_change", args.two_turn), ("topic_change_before", args.two_turn_before)):
        if path is not None:
            (result,) = _results(path)
            facts[key] = result
    out = args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(facts, indent=1) + "\n", encoding="utf-8")
    print(
        f"{out}: held-out code acc@0.5 {facts['heldout']['acc@0.5']:.3f}, held-out requests "
        f"{facts['heldout_requests']['good_block']:.1%} good blocks",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
