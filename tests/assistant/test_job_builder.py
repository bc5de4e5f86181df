"""Request to job, without HTTP or an event loop: the fake runtime and a parsed request are all it takes."""

from __future__ import annotations

import pytest

from assistant.config import Config
from assistant.server import protocol
from assistant.server.fake_runtime import FakeRuntime
from assistant.server.job_builder import build_job
from assistant.server.request_fields import RequestError


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
    job, truncated = build_job(rt, spec_of({"prompt": "def f(", "top_k": rt.vocab_size + 5}), Config())
    assert not truncated and job.id and job.loop is None  # the HTTP layer attaches its loop
    assert job.params.top_k == 0  # every token kept: no filtering (and lax.top_k needs k <= vocab)
    assert job.params.steps == 16 and job.params.decoder == rt.default_decoder
    assert job.row.ids[-16:] == (rt.tokenizer.mask_id,) * 16 and job.prompt_tokens == len("def f(")
    with pytest.raises(RequestError, match=r"steps: must be <= 8 \(the daemon's max_steps\), got 16") as info:
        build_job(rt, spec_of({"prompt": "x"}), Config(max_steps=8))
    assert info.value.param == "steps"


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
