"""Reading a JSON request body and its fields, with errors that name the field: the bottom layer of the
daemon's request parsing (``assistant/server/protocol.py`` builds the three API dialects on it).

:class:`RequestError` carries the HTTP status and an OpenAI-style error body, so bad input gets a 4xx
and changes nothing else.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from assistant.wire import ErrorType, error_body


class RequestError(Exception):
    """A request that cannot be served as sent; rendered as an OpenAI-style error object.

    ``details`` holds the facts of the message as fields (``prompt_tokens``, ``context_length``, ...);
    the body carries them as ``error.details`` when there are any.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        param: str | None = None,
        kind: str = ErrorType.INVALID_REQUEST,
        code: str | None = None,
        details: dict[str, object] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.param = param
        self.kind = kind
        self.code = code
        self.details = dict(details or {})

    def to_dict(self) -> dict[str, Any]:
        return error_body(str(self), self.kind, param=self.param, code=self.code, details=self.details)


def parse_json(body: bytes) -> dict[str, Any]:
    """The request body as a JSON object, or a 400 saying why not."""
    if not body.strip():
        raise RequestError("the request body is empty; send a JSON object")
    try:
        text = body.decode("utf-8-sig")  # JSON bodies are UTF-8 (RFC 8259); tolerate a BOM
    except UnicodeDecodeError:
        raise RequestError("the request body is not UTF-8 text") from None
    try:
        data = json.loads(text, parse_int=_parse_int)
    except json.JSONDecodeError as exc:
        raise RequestError(f"malformed JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise RequestError("malformed JSON: nested too deeply") from None
    if not isinstance(data, dict):
        raise RequestError(f"the request body must be a JSON object, got {type_name(data)}")
    _check_text(data, "")
    return data


MAX_INT_DIGITS = 40


def _parse_int(digits: str) -> int:
    # No field takes a number this long, and Python refuses to parse one of more than 4,300 digits
    # with a ValueError the JSON decoder does not turn into a decode error.
    if len(digits.lstrip("-")) > MAX_INT_DIGITS:
        raise RequestError(f"malformed JSON: an integer of {len(digits)} digits (at most {MAX_INT_DIGITS})")
    return int(digits)


def _check_text(value: Any, where: str) -> None:
    """Refuse lone UTF-16 surrogates (``"\\ud800"``): valid JSON escapes, but no text the tokenizer can
    encode. The error names the field."""
    if isinstance(value, str):
        if _SURROGATE.search(value):
            raise RequestError(
                f"{where or 'body'}: holds a lone UTF-16 surrogate, which is not text",
                param=where.split("[", 1)[0].split(".", 1)[0] or None,
            )
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_text(key, f"{where}.{key}" if where else "a key")
            _check_text(item, f"{where}.{key}" if where else str(key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_text(item, f"{where}[{i}]")


_SURROGATE = re.compile("[\ud800-\udfff]")


# -- field readers ------------------------------------------------------------------------------------
def type_name(value: Any) -> str:
    """How an error message names a JSON value's type."""
    return {
        dict: "an object",
        list: "an array",
        str: "a string",
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        type(None): "null",
    }.get(type(value), type(value).__name__)


def bad_field(name: str, expected: str, value: Any) -> RequestError:
    """``name: expected X, got Y``, showing a short value itself and a long one by its type."""
    short = isinstance(value, str | int | float | bool) and len(repr(value)) < 60
    shown = repr(value) if short else type_name(value)
    return RequestError(f"{name}: expected {expected}, got {shown}", param=name)


def get_int(
    data: dict[str, Any],
    name: str,
    default: int | None = None,
    *,
    lo: int | None = None,
    hi: int | None = None,
) -> int | None:
    value = data.get(name)
    if value is None:
        return default
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise bad_field(name, "an integer", value)
    if lo is not None and value < lo:
        raise RequestError(f"{name}: must be >= {lo}, got {value}", param=name)
    if hi is not None and value > hi:
        raise RequestError(f"{name}: must be <= {hi}, got {value}", param=name)
    return value


def get_float(
    data: dict[str, Any],
    name: str,
    default: float | None = None,
    *,
    lo: float | None = None,
    hi: float | None = None,
) -> float | None:
    value = data.get(name)
    if value is None:
        return default
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        raise bad_field(name, "a finite number", value)
    if lo is not None and value < lo:
        raise RequestError(f"{name}: must be >= {lo}, got {value}", param=name)
    if hi is not None and value > hi:
        raise RequestError(f"{name}: must be <= {hi}, got {value}", param=name)
    return float(value)


def get_bool(data: dict[str, Any], name: str, default: bool) -> bool:
    value = data.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad_field(name, "true or false", value)
    return value


def get_str(
    data: dict[str, Any],
    name: str,
    default: str | None = None,
    *,
    required: bool = False,
    max_len: int | None = None,
) -> str | None:
    value = data.get(name)
    if value is None:
        if required:
            raise RequestError(f"{name}: required", param=name)
        return default
    if not isinstance(value, str):
        raise bad_field(name, "a string", value)
    if max_len is not None and len(value) > max_len:
        raise RequestError(f"{name}: at most {max_len} characters, got {len(value)}", param=name)
    return value


def reject_unknown(data: dict[str, Any], known: set[str], where: str) -> None:
    unknown = sorted(set(data) - known)
    if unknown:
        raise RequestError(
            f"{unknown[0]}: unknown field for {where} (known: {', '.join(sorted(known))})", param=unknown[0]
        )
