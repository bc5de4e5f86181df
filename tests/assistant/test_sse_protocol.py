"""SSE encoding/parsing and request parsing: the specific 4xx messages bad input gets."""

from __future__ import annotations

import json

import pytest

from assistant import sse
from assistant.server import protocol, request_fields
from assistant.server.request_fields import RequestError


def test_sse_round_trip_with_named_events_comments_and_multiline_data() -> None:
    stream = (
        sse.comment("queued")
        + sse.encode({"step": 1}, event="step")
        + sse.encode("a\nb", id="7")
        + sse.encode("[DONE]")
    ).decode()
    events = list(sse.iter_events(stream.splitlines()))
    assert [e.event for e in events] == ["step", "message", "message"]
    assert events[0].json() == {"step": 1}
    assert events[1].data == "a\nb" and events[1].id == "7"
    assert events[2].data == "[DONE]"


def test_sse_parser_handles_crlf_and_drops_an_unterminated_event() -> None:
    lines = ["event: step\r\n", 'data: {"x": 1}\r\n', "\r\n", "data: partial"]
    events = list(sse.iter_events(lines))
    assert len(events) == 1 and events[0].json() == {"x": 1}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"", "the request body is empty"),
        (b"{", "malformed JSON"),
        (b"[1, 2]", "must be a JSON object, got an array"),
        (b"\xff\xfe", "not UTF-8"),
        (b"[" * 100000 + b"]" * 100000, "malformed JSON"),
    ],
)
def test_parse_json_errors(body: bytes, message: str) -> None:
    with pytest.raises(RequestError, match=message) as info:
        request_fields.parse_json(body)
    assert info.value.status == 400


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({}, "give exactly one of messages"),
        ({"prompt": "x", "messages": [{"role": "user", "content": "y"}]}, "give exactly one of messages"),
        ({"prompt": "x", "stpes": 4}, "stpes: unknown field for /v1/diffu/generate"),
        ({"prompt": "x", "steps": 0}, "steps: must be >= 1, got 0"),
        ({"prompt": "x", "steps": "many"}, "steps: expected an integer, got 'many'"),
        ({"prompt": "x", "temperature": float("nan")}, "temperature: expected a finite number"),
        ({"prompt": "x", "alg": "greedy"}, "alg: must be one of origin, maskgit_plus, topk_margin, entropy"),
        ({"prompt": 5}, "prompt: expected a string, got 5"),
        ({"prompt": "x", "max_new_tokens": -3}, "max_new_tokens: must be >= 0, got -3"),
        ({"prompt": "x", "stream": "yes"}, "stream: expected true or false"),
        ({"messages": []}, "messages: expected a non-empty array"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role: expected 'system', 'user'"),
        ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content: expected a string"),
        (
            {"messages": [{"role": "user", "content": "a"}, {"role": "system", "content": "b"}]},
            "messages[1].role: a system message is only allowed first",
        ),
        (
            {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]},
            "the last message must come from the user",
        ),
    ],
)
def test_native_generate_rejections(data: dict, message: str) -> None:
    with pytest.raises(RequestError) as info:
        protocol.parse_native_generate(data, default_tokens=16)
    assert message in str(info.value)


def test_native_generate_accepts_every_sampling_parameter() -> None:
    spec = protocol.parse_native_generate(
        {
            "prompt": "def f",
            "max_new_tokens": 12,
            "steps": 6,
            "alg": "maskgit_plus",
            "alg_temp": 0.5,
            "temperature": 0.2,
            "top_p": 0.9,
            "top_k": 0,
            "eps": 0.01,
            "seed": 3,
            "stream": False,
            "session": "s1",
            "max_seconds": 2.5,
        },
        default_tokens=16,
    )
    assert spec.mode == "prompt" and spec.canvas_tokens == 12 and not spec.stream
    assert spec.sampling.body() == {
        "steps": 6,
        "top_k": 0,
        "seed": 3,
        "alg_temp": 0.5,
        "temperature": 0.2,
        "top_p": 0.9,
        "eps": 0.01,
        "alg": "maskgit_plus",
    }
    assert spec.session == "s1" and spec.max_seconds == 2.5


