"""``/v1/diffu/status``, ``/health`` and ``/v1/models`` on the wire, as they were before the typed records
(``assistant/daemon_status.py``): the same keys in the same order, and the typed records read a response
and give it back byte for byte, so nothing a client or a script reads changed.

The key lists were read from the daemon of commit 8dd7ede (before issue #41); a field added on purpose is
added here too. tests/assistant/test_daemon_tiny.py checks the same round trip on a real runtime's
daemon, whose status holds the compiled-program cache the fake runtime has not.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from assistant.daemon_status import DaemonStatus, ModelEntry, ModelList
from assistant.wire import DaemonCounters, Stage
from tests.assistant.helpers import DaemonProcess

STATUS_KEYS = [
    "model",
    "model_path",
    "version",
    "pid",
    "device",
    "dtype",
    "quantize",
    "max_context",
    "default_decoder",
    "one_line_defaults",
    "block_defaults",
    "chat_decoder",
    "chat_defaults",
    "mesh",
    "buckets",
    "programs",
    "engine",
    "queue",
    "counters",
    "uptime_seconds",
    "limits",
    "auth",
    "features",
]
ENGINE_KEYS = ["stage", "progress", "detail", "error", "warmed", "shapes", "eta_seconds", "compiling"]
QUEUE_KEYS = ["pending", "running", "capacity", "max_batch"]
COUNTER_KEYS = [
    "requests",
    "completed",
    "cancelled",
    "timed_out",
    "failed",
    "rejected",
    "batches",
    "rows",
    "batched_rows",
    "largest_batch",
    "generated_tokens",
    "forwards",
]
LIMIT_KEYS = ["max_steps", "max_seconds", "max_body_bytes", "queue_size"]
HEALTH_KEYS = ["status", *ENGINE_KEYS, "serving", "model"]
# editor_context: diffu's own, added in #44 (the row a model recommends for editors); the rest as always.
MODEL_KEYS = ["id", "object", "created", "owned_by", "max_model_len", "context_length", "editor_context"]


def _starlette_json(data: Any) -> bytes:
    """A body as the daemon's JSONResponse renders it."""
    return json.dumps(data, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")).encode()


def test_the_status_route_sends_the_keys_it_always_sent(fake_daemon: DaemonProcess) -> None:
    response = httpx.get(fake_daemon.url + "/v1/diffu/status", headers=fake_daemon.headers)
    data = response.json()
    assert list(data) == STATUS_KEYS
    assert list(data["engine"]) == ENGINE_KEYS and list(data["queue"]) == QUEUE_KEYS
    assert list(data["counters"]) == COUNTER_KEYS and list(data["limits"]) == LIMIT_KEYS
    assert data["programs"] is None and isinstance(data["features"], list)  # the fake keeps no programs
    # The typed record reads every field and gives the body back as it came, byte for byte.
    status = DaemonStatus.from_dict(data)
    assert _starlette_json(status.to_dict()) == response.content
    assert status.engine.stage in (Stage.WARMING, Stage.READY) and status.model == "fake"
    assert status.queue.capacity == 4 and status.limits.max_body_bytes == 65536 and status.auth


def test_health_and_the_model_list_send_the_keys_they_always_sent(fake_daemon: DaemonProcess) -> None:
    health = httpx.get(fake_daemon.url + "/health").json()
    assert list(health) == HEALTH_KEYS
    with httpx.Client(base_url=fake_daemon.url, headers=fake_daemon.headers) as http:
        models = http.get("/v1/models")
        one = http.get("/v1/models/fake")
    assert list(models.json()) == ["object", "data"] and list(models.json()["data"][0]) == MODEL_KEYS
    assert _starlette_json(ModelList.from_dict(models.json()).to_dict()) == models.content
    assert _starlette_json(ModelEntry.from_dict(one.json()).to_dict()) == one.content
    assert ModelList.from_dict(models.json()).data[0].id == "fake"


def test_reading_is_lenient_as_for_the_other_wire_records() -> None:
    """A field the daemon left out keeps its default; one a newer daemon added is ignored."""
    status = DaemonStatus.from_dict({"model": "m", "engine": {"stage": "loading", "new": 1}, "extra": True})
    assert status.model == "m" and status.engine.stage == Stage.LOADING and status.pid == 0
    assert status.counters == DaemonCounters() and status.chat_defaults == {} and status.programs is None
    assert list(status.to_dict()) == STATUS_KEYS
    assert ModelList.from_dict({}).data == () and ModelEntry.from_dict({"id": "x", "new": 2}).id == "x"
