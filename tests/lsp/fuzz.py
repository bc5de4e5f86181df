"""Seeded generator of malformed LSP traffic, shared by the fuzz test and ``scripts/fuzz_lsp.py``.

Each :class:`Case` is the bytes to send and what the specification says must come back: exactly one
response for its ``id`` (a result, or an error with a code the specification names), or nothing (a
notification, a client response); framing and envelope errors whose id cannot be known are answered with
a null id (:attr:`Case.null`). Then :func:`check` compares what came back with those expectations.
"""

from __future__ import annotations

import copy
import json
import random
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from tests.lsp.rawclient import frame

# Error codes a malformed request may get: parse error, invalid request, method not found, invalid
# params, and request cancelled (a fuzzed $/cancelRequest may cancel another fuzzed request). -32603
# (internal error) is not among them: malformed input must be recognised as such.
ALLOWED = {-32700, -32600, -32601, -32602, -32800}
PING = {"command": "diffu.status"}


@dataclass(frozen=True)
class Case:
    kind: str
    data: bytes
    id: Any = None  # the request id that must get exactly one response (None: no response expected)
    null: bool = False  # a null-id error is expected (the message's id cannot be known)


def _requests(uri: str) -> list[tuple[str, dict[str, Any]]]:
    pos = {"line": 1, "character": 2}
    rng = {"start": {"line": 0, "character": 0}, "end": {"line": 2, "character": 0}}
    doc = {"uri": uri}
    return [
        (
            "textDocument/inlineCompletion",
            {"textDocument": doc, "position": pos, "context": {"triggerKind": 1}},
        ),
        ("textDocument/completion", {"textDocument": doc, "position": pos, "context": {"triggerKind": 1}}),
        ("textDocument/codeAction", {"textDocument": doc, "range": rng, "context": {"diagnostics": []}}),
        ("codeAction/resolve", {"title": "Fill", "data": {"uri": uri, "range": rng}}),
        ("workspace/executeCommand", {"command": "diffu.fillHoles", "arguments": [uri, rng]}),
        ("workspace/executeCommand", {"command": "diffu.status", "arguments": []}),
    ]


def _notifications(uri: str) -> list[tuple[str, dict[str, Any]]]:
    change = {
        "range": {"start": {"line": 0, "character": 0}, "end": {"line": 0, "character": 0}},
        "text": "#",
    }
    return [
        ("textDocument/didChange", {"textDocument": {"uri": uri, "version": 99}, "contentChanges": [change]}),
        ("workspace/didChangeConfiguration", {"settings": {"diffu": {"debounceMs": 0}}}),
        ("$/cancelRequest", {"id": 1}),
        ("$/setTrace", {"value": "off"}),
        ("textDocument/didClose", {"textDocument": {"uri": uri + ".other"}}),
    ]


def _weird(rng: random.Random) -> Any:
    return rng.choice(
        [
            None,
            "",
            "x" * rng.randint(1, 3000),
            -1,
            -(2**31) - 1,
            2**53 + 1,
            10**30,
            1.5,
            True,
            [],
            {},
            {"nested": [{"deep": [1, 2, {"x": None}]}]},
            "\ud800",
            "file:///never/opened.py",
            "not a uri",
            [1, "two", None],
        ]
    )


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*prefix, i))
    return out