def test_openai_chat_parsing_tolerates_extra_fields_and_refuses_unsupported_features() -> None:
    spec = protocol.parse_chat_completions(
        {
            "model": "whatever",
            "messages": [
                {"role": "developer", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            ],
            "max_completion_tokens": 20,
            "stream": True,
            "stream_options": {"include_usage": True},
            "stop": "\n\n",
            "user": "me",
            "presence_penalty": 0,
            "n": 1,
            "logprobs": False,
        },
        default_tokens=64,
    )
    assert spec.messages == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert spec.canvas_tokens == 20 and spec.include_usage and spec.stop == ["\n\n"]
    assert spec.sampling.temperature == 0.0
    for extra, message in [
        ({"n": 2}, "n: only n=1"),
        ({"tools": [{"type": "function"}]}, "tools"),
        ({"logprobs": True}, "logprobs"),
        ({"frequency_penalty": 0.5}, "penalties"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"stop": ["a"] * 17}, "stop: at most 16"),
    ]:
        with pytest.raises(RequestError, match=message):
            protocol.parse_chat_completions(
                {"messages": [{"role": "user", "content": "x"}], **extra}, default_tokens=64
            )


def test_completions_with_suffix_is_infill() -> None:
    spec = protocol.parse_completions(
        {"prompt": ["def add(a, b):\n"], "suffix": "\n\nprint(add(1, 2))"},
        default_tokens=64,
        infill_tokens=24,
    )
    assert spec.mode == "infill" and spec.prefix == "def add(a, b):\n" and spec.canvas_tokens == 24
    plain = protocol.parse_completions(
        {"prompt": [1, 2, 3], "max_tokens": 5}, default_tokens=64, infill_tokens=24
    )
    assert plain.mode == "prompt" and plain.prompt_ids == [1, 2, 3] and plain.canvas_tokens == 5
    with pytest.raises(RequestError, match="prompt: expected a string"):
        protocol.parse_completions({"prompt": {"a": 1}}, default_tokens=64, infill_tokens=24)


def test_llama_infill_fields() -> None:
    spec = protocol.parse_llama_infill(
        {
            "input_prefix": "def f():\n",
            "input_suffix": "\n",
            "prompt": "    ret",
            "n_predict": 40,
            "input_extra": [{"filename": "util.py", "text": "X = 1\n"}],
            "t_max_predict_ms": 500,
            "n_indent": 4,
            "samplers": ["top_k"],
            "cache_prompt": True,
            "top_k": 40,
            "top_p": 0.99,
        },
        default_tokens=32,
    )
    assert spec.prefix == "def f():\n    ret" and spec.suffix == "\n" and spec.canvas_tokens == 40
    assert spec.extra == [("util.py", "X = 1\n")] and spec.max_seconds == 0.5 and spec.n_indent == 4
    assert spec.sampling.top_k == 40 and spec.sampling.top_p == 0.99
    assert protocol.parse_llama_infill({"n_predict": 0}, default_tokens=32).canvas_tokens == 0
    assert protocol.parse_llama_infill({"n_predict": -1}, default_tokens=32).canvas_tokens == 32
    with pytest.raises(RequestError, match=r"input_extra\[0\]: expected an object with a string text"):
        protocol.parse_llama_infill({"input_extra": [{"filename": "a"}]}, default_tokens=32)


def test_post_processing_helpers() -> None:
    assert protocol.apply_stop("a = 1\n\nb = 2", ["\n\n", "b"]) == ("a = 1", True)
    assert protocol.apply_stop("abc", ["x"]) == ("abc", False)
    text = "x = 1\n    y = 2\n  z = 3\n"
    assert protocol.apply_n_indent(text, 4) == ("x = 1\n    y = 2\n", True)
    assert protocol.apply_n_indent(text, 0) == (text, False)


def test_error_shape_is_openai() -> None:
    err = RequestError("steps: must be >= 1", param="steps")
    assert json.loads(json.dumps(err.to_dict())) == {
        "error": {
            "message": "steps: must be >= 1",
            "type": "invalid_request_error",
            "param": "steps",
            "code": None,
        }
    }
