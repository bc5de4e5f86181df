"""Topic changes (issue #45) through the scripts: ``sft_heldout.py`` on held-out two-turn conversations
(the leak, and paired differences against an earlier run), and ``bundled_metrics.py`` with stage 3."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from assistant.cli.main import main
from assistant.evals import topic_change as tc
from tests.assistant.helpers import REPO

NAMES = ("total", "largest", "first", "count", "mean", "last", "double", "square")


def _request(i: int) -> dict:
    name = f"{NAMES[i]}_{i}"
    return {
        "messages": [
            {"role": "user", "content": f"Write `{name}(xs)`: the {NAMES[i]} of a list."},
            {"role": "assistant", "content": f"```python\ndef {name}(xs):\n    return {NAMES[i]}(xs)\n```"},
        ],
        "source": {"path": f"pkg/m{i}.py", "name": name, "kind": "function", "framing": "signature"},
    }


def heldout(model: Path, data: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "scripts/sft_heldout.py", str(model), str(data), "--json", str(out),
           "--decoder", "fast", "--max-new-tokens", "16", "--steps", "16", "--block-length", "16",
           "--batch", "4", "--retry-block", "0", *extra]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc


@pytest.fixture(scope="module")
def two_turn(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """The two-turn file, the tiny model's ``--json`` on it, and what the script printed."""
    root = tmp_path_factory.mktemp("two-turn")
    data = root / "heldout_two_turn.jsonl"
    data.write_text("".join(json.dumps(c) + "\n" for c in tc.two_turn([_request(i) for i in range(8)])))
    out = root / "before.json"
    return data, out, heldout(tiny_dir, data, out).stdout


def test_second_answers_are_scored_for_the_leak(two_turn) -> None:
    data, out, printed = two_turn
    conversations = [json.loads(line) for line in data.read_text().splitlines()]
    (result,) = json.loads(out.read_text())["results"]
    # The whole conversation was sent: each sample's request is the second one.
    assert [s["request"] for s in result["samples"]] == [c["messages"][2]["content"] for c in conversations]
    verdicts = [tc.answered(c, s["answer"]) for c, s in zip(conversations, result["samples"], strict=True)]
    assert [s["answered"] for s in result["samples"]] == verdicts
    found = result["topic_change"]
    assert "verdicts" not in found and found["conversations"] == 8
    assert found["leak"]["count"] == verdicts.count("first")
    assert sum(found[k]["count"] for k in ("leak", "answers_second", "neither")) == 8
    low, high = found["leak"]["ci95"]
    assert low <= found["leak"]["share"] <= high and high > 0  # Wilson's: never a zero-width interval
    assert "second answers: define the first request's name" in printed


def test_a_run_against_itself_differs_by_nothing(tiny_dir, two_turn, tmp_path) -> None:
    data, before, _ = two_turn
    printed = heldout(tiny_dir, data, tmp_path / "again.json", "--before", str(before)).stdout
    assert "  leak: +0.0% against --before (95% CI +0.0% to +0.0%, paired)" in printed
    assert "  good_block: +0.0% against --before" in printed


def test_the_metrics_of_a_model_with_a_third_stage(sft_file_and_stages, two_turn, tmp_path) -> None:
    """scripts/bundled_metrics.py --stage3: stage 3's weights are the final ones, its leak goes along."""
    s1, s3 = sft_file_and_stages
    _, record, _ = two_turn
    base = tmp_path / "base"
    base.mkdir()
    (base / "metrics.json").write_text(json.dumps({"heldout": {"acc@0.5": 0.25}}))
    out = tmp_path / "metrics.json"
    cmd = [sys.executable, "scripts/bundled_metrics.py", str(s1), "--stage1", str(s1), "--pretraining",
           str(base), "--corpus", str(s1 / "corpus"), "--record", str(record), "--out", str(out),
           "--stage3", str(s3), "--two-turn", str(record), "--two-turn-before", str(record)]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    facts = json.loads(out.read_text())
    assert facts["sft"]["stage3"]["steps_done"] == 2 and "then stage 3, 2 steps" in facts["model"]
    stage1 = json.loads((s1 / "model" / "metrics.json").read_text())["heldout"]
    assert facts["heldout"]["loss"] != pytest.approx(stage1["loss"], rel=1e-3)  # stage 3's weights
    assert facts["topic_change"]["topic_change"]["conversations"] == 8
    assert "samples" not in facts["topic_change"] and facts["topic_change_before"] == facts["topic_change"]


@pytest.fixture(scope="module")
def sft_file_and_stages(source_dir, tiny_dir, tmp_path_factory) -> tuple[Path, Path]:
    """Two tiny ``diffu train --sft`` runs, the second from the first's model (stage 3 from "stage 2")."""
    root = tmp_path_factory.mktemp("stages")
    data = root / "turns.jsonl"
    rows = [_request(i) for i in range(8)]
    data.write_text("".join(json.dumps(c) + "\n" for c in rows * 4 + tc.two_turn(rows)))
    s1, s3 = root / "stage1", root / "stage3"
    common = ["--batch-size", "8", "--seq-len", "256", "--heldout-permille", "200", "--quiet"]
    common += ["--export-dtype", "float32"]
    assert main(["train", str(source_dir), "--sft", str(data), "--init-from", str(tiny_dir), "--out", str(s1),
                 "--steps", "2", "--eval-infill-cases", "4", *common]) == 0  # fmt: skip
    assert main(["train", "--sft", str(data), "--init-from", str(s1 / "model"), "--out", str(s3),
                 "--steps", "2", "--lr", "1e-2", *common]) == 0  # fmt: skip
    return s1, s3
