"""The request bodies both clients send, and the typed options they take."""

from __future__ import annotations

import dataclasses

from assistant.client.core import SamplingOptions, generate_body, infill_body
from model_runtime.params import SamplingParams


def test_sampling_options_name_every_knob_the_runtime_has() -> None:
    knobs = {f.name for f in dataclasses.fields(SamplingParams)} - {"max_new_tokens"}
    assert {f.name for f in dataclasses.fields(SamplingOptions)} == knobs


def test_bodies_carry_only_what_was_set() -> None:
    body = generate_body(
        [{"role": "user", "content": "hi"}],
        None,
        8,
        SamplingOptions(steps=4, top_k=0),
        "s",
        None,
        stream=True,
    )
    assert body == {
        "messages": [{"role": "user", "content": "hi"}],
        "max_new_tokens": 8,
        "steps": 4,
        "top_k": 0,  # 0 (top-k off) is a value, not "unset"
        "session": "s",
        "stream": True,
    }
    assert infill_body("a", "b", None, None, None, 2.5, stream=False) == {
        "prefix": "a",
        "suffix": "b",
        "max_seconds": 2.5,
        "stream": False,
    }
