"""``diffu generate`` end to end: the acceptance command, the compilation cache, and clear errors."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from assistant.cli.main import main
from tests.model_copies import with_generation_config
from tests.reference import dream_torch
from tests.reference.parity import assert_step_matches

ACCEPTANCE = [
    "generate",
    "--raw",
    "--prompt",
    "def add(a, b):",
    "--max-new-tokens",
    "32",
    "--steps",
    "32",
    "--temperature",
    "0",
    "--json",
    "--history",
]


def diffu(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "assistant", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=300,
    )


def test_acceptance_command_prints_reference_history_and_second_run_compiles_nothing(tiny_dir, tmp_path):
    env = {"DIFFU_JAX_CACHE_DIR": str(tmp_path / "fresh-cache")}
    first = diffu(*ACCEPTANCE, "--model", str(tiny_dir), env=env)
    assert first.returncode == 0, first.stderr
    out = json.loads(first.stdout)
    assert set(out) == {"prompt_ids", "sequences", "text", "finish_reason", "stats", "history"}
    assert len(out["history"]) == 32 and all(len(h) == 1 for h in out["history"])
    prompt = out["prompt_ids"][0]
    assert out["sequences"][0][: len(prompt)] == prompt and len(out["sequences"][0]) == len(prompt) + 32
    assert out["history"][-1][0] == out["sequences"][0]
    assert out["stats"]["compiled_programs"] >= 1

    # The history follows the published sampler: each step, replayed by the reference from our previous
    # canvas, commits the same positions (up to ties) and tokens.
    ref_model = dream_torch.DreamReference.from_dir(tiny_dir)
    mask_id = json.loads((tiny_dir / "config.json").read_text())["mask_token_id"]
    prev, mask4, tok_idx = dream_torch.prepare(torch.tensor([prompt]), None, 32, mask_id)
    prev = prev.numpy()
    masks_left = []
    for i, canvas in enumerate(out["history"]):
        canvas = np.array(canvas)
        ref, conf, _ = dream_torch.step(
            ref_model, torch.tensor(prev), mask4, tok_idx, i, steps=32, mask_id=mask_id
        )
        assert_step_matches(prev, canvas, ref.numpy(), conf.numpy(), mask_id, f"step {i}")
        masks_left.append(int((canvas == mask_id).sum()))
        prev = canvas
    assert masks_left[0] == 32 and masks_left[1] == 31 and masks_left[-2] == 2 and masks_left[-1] == 0

    second = diffu(*ACCEPTANCE, "--model", str(tiny_dir), env=env)
    assert second.returncode == 0, second.stderr
    stats = json.loads(second.stdout)["stats"]
    assert stats["compiled_programs"] == 0 and stats["cache_hits"] >= 1
    assert "compiled 0 new program(s)" in second.stderr
    assert json.loads(second.stdout)["sequences"] == out["sequences"]


def test_batch_of_prompts_is_left_padded(tiny_dir, capsys):
    assert (
        main(
            [
                "generate",
                "--model",
                str(tiny_dir),
                "--raw",
                "--prompt",
                "import os",
                "--prompt",
                "def main():\n    x = 1",
                "--max-new-tokens",
                "8",
                "--json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    short, long_ = out["prompt_ids"]
    assert len(out["sequences"][0]) == len(out["sequences"][1]) == len(long_) + 8
    pad = json.loads((tiny_dir / "config.json").read_text())["pad_token_id"]
    assert out["sequences"][0][: len(long_) - len(short)] == [pad] * (len(long_) - len(short))
    assert len(out["text"]) == 2


def test_infill_fills_the_middle_only(tiny_dir, capsys):
    assert (
        main(
            [
                "generate",
                "--model",
                str(tiny_dir),
                "--prompt",
                "def f(x):\n    return ",
                "--suffix",
                "\n\nprint(f(2))\n",
                "--infill-tokens",
                "6",
                "--json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    seq = out["sequences"][0]
    prefix = out["prompt_ids"][0]
    assert seq[: len(prefix)] == prefix and len(seq) > len(prefix) + 6  # the suffix stays after the hole
    assert out["stats"]["new_tokens"] == 6


def test_live_view_prints_the_answer(tiny_dir, capsys, monkeypatch):
    monkeypatch.setenv("TTY_COMPATIBLE", "1")  # rich draws stderr as a terminal (frames, then erased)
    monkeypatch.setenv("TERM", "xterm-256color")
    assert main(["generate", "--model", str(tiny_dir), "--prompt", "hello", "--max-new-tokens", "8"]) == 0
    captured = capsys.readouterr()
    # The live frame is drawn on stderr; stdout holds the answer alone (what a pipe should get).
    assert "step 8/8" in captured.err and "step" not in captured.out
    assert "8 tokens in 8 steps" in captured.err
    # Not a terminal: no frame at all (tests/assistant/test_terminal_output.py reads a real terminal).
    monkeypatch.delenv("TTY_COMPATIBLE")
    assert main(["generate", "--model", str(tiny_dir), "--prompt", "hello", "--max-new-tokens", "8"]) == 0
    captured = capsys.readouterr()
    assert captured.err.startswith("8 tokens in 8 steps") and captured.err.count("\n") == 1


# -- errors: one clear line, exit code 2, no traceback ----------------------------------------------------


def broken_copy(tiny_dir: Path, tmp_path: Path, name: str) -> Path:
    dst = tmp_path / name
    shutil.copytree(tiny_dir, dst)
    return dst


def edit_index(model_dir: Path, fn) -> None:
    path = model_dir / "model.safetensors.index.json"
    index = json.loads(path.read_text())
    fn(index["weight_map"])
    path.write_text(json.dumps(index))


def rewrite_shard(model_dir: Path, fn) -> None:
    from safetensors.numpy import load_file, save_file

    shard = model_dir / "model-00001-of-00002.safetensors"
    tensors = load_file(str(shard))
    fn(tensors)
    save_file(tensors, str(shard))


def make_missing_file(d):
    (d / "model-00002-of-00002.safetensors").unlink()


def make_unknown_tensor(d):
    rewrite_shard(
        d, lambda t: t.__setitem__("model.layers.0.self_attn.extra.weight", np.zeros((2, 2), np.float32))
    )
    edit_index(
        d,
        lambda m: m.__setitem__("model.layers.0.self_attn.extra.weight", "model-00001-of-00002.safetensors"),
    )


def make_shape_mismatch(d):
    def shrink(t):
        name = next(n for n in t if n.endswith("q_proj.weight"))
        t[name] = t[name][:-1]
        shrink.name = name

    rewrite_shard(d, shrink)


def make_pickle_only(d):
    for f in list(d.glob("*.safetensors")) + [d / "model.safetensors.index.json"]:
        f.unlink()
    (d / "pytorch_model.bin").write_bytes(pickle.dumps({"x": 1}))


def make_bad_config(d):
    cfg = json.loads((d / "config.json").read_text())
    cfg["num_key_value_heads"] = "four"
    (d / "config.json").write_text(json.dumps(cfg))


def make_missing_config_key(d):
    cfg = json.loads((d / "config.json").read_text())
    del cfg["rope_theta"]
    (d / "config.json").write_text(json.dumps(cfg))


def make_huge_layer_count(d):
    cfg = json.loads((d / "config.json").read_text())
    cfg["num_hidden_layers"] = 1_000_000_000_000
    (d / "config.json").write_text(json.dumps(cfg))


def _write_raw_header(d, header: bytes) -> None:
    shard = d / "model-00001-of-00002.safetensors"
    shard.write_bytes(len(header).to_bytes(8, "little") + header)


def make_array_header(d):
    _write_raw_header(d, b"[1, 2, 3]")


def make_deep_header(d):
    _write_raw_header(d, b'{"a":' * 200_000 + b"1" + b"}" * 200_000)


def make_escaping_weight_map(d):
    edit_index(d, lambda m: m.__setitem__(next(iter(m)), "../outside.safetensors"))


def make_deep_config(d):
    (d / "config.json").write_text('{"a":' * 100_000 + "1" + "}" * 100_000)


def make_huge_added_token_id(d):
    added = json.loads((d / "added_tokens.json").read_text())
    added[next(iter(added))] = 10**13
    (d / "added_tokens.json").write_text(json.dumps(added))


def make_non_utf8_merges(d):
    (d / "merges.txt").write_bytes((d / "merges.txt").read_bytes() + b"\xff\xfe \x80\n")


def make_pickle_only_without_config(d):
    make_pickle_only(d)
    (d / "config.json").unlink()


@pytest.mark.parametrize(
    "breaker,expected",
    [
        (make_huge_layer_count, "num_hidden_layers: 1000000000000 is beyond any supported model"),
        (make_array_header, "model-00001-of-00002.safetensors: malformed safetensors header"),
        (make_deep_header, "model-00001-of-00002.safetensors: malformed safetensors header"),
        (make_escaping_weight_map, "'../outside.safetensors' is outside the model directory"),
        (make_pickle_only_without_config, "unpickling runs arbitrary code"),
        (make_missing_file, "model-00002-of-00002.safetensors"),
        (make_unknown_tensor, "model.layers.0.self_attn.extra.weight: unknown tensor"),
        (make_shape_mismatch, "q_proj.weight: shape"),
        (make_pickle_only, "unpickling runs arbitrary code"),
        (make_bad_config, "num_key_value_heads: must be an integer"),
        (make_missing_config_key, "rope_theta: missing"),
        (make_deep_config, "config.json is nested too deep to be a model config"),
        (make_huge_added_token_id, "added_tokens.json: '<|endoftext|>': a token id must be an integer"),
        (make_non_utf8_merges, "merges.txt: not UTF-8 text (invalid start byte at byte"),
    ],
)
def test_broken_checkpoints_give_one_clear_error(tiny_dir, tmp_path, capsys, breaker, expected):
    d = broken_copy(tiny_dir, tmp_path, breaker.__name__)
    breaker(d)
    code = main(["generate", "--model", str(d), "--raw", "--prompt", "x", "--max-new-tokens", "4"])
    err = capsys.readouterr().err
    assert code == 2
    assert expected in err and err.startswith("diffu: error: ")
    assert "Traceback" not in err


def test_duplicate_tensor_is_named(tiny_dir, tmp_path, capsys):
    d = broken_copy(tiny_dir, tmp_path, "dup")
    from safetensors.numpy import load_file, save_file

    second = d / "model-00002-of-00002.safetensors"
    tensors = load_file(str(second))
    tensors["model.embed_tokens.weight"] = load_file(str(d / "model-00001-of-00002.safetensors"))[
        "model.embed_tokens.weight"
    ]
    save_file(tensors, str(second))
    assert main(["generate", "--model", str(d), "--raw", "--prompt", "x", "--max-new-tokens", "4"]) == 2
    assert "model.embed_tokens.weight: appears twice" in capsys.readouterr().err


def test_prompt_longer_than_context_is_refused(tiny_dir, capsys):
    code = main(
        ["generate", "--model", str(tiny_dir), "--raw", "--prompt", "word " * 3000, "--max-new-tokens", "4"]
    )
    err = capsys.readouterr().err
    assert code == 2 and "more than the context of" in err


def test_bad_sampling_flag_names_it(tiny_dir, capsys):
    assert main(["generate", "--model", str(tiny_dir), "--prompt", "x", "--steps", "0"]) == 2
    assert "--steps: must be >= 1" in capsys.readouterr().err


def test_missing_directory_and_offline_hub_id(capsys, tmp_path):
    assert main(["generate", "--model", str(tmp_path / "nope"), "--prompt", "x"]) == 2
    assert "does not exist" in capsys.readouterr().err
    offline = diffu(
        "generate",
        "--model",
        "apple/DiffuCoder-7B-Instruct",
        "--prompt",
        "x",
        env={"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")},
    )
    assert offline.returncode == 2
    assert "apple/DiffuCoder-7B-Instruct" in offline.stderr and "--model DIR" in offline.stderr
    assert "Traceback" not in offline.stderr


def test_loading_never_executes_model_directory_code(runtime, code_marker):
    # The tiny checkpoint ships configuration_dream.py etc. that write this marker when imported.
    assert not code_marker.exists()


def test_a_model_that_recommends_the_fast_decoder_gets_it_unless_one_is_named(tiny_dir, tmp_path, capsys):
    model = with_generation_config(tiny_dir, tmp_path / "model", eos_token_id=0, diffu_decoder="fast")
    run = ["generate", "--model", str(model), "--raw", "--prompt", "import os", "--max-new-tokens", "8"]
    assert main([*run, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["stats"]["decoder"] == "fast"
    assert main([*run, "--json", "--decoder", "reference"]) == 0
    stats = json.loads(capsys.readouterr().out)["stats"]
    assert stats["decoder"] == "reference" and stats["steps"] == 8
    # Published checkpoints have no such key: the reference decoder stays their default.
    assert main(["generate", "--model", str(tiny_dir), "--raw", "--prompt", "x", "--max-new-tokens", "4",
                 "--json"]) == 0  # fmt: skip
    assert json.loads(capsys.readouterr().out)["stats"]["decoder"] == "reference"


def test_without_flags_generate_takes_the_models_own_settings(tiny_dir, tmp_path, capsys):
    # As the bundled model's generation_config.json sets the chat's: canvas, steps, decoder and blocks.
    keys = {"max_new_tokens": 12, "steps": 12, "diffu_decoder": "fast", "block_length": 4}
    model = with_generation_config(tiny_dir, tmp_path / "model", eos_token_id=0, **keys)
    assert main(["generate", "--local", "--model", str(model), "--raw", "--prompt", "x", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)["stats"]
    assert (stats["new_tokens"], stats["decoder"]) == (12, "fast")  # not the built-in 128, reference


def test_a_bad_recommended_decoder_is_named(tiny_dir, tmp_path, capsys):
    model = with_generation_config(tiny_dir, tmp_path / "model", eos_token_id=0, diffu_decoder="turbo")
    assert main(["generate", "--model", str(model), "--raw", "--prompt", "x", "--max-new-tokens", "4"]) == 2
    err = capsys.readouterr().err
    assert "generation_config.json: diffu_decoder must be one of reference, fast, sliding, got 'turbo'" in err


def test_the_recommended_editor_context_is_checked(tiny_dir, tmp_path):
    from model_runtime import generation_config
    from model_runtime.errors import ModelError

    assert generation_config.editor_context(tiny_dir) is None
    good = with_generation_config(tiny_dir, tmp_path / "good", diffu_editor_context=512)
    assert generation_config.editor_context(good) == 512
    for i, bad in enumerate((8, "512", 512.0, True)):
        model = with_generation_config(tiny_dir, tmp_path / f"bad{i}", diffu_editor_context=bad)
        with pytest.raises(ModelError, match="diffu_editor_context must be an integer >= 16"):
            generation_config.editor_context(model)


def test_a_one_line_answer_gets_the_models_one_line_decoder_unless_one_is_named(tiny_dir, tmp_path, capsys):
    one_line = {"decoder": "sliding", "window": 16}
    model = with_generation_config(tiny_dir, tmp_path / "model", eos_token_id=0, diffu_one_line=one_line)
    run = ["generate", "--model", str(model), "--raw", "--prompt", "import os", "--max-new-tokens", "8",
           "--json"]  # fmt: skip
    assert main([*run, "--max-lines", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["stats"]["decoder"] == "sliding"
    assert main(run) == 0  # not one line: the model's default decoder
    assert json.loads(capsys.readouterr().out)["stats"]["decoder"] == "reference"
    assert main([*run, "--max-lines", "1", "--decoder", "fast"]) == 0
    assert json.loads(capsys.readouterr().out)["stats"]["decoder"] == "fast"
    odd = {"decoder": "sliding", "window": 3}
    bad = with_generation_config(tiny_dir, tmp_path / "bad", diffu_one_line=odd)
    assert main(["generate", "--model", str(bad), "--raw", "--prompt", "x", "--max-new-tokens", "4"]) == 2
    assert "generation_config.json: diffu_one_line: window: must be one of 2, 4, 8" in capsys.readouterr().err


def test_fast_decoder_history_and_live_view_count_every_forward(tiny_dir, capsys, monkeypatch):
    run = ["generate", "--model", str(tiny_dir), "--raw", "--prompt", "def f():", "--max-new-tokens", "32",
           "--decoder", "fast", "--block-length", "16"]  # fmt: skip
    assert main([*run, "--json", "--history"]) == 0
    out = json.loads(capsys.readouterr().out)
    # One history entry per step, a step being one forward: as many as the stats count.
    steps = out["stats"]["steps"]
    assert len(out["history"]) == steps > 2
    mask = json.loads((tiny_dir / "config.json").read_text())["mask_token_id"]
    masks = [canvas[0].count(mask) for canvas in out["history"]]
    assert masks == sorted(masks, reverse=True) and any(16 < m < 32 for m in masks)  # inside block 1
    # The live view (stderr, drawn as on a terminal) labels the same forwards, block by block, and the
    # summary agrees.
    monkeypatch.setenv("TTY_COMPATIBLE", "1")
    monkeypatch.setenv("TERM", "xterm-256color")
    assert main(run) == 0
    err = capsys.readouterr().err
    assert f"step {steps} · block " in err and f"in {steps} steps" in err


def test_a_models_chat_defaults_are_read_checked_and_reported_by_the_daemon(micro_dir, tmp_path):
    import httpx

    import model_runtime
    from model_runtime.errors import ModelError
    from model_runtime.generation_config import chat_defaults
    from tests.assistant.helpers import start_daemon

    keys = {"temperature": 0.1, "max_new_tokens": 48, "steps": 24, "alg": "maskgit_plus", "eps": 0.01}
    keys["retry_block"] = 64  # the chat's second decode of code that does not parse
    model = with_generation_config(micro_dir, tmp_path / "model", eos_token_id=0, **keys)
    # Only the chat's knobs; eps is a sampler detail no chat setting exposes.
    expected = {"temperature": 0.1, "max_new_tokens": 48, "steps": 24, "alg": "maskgit_plus"}
    expected["retry_block"] = 64
    assert chat_defaults(model) == expected
    assert model_runtime.load(model, length_buckets=(64,), batch_buckets=(1,)).info.chat_defaults == expected
    assert chat_defaults(micro_dir) == {}  # published checkpoints: no chat defaults
    bad = with_generation_config(micro_dir, tmp_path / "bad", top_p=1.5)
    with pytest.raises(ModelError, match=r"generation_config.json: top_p: must be in \(0, 1\]"):
        chat_defaults(bad)
    bad = with_generation_config(micro_dir, tmp_path / "bad-retry", retry_block=100)
    with pytest.raises(ModelError, match="retry_block must be 0 .never. or one of 1, 2, 4"):
        chat_defaults(bad)
    # Reported as soon as the weights are loaded: no warm-up needed (nor waited for).
    daemon = start_daemon(tmp_path / "daemon", str(model), "--no-warmup", wait=False)
    daemon.wait_ready(warm=False)
    try:
        status = httpx.get(f"{daemon.url}/v1/diffu/status", headers=daemon.headers, timeout=60).json()
    finally:
        daemon.stop()
    assert status["chat_defaults"] == expected
