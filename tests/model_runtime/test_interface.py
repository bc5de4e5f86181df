"""The three runtimes the daemon serves hold to one interface: the model, the fake, the multi-host leader."""

from __future__ import annotations

import dataclasses
import json

import pytest

from assistant.server.fake_runtime import FakeRuntime
from model_runtime.interface import BatchDone, BatchStep, RuntimeProtocol
from model_runtime.params import SamplingParams


class KeyValueStore:
    """What the leader needs of JAX's coordination service: set and delete keys (recorded here)."""

    def __init__(self) -> None:
        self.values: dict[str, str] = {}

    def key_value_set(self, key: str, value: str, allow_overwrite: bool = False) -> None:
        assert allow_overwrite or key not in self.values, key
        self.values[key] = value

    def key_value_delete(self, key: str) -> None:
        self.values.pop(key, None)


def test_the_model_the_fake_and_the_leader_are_runtimes(runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    from model_runtime import distributed

    store = KeyValueStore()
    monkeypatch.setattr(distributed, "_client", lambda: store)
    fake = FakeRuntime()
    leader = distributed.Leader(fake)  # type: ignore[arg-type]  # it wraps any runtime
    for rt in (runtime, fake, leader):
        assert isinstance(rt, RuntimeProtocol), type(rt).__name__
        assert isinstance(rt.rows.tokenizer.stop_ids(chat=True), tuple) and rt.info.max_context > 0
        assert rt.rows.max_context == rt.info.max_context  # infill rows take in files up to the context
    # What the leader is and how it builds rows are the wrapped runtime's, whole, but that it compiles
    # between its batches: its followers take the published calls one at a time.
    assert (
        leader.info == dataclasses.replace(fake.info, concurrent_compile=False) and leader.rows is fake.rows
    )
    assert fake.info.concurrent_compile and runtime.info.concurrent_compile  # both on CPU
    assert leader.program_cache() is None and isinstance(runtime.program_cache()["held"], int)
    # The model's status facts, read once at load: its buckets hold the context, its chat defaults are
    # shared by every request, so nobody may change them.
    assert runtime.info.buckets[-1][1] == runtime.info.max_context and runtime.info.supports_holes
    with pytest.raises(TypeError):
        runtime.info.chat_defaults["temperature"] = 1.0  # type: ignore[index]


def test_the_leader_publishes_each_run_and_its_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    from model_runtime import distributed

    store = KeyValueStore()
    monkeypatch.setattr(distributed, "_client", lambda: store)
    fake = FakeRuntime()
    leader = distributed.Leader(fake)  # type: ignore[arg-type]
    params = SamplingParams(max_new_tokens=6, steps=3)
    row = fake.rows.make_row(fake.tokenizer.encode("x = "), 6, chat=False)
    events = list(leader.run([row], params))
    alone = list(fake.run([row], params))
    assert [type(e) for e in events] == [BatchStep] * 3 + [BatchDone]
    assert isinstance(events[-1], BatchDone) and isinstance(alone[-1], BatchDone)
    assert events[-1].texts == alone[-1].texts
    call = json.loads(store.values["diffu/job/1"])
    assert call["op"] == "run" and call["rows"][0]["ids"] == list(row.ids)
    assert [store.values[f"diffu/step/1/{i}"] for i in range(4)] == ["go", "go", "go", "stop"]
