"""Request to job, without HTTP or an event loop: the fake runtime and a parsed request are all it takes."""

from __future__ import annotations

import dataclasses

import pytest

from assistant.config import Config
from assistant.server import protocol
from assistant.server.fake_runtime import FakeRuntime
from assistant.server.job_builder import build_job
from assistant.server.request_fields import RequestError
from model_runtime.rows import CanvasBuilder


def spec_of(body: dict, *, default_tokens: int = 16) -> protocol.GenSpec:
    return protocol.parse_native_generate(body, default_tokens=default_tokens)


def test_a_prompt_beyond_the_context_is_refused_with_its_numbers_as_fields() -> None:
    rt = FakeRuntime(max_context=64)
    with pytest.raises(RequestError) as info:
        build_job(rt, spec_of({"prompt": "x" * 60, "max_new_tokens": 10}), Config())
    err = info.value.to_dict()["error"]
    assert err["code"] == "context_length_exceeded" and err["param"] == "prompt"
    assert err["details"] == {"prompt_tokens": 60, "max_new_tokens": 10, "context_length": 64}
    assert "the prompt (60 tokens)" in err["message"]  # the same facts, for people
    with pytest.raises(RequestError) as info:
        build_job(rt, spec_of({"prompt": "x", "max_new_tokens": 64}), Config())
    assert info.value.details == {"max_new_tokens": 64, "context_length": 64}


def test_defaults_and_limits_are_applied_to_the_sampling_parameters() -> None:
    rt = FakeRuntime()
    job, truncated = build_job(rt, spec_of({"prompt": "def f(", "top_k": rt.info.vocab_size + 5}), Config())
    assert not truncated and job.id and job.loop is None  # the HTTP layer attaches its loop
    assert job.params.top_k == 0  # every token kept: no filtering (and lax.top_k needs k <= vocab)
    assert job.params.steps == 16 and job.params.decoder == rt.info.default_decoder
    assert job.row.ids[-16:] == (rt.tokenizer.mask_id,) * 16 and job.prompt_tokens == len("def f(")
    with pytest.raises(RequestError, match=r"steps: must be <= 8 \(the daemon's max_steps\), got 16") as info:
        build_job(rt, spec_of({"prompt": "x"}), Config(max_steps=8))
    assert info.value.param == "steps"


def test_a_one_line_request_that_names_no_decoder_gets_the_models_one_line_knobs() -> None:
    rt = FakeRuntime()
    rt.info = dataclasses.replace(rt.info, one_line_defaults={"decoder": "sliding", "window": 16})

    def params(**body: object):
        return build_job(rt, spec_of({"prompt": "def f(", **body}), Config())[0].params

    p = params(max_lines=1)
    assert (p.decoder, p.window, p.max_lines) == ("sliding", 16, 1)
    assert params(max_lines=1, window=4).window == 4  # the request's own knobs win
    assert params(max_lines=1, decoder="fast").decoder == "fast"
    assert params(max_lines=2).decoder == params().decoder == rt.info.default_decoder


def test_infill_with_other_files_keeps_the_newest_that_fit() -> None:
    rt = FakeRuntime(max_context=128)
    data = {
        "input_prefix": "def f(",
        "input_suffix": "):\n",
        "n_predict": 8,
        "input_extra": [{"filename": f"f{i}.py", "text": "y" * 30} for i in range(5)],
    }
    spec = protocol.parse_llama_infill(data, default_tokens=8)
    job, truncated = build_job(rt, spec, Config())
    text = rt.tokenizer.decode(job.row.ids)
    assert truncated and len(job.row.ids) <= 128
    assert "f4.py" in text and "f0.py" not in text  # llama.vim appends: the last chunk is the latest
    assert job.kind == "infill" and job.row.canvas_tokens == 8


CONTROLS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>", "<|file_sep|>", "<|fim_prefix|>")


