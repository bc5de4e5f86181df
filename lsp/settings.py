"""The language server's settings: one frozen dataclass, read from camelCase JSON.

Settings arrive from ``initializationOptions`` and later from ``workspace/didChangeConfiguration`` (or a
``workspace/configuration`` pull). Editors send partial objects, stale keys and the odd wrong type, so
:func:`parse_settings` applies every key it can, keeps the previous value of a key it cannot, and returns
one message per problem naming the key: the server logs them and keeps serving.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

SECTION = "diffu"  # the settings section in VS Code and in Neovim's ``settings`` table


@dataclass(frozen=True, kw_only=True)
class Settings:
    """What the user can change; every field has a camelCase JSON key (``debounce_ms`` -> ``debounceMs``)."""

    enable: bool = True
    """Answer completion requests at all (fill-holes stays available as an explicit command)."""
    languages: tuple[str, ...] = ()
    """Language ids to complete in (``python``, ``rust``...); empty means every language."""
    debounce_ms: int = 150
    """Wait this long for more keystrokes before asking the model; manual (Invoked) requests skip it."""
    max_tokens: int = 64
    """Canvas size for a block; a single line gets at most 24 tokens and an empty line at most 32."""
    steps: int | None = None
    """Denoising steps; unset: half the canvas for automatic requests, the whole canvas when invoked."""
    temperature: float = 0.0
    context_tokens: int = 1024
    """Token budget of the prompt: the file window around the cursor plus snippets of other files."""
    prefix_fraction: float = 0.75
    """Share of the file budget that goes before the cursor (the rest after it)."""
    snippet_tokens: int = 256
    """Part of the budget kept for snippets of other open documents when the file does not fit."""
    current_file_only: bool = False
    """Never send text of other open documents."""
    min_chars: int = 1
    """Drop suggestions shorter than this (after stripping whitespace). 1 keeps short right answers
    (``1``, ``)``, ``self``): a diffusion model's canvas is sized before it runs, so a short answer is the
    model choosing end-of-text early, not a truncated guess."""
    max_line_suffix: int = 8
    """While typing, ask nothing when more than this many characters (besides spaces and closing
    brackets, quotes and punctuation) follow the cursor on its line: mid-line edits rarely want
    suggestions (llama.vim's rule). Explicit (invoked) requests always ask."""
    candidates: int = 3
    """Suggestions to offer on an explicit (invoked) request, to cycle through; automatic ones offer one."""
    hole_marker: str = "???"
    """Marks a hole for fill-holes besides ``<|mask|>``; empty: only ``<|mask|>``."""
    hole_tokens: int = 16
    """Canvas tokens per marker hole (a run of N ``<|mask|>`` is a hole of exactly N tokens)."""
    max_seconds: float | None = None
    """Time budget per request in the daemon; when spent it answers with what is unmasked so far."""
    snooze_minutes: float = 5.0
    """How long ``diffu.snooze`` pauses suggestions while typing when it is given no duration."""
    url: str | None = None
    """Daemon URL; unset: ``DIFFU_URL``, then the discovery file, then auto-start."""
    api_key: str | None = None
    model: str | None = None
    """Checkpoint to auto-start a daemon with when none is running (else the diffu config's model)."""
    autostart: bool | None = None
    """Start a daemon when none is running; unset: the diffu config's ``autostart``."""

    def replace(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[camel(f.name)] = list(value) if isinstance(value, tuple) else value
        return out


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


FIELDS = {f.name: f for f in dataclasses.fields(Settings)}
KEYS = {camel(name): name for name in FIELDS}
# Keys an editor keeps in the same ``diffu`` section for its own use (VS Code's extension starts the server
# with ``serverCommand``; vscode-languageclient reads ``trace.server``): silently not ours.
CLIENT_KEYS = frozenset({"serverCommand", "trace"})
# Keys other clients or older versions of this server use; accepted so a user's config keeps working.
ALIASES = {
    "daemonUrl": "url",
    "debounce": "debounce_ms",
    "maxNewTokens": "max_tokens",
    "contextBudget": "context_tokens",
    "currentFileOnly": "current_file_only",
}

_RANGES: dict[str, tuple[float | None, float | None]] = {
    "debounce_ms": (0, 10_000),
    "max_tokens": (1, 1024),
    "steps": (1, 1024),
    "temperature": (0.0, 10.0),
    "context_tokens": (16, 131_072),
    "prefix_fraction": (0.0, 1.0),
    "snippet_tokens": (0, 131_072),
    "min_chars": (0, 1000),
    "max_line_suffix": (0, 10_000),
    "candidates": (1, 8),
    "hole_tokens": (1, 1024),
    "max_seconds": (0.001, 3600.0),
    "snooze_minutes": (0.1, 1440.0),
}


def _check(name: str, value: Any) -> Any:
    """The value converted to the field's type, or ValueError with a message for the user."""
    kind = str(FIELDS[name].type).replace(" | None", "")
    optional = "None" in str(FIELDS[name].type)
    if value is None:
        if optional:
            return None
        raise ValueError("must not be null")
    if kind == "bool":
        if not isinstance(value, bool):
            raise ValueError(f"expected true or false, got {value!r}")
        return value
    if kind in ("int", "float"):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"expected a number, got {value!r}")
        if kind == "int":
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(f"expected an integer, got {value!r}")
            value = int(value)
        else:
            value = float(value)
        lo, hi = _RANGES.get(name, (None, None))
        if lo is not None and value < lo or hi is not None and value > hi:
            raise ValueError(f"must be in {lo}..{hi}, got {value}")
        return value
    if kind == "str":
        if not isinstance(value, str):
            raise ValueError(f"expected a string, got {value!r}")
        if name == "url" and value and not value.startswith(("http://", "https://")):
            raise ValueError(f"must start with http:// or https://, got {value!r}")
        if name == "hole_marker" and value.strip() != value:
            raise ValueError("must not start or end with whitespace")
        return value or (None if optional else value)
    if kind == "tuple[str, ...]":
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"expected a list of strings, got {value!r}")
        return tuple(value)
    raise AssertionError(f"no parser for {name}: {kind}")


def parse_settings(data: Any, base: Settings | None = None) -> tuple[Settings, list[str]]:
    """Apply a (partial) settings object over ``base``; returns the result and one message per problem.

    The object may be the section itself or wrap it as ``{"diffu": {...}}`` (VS Code's
    ``synchronize.configurationSection`` and Neovim's ``settings`` table both send it that way).
    """
    base = base or Settings()
    if data is None:
        return base, []
    if not isinstance(data, dict):
        return base, [f"settings: expected an object, got {type(data).__name__}"]
    if isinstance(data.get(SECTION), dict):
        data = data[SECTION]
    changes: dict[str, Any] = {}
    problems: list[str] = []
    for key, value in data.items():
        if key in CLIENT_KEYS:
            continue
        name = KEYS.get(key) or ALIASES.get(key) or (key if key in FIELDS else None)
        if name is None and _snake(key) in FIELDS:
            name = _snake(key)
        if name is None:
            problems.append(f"{key}: unknown setting (known: {', '.join(sorted(KEYS))})")
            continue
        try:
            changes[name] = _check(name, value)
        except ValueError as exc:
            problems.append(f"{camel(name)}: {exc}; keeping {getattr(base, name)!r}")
    return base.replace(**changes), problems


def settings_section(data: Any) -> Any:
    """The diffu section of a didChangeConfiguration payload, or None when it carries none."""
    if isinstance(data, dict) and SECTION in data:
        return data[SECTION]
    if isinstance(data, dict) and any(k in KEYS or k in ALIASES for k in data):
        return data
    return None
