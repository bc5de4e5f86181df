"""``diffu train --sft``: rows laid out as DiffuCoder-Instruct answers, the prompt never noised, the loss on
the response only, exact resume, bad data lines, and a tiny instruction-tuning run through the CLI."""

from __future__ import annotations

import json
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from assistant.cli.main import main
from model_runtime.config import DreamConfig
from model_runtime.tokenizer import chat_prompt
from model_runtime.train import sft_data
from model_runtime.train.objective import add_noise, response_loss, sft_noise, sft_objective

SEQ = 128
NAMES = ("total", "largest", "first", "count", "mean", "last", "double", "square", "join", "flip")


def _conversation(i: int) -> dict:
    name = NAMES[i % len(NAMES)]
    user = f"Write `{name}_{i}(xs)`: {name} of a list plus {i}."
    answer = f"```python\ndef {name}_{i}(xs):\n    return {name}(xs) + {i}\n```"
    return {"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]}


@pytest.fixture(scope="module")
def sft_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("sft") / "data.jsonl"
    path.write_text("".join(json.dumps(_conversation(i)) + "\n" for i in range(64)), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def tok(runtime):
    return runtime.tokenizer  # the tiny checkpoint's, with its config's special ids


# -- rows -------------------------------------------------------------------------------------------------


def test_a_row_is_the_chat_prompt_then_the_answer_its_end_of_turn_and_padding(tok):
    messages = _conversation(3)["messages"]
    ids, n_prompt = sft_data.encode_conversation(tok, messages, SEQ)
    assert len(ids) == SEQ
    # The prompt is what a chat request sends at inference, byte for byte.
    assert tok.decode(ids[:n_prompt]) == chat_prompt(messages[:1])
    assert ids[:n_prompt] == tok.encode_chat(messages[:1])
    answer = tok.encode_text(messages[1]["content"])
    end = n_prompt + len(answer)
    assert ids[n_prompt:end] == answer and ids[end] == tok.im_end_id
    assert set(ids[end + 1 :]) == {tok.dlm_pad_id} and end + 1 < SEQ


def test_a_conversation_with_earlier_turns_learns_only_its_last_answer(tok):
    """Topic changes (issue #45): the earlier requests and their answers are prompt, never noised."""
    earlier, last = _conversation(1)["messages"], _conversation(2)["messages"]
    messages = earlier + last
    ids, n_prompt = sft_data.encode_conversation(tok, messages, 4 * SEQ)  # two turns: a longer row
    assert ids[:n_prompt] == tok.encode_chat(messages[:-1])
    assert tok.decode(ids[:n_prompt]) == chat_prompt(messages[:-1])  # both turns, the first answer closed
    answer = tok.encode_text(last[1]["content"])
    assert ids[n_prompt : n_prompt + len(answer)] == answer and ids[n_prompt + len(answer)] == tok.im_end_id


def test_batches_are_a_pure_function_of_seed_and_step_and_cover_every_row_each_epoch(sft_file, tok):
    rows = sft_data.build_rows(sft_file, tok, SEQ, sft_data.SFTOptions(heldout_permille=0))[0]["train"]
    n = len(rows)
    assert n == 64
    again = rows.batch(0, 3, 8)
    assert all(np.array_equal(again[k], v) for k, v in rows.batch(0, 3, 8).items())
    # Eight steps of eight rows are one epoch: each row exactly once, in a seeded order.
    seen = np.concatenate([rows.batch(0, s, 8)["tokens"] for s in range(n // 8)])
    assert sorted(map(bytes, seen.astype(np.uint16))) == sorted(map(bytes, rows.tokens.astype(np.uint16)))
    assert not np.array_equal(rows.batch(0, 0, 8)["tokens"], rows.batch(1, 0, 8)["tokens"])


# -- the objective ----------------------------------------------------------------------------------------


def _sft_trainer(run_dir: Path, rows, tiny_dir, *, steps=8, batch=4, on_step=None, objective=None):
    import model_runtime
    from model_runtime.train.loop import LoopOptions, TrainConfig, Trainer

    base = model_runtime.load(tiny_dir, dtype="float32")  # a fresh copy: the trainer donates its params
    cfg = TrainConfig(steps=steps, batch_size=batch, seq_len=SEQ, warmup_steps=2, learning_rate=3e-3)
    opts = LoopOptions(checkpoint_every=2, log_every=1, show_progress=False, on_step=on_step)
    objective = objective or sft_objective(base.config.mask_token_id, cfg.eps)
    return Trainer(
        run_dir,
        base.config,
        cfg,
        rows,
        graphdef=base.graphdef,
        params=base.state,
        options=opts,
        objective=objective,
    )


def test_training_batches_never_mask_the_prompt_and_noise_all_of_the_response(
    sft_file, tok, tiny_dir, tmp_path
):
    """What the model sees in real training steps (a spy around the model inside the jitted step)."""
    rows = sft_data.build_rows(sft_file, tok, SEQ, sft_data.SFTOptions(heldout_permille=0))[0]["train"]
    seen: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []

    def spy(model, batch, key):
        inner = sft_objective(tok.mask_id)

        def watched(x):
            jax.debug.callback(lambda *a: seen.append(tuple(np.asarray(v) for v in a)), x, batch["tokens"],
                               batch["prompt_len"])  # fmt: skip
            return model(x)

        return inner(watched, batch, key)

    t = _sft_trainer(tmp_path, rows, tiny_dir, steps=12, batch=8, objective=spy)
    t.run()
    t.close()
    assert len(seen) == 12
    masked_response = np.zeros(SEQ, np.int64)
    for noisy, tokens, plen in seen:
        prompt = np.arange(SEQ)[None, :] < plen[:, None]
        assert np.array_equal(noisy[prompt], tokens[prompt])  # the prompt is never masked
        masked = noisy == tok.mask_id
        assert not (masked & prompt).any()
        masked_response += masked.sum(axis=0)
    # Over twelve steps every response column is masked somewhere: answer, end of turn and padding alike.
    assert masked_response[int(max(p.max() for _, _, p in seen)) :].min() > 0


def test_the_loss_scores_response_tokens_only_with_dreams_shift():
    v = 8
    tokens = jnp.array([[3, 1, 4, 1, 5, 2]])
    batch = {"tokens": tokens, "prompt_len": jnp.array([3])}
    noised, response = sft_noise(batch, jax.random.PRNGKey(0), mask_id=7, eps=0.999)  # t ~ 1: all of it
    assert np.asarray(noised.masked).tolist() == [[False, False, False, True, True, True]]
    # Output i predicts token i + 1 (Dream's shift): sure and right on the response, sure and wrong on the
    # prompt. The loss sees only the response, so it is ~0.
    right = jax.nn.one_hot(jnp.concatenate([tokens[:, 1:], tokens[:, -1:]], axis=1), v) * 50.0
    wrong_prompt = right.at[:, :2].set(jax.nn.one_hot(jnp.array([[0, 0]]), v) * 50.0)
    loss, aux = response_loss(wrong_prompt, tokens, noised, response)
    assert float(loss) < 1e-3 and float(aux["masked_acc"]) == 1.0
    # The same mistake on a response position costs ~50 nats, divided by t and by the 3 masked tokens.
    wrong_answer = right.at[:, 3].set(jax.nn.one_hot(jnp.array([0]), v) * 50.0)
    loss, _ = response_loss(wrong_answer, tokens, noised, response)
    assert float(loss) == pytest.approx(50.0 / float(noised.t[0]) / 3, rel=1e-3)


def test_the_loss_is_diffucoders_one_over_t_sum_over_the_masked_count():
    b, n, v = 4, 24, 11
    tokens = jax.random.randint(jax.random.PRNGKey(1), (b, n), 0, v - 1)
    response = jnp.arange(n)[None, :] >= jnp.array([[5], [9], [2], [12]])
    noised = add_noise(jax.random.PRNGKey(2), tokens, v - 1, maskable=response)
    logits = jax.random.normal(jax.random.PRNGKey(3), (b, n, v))
    loss, _ = response_loss(logits, tokens, noised, response)
    shifted = np.concatenate([np.asarray(logits)[:, :1], np.asarray(logits)[:, :-1]], axis=1)
    logp = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    ce = -np.take_along_axis(logp, np.asarray(tokens)[..., None], -1)[..., 0]
    m = np.asarray(noised.masked)
    expected = np.sum(ce * m / np.asarray(noised.t)[:, None]) / m.sum()
    assert float(loss) == pytest.approx(expected, rel=1e-5)


# -- exact resume -----------------------------------------------------------------------------------------


def test_an_interrupted_sft_run_resumes_with_the_same_losses(sft_file, tok, tiny_dir, tmp_path):
    rows = sft_data.build_rows(sft_file, tok, SEQ, sft_data.SFTOptions(heldout_permille=0))[0]["train"]

    def recording(record: dict, stop_at: int | None = None):
        def on_step(step: int, metrics: dict) -> None:
            record[step] = metrics["loss"]
            if step == stop_at:
                raise KeyboardInterrupt

        return on_step

    ref: dict[int, float] = {}
    t = _sft_trainer(tmp_path / "ref", rows, tiny_dir, on_step=recording(ref))
    t.run()
    t.close()
    got: dict[int, float] = {}
    t = _sft_trainer(tmp_path / "cut", rows, tiny_dir, on_step=recording(got, stop_at=5))
    with pytest.raises(KeyboardInterrupt):
        t.run()
    t.close()
    t = _sft_trainer(tmp_path / "cut", rows, tiny_dir, on_step=recording(got))
    assert t.restore_latest() and t.step == 5
    t.run()
    t.close()
    assert got == ref and sorted(ref) == list(range(1, 9))


# -- through the CLI --------------------------------------------------------------------------------------

FLAGS = ["--steps", "30", "--batch-size", "8", "--seq-len", str(SEQ), "--lr", "3e-3", "--log-every", "1"]
FLAGS += ["--heldout-permille", "100", "--quiet"]


def _losses(run_dir: Path) -> dict[int, float]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r["loss"] for r in map(json.loads, lines) if "loss" in r}


def test_sft_through_the_cli_learns_the_answers_and_exports_a_chat_model(
    sft_file, tiny_dir, tmp_path, capsys
):
    import model_runtime

    out = tmp_path / "run"
    assert (
        main(["train", "--sft", str(sft_file), "--init-from", str(tiny_dir), "--out", str(out), *FLAGS]) == 0
    )
    printed = json.loads(capsys.readouterr().out)
    losses = _losses(out)
    assert sorted(losses) == list(range(1, 31))
    assert np.mean([losses[s] for s in range(26, 31)]) < np.mean([losses[s] for s in range(1, 6)]) - 1.0
    # No --warmup: 10% of the 30 steps (a short run no longer needs the flag).
    assert json.loads((out / "run.json").read_text())["train"]["warmup_steps"] == 3
    facts = json.loads((out / "model" / "metrics.json").read_text())
    held = facts["sft_heldout"]
    assert printed["sft_heldout"]["acc@0.5"] == held["acc@0.5"] and held["heldout_windows"] >= 3
    vocab = DreamConfig.from_dict(json.loads((tiny_dir / "config.json").read_text())).vocab_size
    assert held["ce@0.5"] < math.log(vocab) - 1.0  # far better than uniform on unseen conversations
    assert (
        facts["train"]["objective"] == "sft"
        and facts["sft_data"]["conversations"] + held["heldout_windows"] == 64
    )
    for name in ("vocab.json", "merges.txt", "added_tokens.json"):
        assert (out / "model" / name).read_bytes() == (tiny_dir / name).read_bytes()
    rt = model_runtime.load(out / "model", length_buckets=(128,), batch_buckets=(1,))
    assert rt.config.vocab_size == vocab


def test_bad_lines_stop_the_run_naming_the_line_or_are_skipped_and_named(tiny_dir, tmp_path, capsys):
    lines = [json.dumps(_conversation(i)) for i in range(12)]
    lines[2] = json.dumps({"text": "no messages here"})
    lines[5] = json.dumps({"messages": [{"role": "user", "content": "and no answer"}]})
    lines[7] = json.dumps(
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x " * 400}]}
    )
    lines[9] = "{not json"
    data = tmp_path / "bad.jsonl"
    data.write_text("\n".join(lines) + "\n", encoding="utf-8")
    args = ["train", "--sft", str(data), "--init-from", str(tiny_dir), "--steps", "2", "--batch-size", "4"]
    args += ["--seq-len", str(SEQ), "--quiet"]

    assert main([*args, "--out", str(tmp_path / "stop")]) == 2
    err = capsys.readouterr().err
    assert f'{data}: line 3: no "messages" list' in err and "--on-bad-line skip" in err
    assert "Traceback" not in err and not (tmp_path / "stop" / "sft" / "meta.json").exists()

    assert main([*args, "--out", str(tmp_path / "skip"), "--on-bad-line", "skip"]) == 0
    err = capsys.readouterr().err
    assert f'{data}: line 3: no "messages" list' in err
    assert f"{data}: line 6: no assistant turn" in err
    assert f"{data}: line 8: prompt and answer are" in err and f"more than --seq-len {SEQ}" in err
    assert f"{data}: line 10: not JSON" in err
    facts = json.loads((tmp_path / "skip" / "model" / "metrics.json").read_text())["sft_data"]
    assert facts["skipped_lines"] == 4 and facts["conversations"] + facts["heldout_conversations"] == 8


@pytest.mark.parametrize(
    "messages, reason",
    [
        (
            [{"role": "assistant", "content": "hi"}, {"role": "user", "content": "?"}],
            "must be the assistant's",
        ),
        ([{"role": "user", "content": 3}, {"role": "assistant", "content": "x"}], "messages[0].content"),
        ([{"role": "tool", "content": "x"}, {"role": "assistant", "content": "x"}], "messages[0].role"),
    ],
)
def test_a_conversation_must_end_with_a_well_formed_assistant_answer(messages, reason):
    with pytest.raises(sft_data.BadLine, match=reason.replace("[", r"\[").replace("]", r"\]")):
        sft_data.parse_line(json.dumps({"messages": messages}))


def test_sft_flags_are_checked_before_anything_loads(tmp_path, capsys):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps(_conversation(1)) + "\n")
    assert main(["train", "--sft", str(data), "--out", str(tmp_path / "o")]) == 2
    assert "--sft needs --init-from MODEL" in capsys.readouterr().err
    assert (
        main(["train", "--sft", str(tmp_path / "missing.jsonl"), "--init-from", "x", "--out", str(tmp_path)])
        == 2
    )
    assert "no such file" in capsys.readouterr().err
    assert main(["train", "--out", str(tmp_path / "o")]) == 2
    assert "SOURCE is required" in capsys.readouterr().err
    warm = ["--steps", "30", "--warmup", "50"]
    assert main(["train", "--sft", str(data), "--init-from", "x", "--out", str(tmp_path / "o"), *warm]) == 2
    assert "warmup_steps: must be in [0, steps=30], got 50" in capsys.readouterr().err


def test_stop_at_ends_a_time_boxed_run_with_an_export_and_the_same_command_continues(
    sft_file, tiny_dir, tmp_path, capsys
):
    out = tmp_path / "run"
    args = ["train", "--sft", str(sft_file), "--init-from", str(tiny_dir), "--out", str(out), "--steps", "8"]
    args += [
        "--batch-size",
        "4",
        "--seq-len",
        str(SEQ),
        "--log-every",
        "1",
        "--checkpoint-every",
        "3",
        "--quiet",
    ]
    assert main([*args, "--stop-at", "4"]) == 0
    assert "stopping after step 4" in capsys.readouterr().err
    facts = json.loads((out / "model" / "metrics.json").read_text())["train"]
    assert (facts["steps"], facts["steps_done"], facts["tokens_seen"]) == (8, 4, 4 * 4 * SEQ)
    assert sorted(_losses(out)) == [1, 2, 3, 4]
    assert main(args) == 0
    assert "resumed from the checkpoint at step 4" in capsys.readouterr().err
    assert sorted(_losses(out)) == list(range(1, 9))
    assert json.loads((out / "model" / "metrics.json").read_text())["train"]["steps_done"] == 8


def test_mix_code_puts_pretraining_windows_with_no_prompt_in_every_batch(
    sft_file, tok, source_dir, tiny_dir, tmp_path, capsys
):
    from model_runtime.train import corpus as corpus_lib

    out = tmp_path / "mixed"
    args = ["train", str(source_dir), "--sft", str(sft_file), "--init-from", str(tiny_dir), "--out", str(out)]
    args += ["--mix-code", "0.25", "--steps", "3", "--batch-size", "8", "--seq-len", str(SEQ), "--quiet"]
    args += ["--heldout-permille", "200", "--eval-infill-cases", "4"]
    assert main(args) == 0
    assert "each batch: 6 conversations and 2 code windows" in capsys.readouterr().err
    facts = json.loads((out / "model" / "metrics.json").read_text())
    assert facts["sft_data"]["mix_code"] == 0.25 and "heldout" in facts and "sft_heldout" in facts
    assert json.loads((out / "run.json").read_text())["sft"]["mix_code"] == 0.25
    # The batch of a step: the conversations of a plain batch of 6, then 2 windows of the code corpus
    # whose prompt length is 0 (every position but the first may be noised, as in pre-training).
    rows = sft_data.build_rows(sft_file, tok, SEQ, sft_data.SFTOptions(heldout_permille=0))[0]["train"]
    shards = corpus_lib.open_shards(out / "corpus", SEQ)
    batch = sft_data.MixedRows(rows, shards, 0.25).batch(0, 1, 8)
    plain = rows.batch(0, 1, 6)
    assert np.array_equal(batch["tokens"][:6], plain["tokens"]) and np.array_equal(
        batch["prompt_len"][:6], plain["prompt_len"]
    )
    assert np.array_equal(batch["tokens"][6:], shards.batch(1, 1, 2)) and not batch["prompt_len"][6:].any()
    assert main(["train", "--sft", str(sft_file), "--init-from", str(tiny_dir), "--out", str(tmp_path / "x"),
                 "--mix-code", "0.25"]) == 2  # fmt: skip
    assert "--mix-code needs SOURCE" in capsys.readouterr().err


def test_the_bundled_models_metrics_hold_both_stages_and_stage_ones_code_evaluation_of_the_final_weights(
    sft_file, source_dir, tiny_dir, tmp_path, capsys
):
    """scripts/bundled_metrics.py, the last step of scripts/train_bundled_sft.sh before it installs."""
    import subprocess
    import sys

    from tests.assistant.helpers import REPO

    s1, s2 = tmp_path / "stage1", tmp_path / "stage2"
    common = ["--batch-size", "8", "--seq-len", str(SEQ), "--heldout-permille", "200", "--quiet"]
    common += ["--export-dtype", "float32"]  # the weights diffu train evaluated, bit for bit
    assert main(["train", str(source_dir), "--sft", str(sft_file), "--init-from", str(tiny_dir), "--out",
                 str(s1), "--steps", "3", "--eval-infill-cases", "4", *common]) == 0  # fmt: skip
    assert main(["train", "--sft", str(sft_file), "--init-from", str(s1 / "model"), "--out", str(s2),
                 "--steps", "2", "--lr", "1e-2", *common]) == 0  # fmt: skip
    capsys.readouterr()
    base, before = tmp_path / "base", tmp_path / "before"
    base.mkdir(), before.mkdir()
    (base / "metrics.json").write_text(json.dumps({"heldout": {"acc@0.5": 0.25}}))
    (before / "metrics.json").write_text(json.dumps({"heldout_requests": {"good_block": 0.3}}))
    grid = [
        {"good_block": 0.7, "repeats_line": 0.3, "settings": {"block_length": 32}, "samples": [{}]},
        {"good_block": 0.6, "repeats_line": 0.0, "settings": {"block_length": 64}, "samples": [{}]},
    ]
    record = tmp_path / "record.json"
    record.write_text(json.dumps({"model": "m", "results": grid}))

    def merged(stage2: Path, out: Path) -> dict:
        cmd = [sys.executable, "scripts/bundled_metrics.py", str(stage2), "--stage1", str(s1),
               "--pretraining", str(base), "--corpus", str(s1 / "corpus"), "--record", str(record),
               "--before", str(before), "--out", str(out / "metrics.json")]  # fmt: skip
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        return json.loads((out / "metrics.json").read_text())

    stage1 = json.loads((s1 / "model" / "metrics.json").read_text())
    stage2_own = json.loads((s2 / "model" / "metrics.json").read_text())
    facts = merged(s2, tmp_path / "merged")
    assert json.loads((s2 / "model" / "metrics.json").read_text()) == stage2_own  # inputs left alone
    assert facts["sft"]["stage1"]["steps_done"] == 3 and facts["sft"]["stage2"]["steps_done"] == 2
    assert facts["sft"]["stage2"]["sft_heldout"] == stage2_own["sft_heldout"]
    assert "-step anneal" in facts["model"] and facts["pretraining"] == {"heldout": {"acc@0.5": 0.25}}
    # The chat defaults --record chose (highest good_block - repeats_line), the grid without its answers,
    # and the figures of the model being replaced.
    assert facts["heldout_requests"]["settings"] == {"block_length": 64}
    assert len(facts["heldout_requests_grid"]) == 2 and "samples" not in facts["heldout_requests_grid"][0]
    assert facts["heldout_requests_before"]["good_block"] == 0.3
    # The final weights get stage 1's code evaluation: the same windows and cases, and the same numbers
    # as diffu train's own when the weights are stage 1's.
    held = facts["heldout"]
    assert (held["heldout_windows"], held["infill_cases"]) == (stage1["heldout"]["heldout_windows"], 4)
    assert held["loss"] != pytest.approx(stage1["heldout"]["loss"], rel=1e-3)  # stage 2 moved the weights
    again = merged(s1, tmp_path / "same")["heldout"]
    for key in ("loss", "acc@0.15", "acc@0.5", "acc@0.9", "infill_exact_match"):
        assert again[key] == pytest.approx(stage1["heldout"][key], rel=1e-5, abs=1e-6), key


def test_sft_heldout_with_held_out_of_sends_only_the_lines_training_kept_out(sft_file, tiny_dir, tmp_path):
    """scripts/sft_heldout.py --held-out-of: validation requests from a training file, for choosing runs."""
    import subprocess
    import sys

    from tests.assistant.helpers import REPO

    lines = [line for line in sft_file.read_text(encoding="utf-8").splitlines() if line.strip()]
    kept_out = [
        json.loads(line)["messages"][0]["content"] for line in lines if sft_data.is_heldout_line(line, 200)
    ]
    assert 0 < len(kept_out) < len(lines)
    out = tmp_path / "val.json"
    cmd = [sys.executable, "scripts/sft_heldout.py", str(tiny_dir), str(sft_file), "--held-out-of", "200",
           "--json", str(out), "--decoder", "fast", "--max-new-tokens", "16", "--steps", "16",
           "--block-length", "16", "--batch", "4"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    (result,) = json.loads(out.read_text())["results"]
    assert [s["request"] for s in result["samples"]] == kept_out
    assert result["requests"] == len(kept_out) and f"({len(kept_out)} requests" in proc.stdout