def _mutate(params: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """Break params: drop a key, change a value's type, or add junk, at a random place."""
    params = copy.deepcopy(params)
    path = rng.choice(_paths(params))
    parent: Any = params
    for key in path[:-1]:
        parent = parent[key]
    last = path[-1]
    action = rng.random()
    if action < 0.3 and isinstance(parent, dict):
        del parent[last]
    elif action < 0.9:
        parent[last] = _weird(rng)
    elif isinstance(parent, dict):
        parent[f"unknown{rng.randint(0, 9)}"] = _weird(rng)
    return params


def _dump(message: Any) -> bytes:
    return json.dumps(message).encode()


BAD_JSON = [
    b'{"jsonrpc": "2.0", "id": 1, "method": ',
    b"{'jsonrpc': '2.0'}",
    b'{"jsonrpc": "2.0",}',
    b'{"jsonrpc": "2.0", "id": NaN, "method": "x"}',
    b'{"a": Infinity}',
    b"\xff\xfe\x00garbage",
    b"[" * 5000,
    b'{"id": 1' + b"9" * 5000 + b', "jsonrpc": "2.0", "method": "x"}',
    b"",
    b"null null",
]
BROKEN_FRAMES = [
    b"Content-Type: application/json\r\n\r\n{}",
    b"Content-Length: abc\r\n\r\n{}",
    b"Content-Length: -5\r\n\r\n{}",
    b"Content-Length: 3\r\nContent-Length: 4\r\n\r\n{}",
    b"hello world\r\n",
    b'{"jsonrpc":"2.0","id":1,"method":"x"}',
    b"Content-Length: 2\r\nContent-Type: text/x; charset=latin-1\r\n\r\n{}",
    b"Content-Length: 99999999999\r\n\r\n",
]


def malformed_messages(seed: int, count: int, uri: str) -> Iterator[Case]:
    """``count`` malformed messages about the open document ``uri``; ids are unique strings."""
    rng = random.Random(seed)
    requests, notifications = _requests(uri), _notifications(uri)
    for i in range(count):
        msg_id = f"fuzz-{seed}-{i}"
        kind = rng.choice(
            ["params"] * 6 + ["notification"] * 2 + ["json", "envelope", "id", "method", "frame", "response"]
        )
        if kind == "params":
            method, params = rng.choice(requests)
            body: dict[str, Any] = {
                "jsonrpc": "2.0",
                "id": msg_id,
                "method": method,
                "params": _mutate(params, rng),
            }
            yield Case(kind, frame(_dump(body)), id=msg_id)
        elif kind == "notification":
            method, params = rng.choice(notifications)
            yield Case(
                kind, frame(_dump({"jsonrpc": "2.0", "method": method, "params": _mutate(params, rng)}))
            )
        elif kind == "json":
            yield Case(kind, frame(rng.choice(BAD_JSON)), null=True)
        elif kind == "envelope":
            yield Case(
                kind, frame(_dump(rng.choice([3, "s", None, [], [{"jsonrpc": "2.0"}], True]))), null=True
            )
        elif kind == "id":
            bad: object = rng.choice([1.5, True, None, {}, [], -0.0])
            body = {
                "jsonrpc": "2.0",
                "id": bad,
                "method": "textDocument/completion",
                "params": {},
            }
            data = _dump(body).replace(b'"id": 1.5', b'"id": 1e999') if rng.random() < 0.3 else _dump(body)
            yield Case(kind, frame(data), null=True)
        elif kind == "method":
            methods: list[dict[str, Any]] = [
                {"jsonrpc": "1.0", "id": msg_id, "method": "textDocument/completion"},
                {"jsonrpc": "2.0", "id": msg_id, "method": rng.choice([1, None, "", ["x"]])},
                {"jsonrpc": "2.0", "id": msg_id, "method": f"fuzz/{rng.randint(0, 999)}"},
                {"jsonrpc": "2.0", "id": msg_id, "method": "$/fuzz"},
                {"jsonrpc": "2.0", "id": msg_id, "method": "textDocument/didSave", "params": {}},
                {"jsonrpc": "2.0", "id": msg_id, "method": "workspace/executeCommand", "params": "x"},
                {"jsonrpc": "2.0", "id": msg_id},
            ]
            body = rng.choice(methods)
            yield Case(kind, frame(_dump(body)), id=msg_id)
        elif kind == "frame":
            yield Case(kind, rng.choice(BROKEN_FRAMES), null=True)
        else:  # a response to a request the server never sent
            body = {"jsonrpc": "2.0", "id": f"unknown-{i}", "result": _weird(rng)}
            yield Case(kind, frame(_dump(body)))


@dataclass
class Report:
    cases: Counter[str]
    answers: Counter[str]  # response kinds: "result", or the error code
    problems: list[str]


def check(cases: list[Case], responses: list[dict[str, Any]], raw_output: bytes) -> Report:
    """Compare the server's responses with what each case must get; every problem is named."""
    problems: list[str] = []
    by_id: dict[Any, list[dict[str, Any]]] = {}
    for r in responses:
        by_id.setdefault(r.get("id"), []).append(r)
    answers: Counter[str] = Counter()
    for r in responses:
        answers["result" if "result" in r else str(r["error"]["code"])] += 1
    for case in cases:
        if case.id is None:
            continue
        got = by_id.get(case.id, [])
        if len(got) != 1:
            problems.append(f"{case.kind} {case.id}: {len(got)} responses")
            continue
        error = got[0].get("error")
        if error is not None and (error.get("code") not in ALLOWED or set(error) != {"code", "message"}):
            problems.append(f"{case.kind} {case.id}: error {error}")
    for r in by_id.get(None, []):
        if r.get("error", {}).get("code") not in (-32700, -32600):
            problems.append(f"null-id answer {r}")
    expected_nulls = sum(c.null for c in cases)
    if expected_nulls and not by_id.get(None):
        problems.append(f"{expected_nulls} unreadable messages and no null-id error")
    if b"Traceback" in raw_output:
        problems.append("a Python traceback reached the client")
    return Report(Counter(c.kind for c in cases), answers, problems)
