"""Seeded generator of malformed daemon requests, shared by the fuzz test and scripts/fuzz_daemon.py."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator

# One valid body per POST route; the fuzzer breaks them.
VALID: dict[str, dict] = {
    "/v1/diffu/generate": {
        "prompt": "def f(x):",
        "max_new_tokens": 8,
        "steps": 8,
        "temperature": 0.0,
        "top_p": 0.9,
        "top_k": 10,
        "alg": "entropy",
        "alg_temp": 0.1,
        "eps": 0.001,
        "seed": 1,
        "stream": False,
        "session": "s",
        "max_seconds": 5.0,
    },
    "/v1/diffu/infill": {
        "prefix": "def f(x):\n    return ",
        "suffix": "\n",
        "canvas_tokens": 4,
        "steps": 4,
        "stream": False,
    },
    "/v1/chat/completions": {
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 8,
        "temperature": 0.0,
        "stream": False,
        "stop": ["\n\n"],
    },
    "/v1/completions": {"prompt": "def f(x):", "max_tokens": 8, "suffix": "\n", "stream": False},
    "/infill": {
        "input_prefix": "def f(x):\n    return ",
        "input_suffix": "\n",
        "n_predict": 4,
        "input_extra": [{"filename": "a.py", "text": "x = 1\n"}],
        "stream": False,
    },
    "/v1/diffu/cancel": {"id": "nope"},
}

BAD_VALUES = [
    "HUGE_INT",
    "\ud800",
    "a\udc00b",
    None,
    True,
    [],
    {},
    [1, [2, [3]]],
    -1,
    -(10**30),
    10**30,
    1e308,
    -1e308,
    0,
    0.5,
    "",
    " ",
    "x" * 100_000,
    "NaN",
    {"a": "DEEP"},
    [None],
    "<|im_start|>",
    3.5e-320,
    2**63,
    "1e999",
]


def _value(rng: random.Random) -> object:
    value = rng.choice(BAD_VALUES)
    if value == "HUGE_INT":
        return "HUGE_INT"
    if isinstance(value, dict) and value.get("a") == "DEEP":
        depth = rng.choice([50, 2000, 20_000])
        return f"DEEP:{depth}"
    return value


def _render(body: object) -> bytes:
    """JSON with two shapes json.dumps cannot write: a 5,000-digit integer and deep nesting."""
    text = json.dumps(body)
    text = text.replace('"HUGE_INT"', "9" * 5000)
    while '"DEEP:' in text:
        start = text.index('"DEEP:')
        end = text.index('"', start + 1)
        depth = int(text[start + 6 : end])
        text = text[:start] + "[" * depth + "]" * depth + text[end + 1 :]
    return text.encode("utf-8", "surrogatepass")


def malformed_requests(seed: int, count: int) -> Iterator[tuple[str, bytes]]:
    """``count`` (path, body) pairs; every route appears, each body is wrong in at least one way."""
    rng = random.Random(seed)
    routes = sorted(VALID)
    for i in range(count):
        path = routes[i % len(routes)] if i < len(routes) else rng.choice(routes)
        body = json.loads(json.dumps(VALID[path]))
        kind = rng.random()
        if kind < 0.08:
            yield (
                path,
                rng.choice(
                    [
                        b"",
                        b"{",
                        b"[1,2]",
                        b'"text"',
                        b"\xff\xfe",
                        b'{"a": NaN}',
                        b"null",
                        b"{}{}",
                        b"[" * 30_000 + b"]" * 30_000,
                    ]
                ),
            )
            continue
        fields = list(body)
        for _ in range(rng.choice([1, 1, 2])):
            if rng.random() < 0.15:
                body[f"unknown_field_{rng.randrange(100)}"] = _value(rng)
            else:
                body[rng.choice(fields)] = _value(rng)
        if path == "/v1/chat/completions" and rng.random() < 0.3:
            body["messages"] = [{"role": rng.choice(["user", "robot", None]), "content": _value(rng)}]
        yield path, _render(body)