@pytest.fixture(scope="module")
def real_tokens(tiny_dir) -> FakeRuntime:
    """The daemon's row building (the runtimes share it) with a real tokenizer: the tiny checkpoint's,
    which has DiffuCoder's control tokens. No model is loaded."""
    import json

    from model_runtime.tokenizer import load_tokenizer

    cfg = json.loads((tiny_dir / "config.json").read_text())
    rt = FakeRuntime(max_context=512)
    rt.tokenizer = load_tokenizer(  # type: ignore[assignment]
        tiny_dir, mask_id=cfg["mask_token_id"], pad_id=cfg["pad_token_id"], eos_id=cfg["eos_token_id"]
    )
    rt.rows = CanvasBuilder(rt.tokenizer, rt.info.max_context)
    rt.info = dataclasses.replace(rt.info, supports_holes=True)
    return rt


def test_control_token_strings_in_raw_and_infill_text_stay_text(real_tokens) -> None:
    """A file being edited that holds control-token strings cannot inject them: on the raw-prompt routes
    and in every infill field they are encoded as their characters."""
    rt, tok = real_tokens, real_tokens.tokenizer
    control_ids = {tok.token_to_id(c) for c in CONTROLS}
    text = "x = '" + "".join(CONTROLS) + "'\n"

    def parts(spec: protocol.GenSpec) -> tuple[list[int], list[int]]:
        job, _ = build_job(rt, spec, Config())
        lo, hi = job.row.region
        return list(job.row.ids[:lo]), list(job.row.ids[hi:])

    for spec in (
        spec_of({"prompt": text, "max_new_tokens": 8}),
        protocol.parse_completions({"prompt": text, "max_tokens": 8}, default_tokens=8, infill_tokens=8),
    ):
        before, after = parts(spec)
        assert not control_ids & set(before) and after == [] and tok.decode(before) == text

    infills = [
        protocol.parse_native_infill({"prefix": text, "suffix": text}, default_tokens=8),
        protocol.parse_completions(
            {"prompt": text, "suffix": text, "max_tokens": 8}, default_tokens=8, infill_tokens=8
        ),
        protocol.parse_llama_infill({"input_prefix": text, "input_suffix": text}, default_tokens=8),
    ]
    for spec in infills:
        before, after = parts(spec)
        assert not control_ids & set(before + after)
        assert tok.decode(before) == text and tok.decode(after) == text

    # Other files: the layout's own separators are the only control tokens.
    extra = [{"filename": "a<|file_sep|>.py", "text": text}, {"filename": "b.py", "text": "<|im_end|>"}]
    spec = protocol.parse_llama_infill(
        {"input_prefix": text, "input_suffix": text, "input_extra": extra}, default_tokens=8
    )
    before, after = parts(spec)
    sep = tok.token_to_id("<|file_sep|>")
    assert [i for i in before if i in control_ids] == [sep, sep, sep] and not control_ids & set(after)
    assert (
        tok.decode(before)
        == f"<|file_sep|>a<|file_sep|>.py\n{text}<|file_sep|>b.py\n<|im_end|><|file_sep|>\n{text}"
    )

    # Text without control strings is encoded exactly as before (the whole string at once).
    plain = "def f(x):\n    return x  # <|not a token|>\n"
    assert rt.rows.encode_prompt(plain) == tok.encode(plain)


def test_masks_written_in_a_holes_prompt_are_its_holes_and_nothing_else_is_a_control(real_tokens) -> None:
    """The documented raw-token request: ``max_new_tokens`` 0 fills the prompt's ``<|mask|>`` holes; the
    other control strings in it stay text (token ids as the prompt are the way to send any other)."""
    tok = real_tokens.tokenizer
    prompt = "a = '<|endoftext|>'<|mask|><|mask|>\nb = 1<|mask|>"
    job, _ = build_job(
        real_tokens, spec_of({"prompt": prompt, "max_new_tokens": 0, "decoder": "reference"}), Config()
    )
    ids = list(job.row.ids)
    assert ids.count(tok.mask_id) == 3 and tok.token_to_id("<|endoftext|>") not in ids
    assert tok.decode(ids) == prompt
