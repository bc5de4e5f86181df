"""The request bodies both clients send, and the typed options they take."""

from __future__ import annotations

import dataclasses
import json

from assistant.client.calls import generate_body, infill_body
from assistant.client.core import SamplingOptions, parse_done
from assistant.wire import DaemonCounters, DoneStats, ErrorCode, ErrorType, error_body
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


def test_the_done_stats_cross_the_wire_whole() -> None:
    sent = DoneStats(steps=3, new_tokens=5, canvas_tokens=8, bucket=(4, 128), generate_seconds=0.25)
    body = json.loads(json.dumps({"id": "x", "text": "t", "finish_reason": "stop", "stats": sent.to_dict()}))
    assert body["stats"]["bucket"] == [4, 128] and "cancel_reason" not in body["stats"]
    assert parse_done(body).stats == sent
    cancelled = dataclasses.replace(sent, cancel_reason="superseded")
    assert DoneStats.from_dict(json.loads(json.dumps(cancelled.to_dict()))) == cancelled
    # A field a newer daemon adds is ignored; one it leaves out keeps its default.
    assert DoneStats.from_dict({"steps": 2, "later_field": 1}) == DoneStats(steps=2)
    assert parse_done({"text": "", "finish_reason": "cancelled"}).stats == DoneStats()


def test_counters_and_error_names_are_plain_json() -> None:
    counters = DaemonCounters(requests=3, completed=2, rejected=1)
    assert DaemonCounters.from_dict(json.loads(json.dumps(counters.to_dict()))) == counters
    body = json.loads(
        json.dumps(error_body("too long", ErrorType.INVALID_REQUEST, code=ErrorCode.CONTEXT_LENGTH_EXCEEDED))
    )
    assert body == {
        "error": {
            "message": "too long",
            "type": "invalid_request_error",
            "param": None,
            "code": "context_length_exceeded",
        }
    }


def test_both_clients_make_every_call_of_the_table_alike() -> None:
    import inspect
    import typing

    from assistant.client import AsyncClient, Client, calls

    def returns(entry: object) -> object:
        return typing.get_type_hints(entry).get("return") if inspect.isfunction(entry) else None

    entries = {
        name: entry
        for name, entry in vars(calls).items()
        if returns(entry) is calls.Stream or typing.get_origin(returns(entry)) is calls.Call
    }
    assert {"generate", "stream_infill", "cancel", "status"} <= set(entries)
    # The I/O each client does its own way; everything else public is a call of the table.
    own = {
        "connect",
        "wait_ready",
        "request",
        "stream",
        "call",
        "events",
        "endpoint",
        "close",
        "aclose",
        "health",
    }
    for cls in (Client, AsyncClient):
        public = {n for n in dir(cls) if not n.startswith("_") and n not in own}
        assert public == set(entries), cls.__name__
        for name, entry in entries.items():
            method = inspect.signature(getattr(cls, name))
            assert list(method.parameters)[1:] == list(inspect.signature(entry).parameters), (
                cls.__name__,
                name,
            )
            assert getattr(cls, name).__doc__ == entry.__doc__
    # Calls are awaited on the async client; streams are iterated, on both.
    assert inspect.iscoroutinefunction(AsyncClient.generate) and not inspect.iscoroutinefunction(
        Client.generate
    )
    assert not inspect.iscoroutinefunction(AsyncClient.stream_generate)


def test_the_clients_read_the_daemons_stages_as_the_wire_declares_them() -> None:
    import pytest

    from assistant import sse
    from assistant.client.core import DaemonUnavailable, health_update
    from assistant.wire import HEALTH_OK, SERVING, Stage
    from lsp.state import STAGES, stage_message

    def event(status: str) -> sse.ServerSentEvent:
        return sse.ServerSentEvent("status", json.dumps({"status": status, "progress": 0.5, "detail": "x"}))

    seen: list[tuple[str, float, str]] = []
    assert health_update(event(Stage.LOADING), lambda *report: seen.append(report)) is False
    assert seen == [("loading", 0.5, "x")]
    assert health_update(event(HEALTH_OK), None) is True
    for ended in (Stage.FAILED, Stage.STOPPING):
        with pytest.raises(DaemonUnavailable, match="could not load its model"):
            health_update(event(ended), None)
    # Every stage the daemon can send has words in the editors' status (none shows as a raw name).
    assert set(Stage) | {HEALTH_OK} <= set(STAGES)
    assert stage_message(Stage.WARMING, "") == "warming up" and Stage.WARMING in SERVING
