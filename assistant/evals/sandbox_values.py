"""Values as data: what a judged program returns to the evaluator, and the inputs it is given.

A program under test computes outputs in its own (untrusted) process and sends them as text; the evaluator
rebuilds plain values from that text and compares them itself (``assistant/evals/judge.py``). The text is
JSON, with the types JSON lacks tagged so that they survive the trip: ``{"tuple": [...]}``,
``{"set": [...]}``, ``{"frozenset": [...]}``, ``{"dict": [[key, value], ...]}`` (any hashable key),
``{"bytes": "hex"}``, ``{"complex": [re, im]}``, ``{"int": "0x..."}`` (integers too large for JSON's
parsers). Every JSON object is such a tag, so a decoded value is never ambiguous; lists, strings,
numbers (NaN and infinities as JSON's ``NaN``/``Infinity``), booleans and None are themselves.

Only values of the built-in types encode. An instance of a subclass (a ``Counter``, a namedtuple, an
``IntEnum``) encodes as its base value, read through the base type's own methods, so an overridden
``__eq__``, ``__iter__`` or ``__repr__`` has no say in what is sent; anything else (an object equal to
everything, a generator) raises ``NotData``. Nothing here is ever unpickled or evaluated.

The standard library only: the sandbox's child loads this file by path (``sandbox_child.py``), and the
reference run embeds its text (``judge_reference.py``).
"""

from __future__ import annotations

import json
from typing import Any

# Conversions a test may apply to an output before comparing it (``tuple(candidate(x)) == ...``), by name;
# the harness applies them in the program's process, as the test would have.
WRAPPERS = {"tuple": tuple, "list": list, "sorted": sorted, "set": set, "frozenset": frozenset}
MAX_DEPTH = 100  # containers nested deeper are not data (and would exhaust the decoder's recursion)
_PLAIN_INT = 1 << 63  # larger integers travel as hexadecimal text: JSON readers cap decimal digits


class NotData(ValueError):
    """A value that has no data form (its type's name says what it was), or text that is not one."""


def _plain(x: Any, depth: int) -> Any:
    """``x`` as JSON-ready structures, by the built-in base type's own methods. The type is ``type(x)``,
    never ``isinstance``: an object can claim any ``__class__``."""
    if depth > MAX_DEPTH:
        raise NotData("nested too deep")
    t = type(x)
    if x is None or t is bool:
        return x
    if issubclass(t, int):
        v = int.__index__(x)
        return v if -_PLAIN_INT < v < _PLAIN_INT else {"int": hex(v)}
    if issubclass(t, float):
        return float.__float__(x)
    if issubclass(t, str):
        return str.__str__(x)
    if issubclass(t, complex):
        c = complex.__complex__(x)
        return {"complex": [c.real, c.imag]}
    if issubclass(t, bytes):
        return {"bytes": bytes.hex(x)}
    if issubclass(t, bytearray):
        return {"bytes": bytearray.hex(x)}
    if issubclass(t, list):
        return [_plain(v, depth + 1) for v in list.__iter__(x)]
    if issubclass(t, tuple):
        return {"tuple": [_plain(v, depth + 1) for v in tuple.__iter__(x)]}
    if issubclass(t, frozenset):
        return {"frozenset": [_plain(v, depth + 1) for v in frozenset.__iter__(x)]}
    if issubclass(t, set):
        return {"set": [_plain(v, depth + 1) for v in set.__iter__(x)]}
    if issubclass(t, dict):
        return {"dict": [[_plain(k, depth + 1), _plain(v, depth + 1)] for k, v in dict.items(x)]}
    name = t.__name__
    raise NotData(name if isinstance(name, str) else "object")


def encode(value: Any) -> str:
    """The data form of ``value`` (one line of JSON); ``NotData`` when it has none."""
    try:
        return json.dumps(_plain(value, 0), separators=(",", ":"))
    except NotData:
        raise
    except (RecursionError, TypeError, ValueError) as exc:  # a container changed while it was read
        raise NotData(type(exc).__name__) from None


def _value(x: Any, depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise NotData("nested too deep")
    if x is None or isinstance(x, bool | int | float | str):
        return x
    if isinstance(x, list):
        return [_value(v, depth + 1) for v in x]
    if not isinstance(x, dict) or len(x) != 1:
        raise NotData("an object that is not a tag")
    ((tag, body),) = x.items()
    if tag == "int" and isinstance(body, str) and body.lstrip("-").startswith("0x"):
        return int(body, 16)
    if tag == "bytes" and isinstance(body, str):
        return bytes.fromhex(body)
    if tag == "complex" and isinstance(body, list) and len(body) == 2:
        re_, im = body
        if isinstance(re_, float | int) and isinstance(im, float | int):
            return complex(re_, im)
    if not isinstance(body, list):
        raise NotData(f"a malformed {tag!r} tag")
    items = [_value(v, depth + 1) for v in body]
    if tag == "tuple":
        return tuple(items)
    if tag == "set":
        return set(items)
    if tag == "frozenset":
        return frozenset(items)
    if tag == "dict" and all(isinstance(kv, list) and len(kv) == 2 for kv in items):
        return {k: v for k, v in items}
    raise NotData(f"an unknown tag {tag!r}")


def decode(text: str) -> Any:
    """The value of a data form ``encode`` made; ``NotData`` for any other text (never evaluated)."""
    try:
        return _value(json.loads(text), 0)
    except NotData:
        raise
    except (ValueError, TypeError, RecursionError) as exc:  # bad JSON, unhashable keys, hex, depth
        raise NotData(f"not a value ({type(exc).__name__})") from None
