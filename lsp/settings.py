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

from assistant.config import Config
from assistant.infill.holes import FillOptions
from assistant.wire import SamplingOptions
from model_runtime.options import Flat, OptionError, like, option, validate
from model_runtime.params import SamplingParams

SECTION = "diffu"  # the settings section in VS Code and in Neovim's ``settings`` table


@dataclass(frozen=True, kw_only=True)
class Settings:
    """What the user can change; every option has a camelCase JSON key (``debounce_ms`` -> ``debounceMs``).

    Each is an option (``model_runtime.options``). The sampling knobs the server gives a meaning of its
    own (the canvas, the steps, the greedy temperature) are ``SamplingParams``' options with the editors'
    defaults and narrower bounds; the others (``alg``, ``topP``, ``decoder``, ...) are ``sampling``'s,
    read under their own names (see :data:`VIEW`) and sent with every request as they are: unset, the
    daemon's. Either way they are checked as the daemon checks them.
    """

    enable: bool = option(
        True, help="Answer completion requests at all (fill-holes stays available as an explicit command)."
    )
    languages: tuple[str, ...] = option(
        (), help="Language ids to complete in (``python``, ``rust``...); empty means every language."
    )
    debounce_ms: int = option(
        150,
        ge=0,
        le=10_000,
        help="Wait this long for more keystrokes before asking the model; manual (Invoked) requests skip it.",
    )
    max_tokens: int = like(
        SamplingParams,
        "max_new_tokens",
        default=64,
        le=1024,
        help="Canvas size for a block; a single line gets at most 24 tokens and an empty line at most 32.",
    )
    steps: int | None = like(
        SamplingParams,
        "steps",
        default=None,
        le=1024,
        help="Denoising steps; unset: half the canvas for automatic requests, the whole canvas when invoked.",
    )
    temperature: float = like(SamplingParams, "temperature", default=0.0, le=10.0)
    context_tokens: int | None = option(
        None,
        ge=16,
        le=131_072,
        help="Token budget of the prompt: the file window around the cursor plus snippets of other files; "
        "unset: 1024, within the row the daemon's model recommends for editors (the bundled model: 512 "
        "tokens with the canvas).",
    )
    prefix_fraction: float = option(
        0.75, ge=0.0, le=1.0, help="Share of the file budget that goes before the cursor (the rest after it)."
    )
    snippet_tokens: int = option(
        256,
        ge=0,
        le=131_072,
        help="Part of the budget kept for snippets of other open documents when the file does not fit.",
    )
    current_file_only: bool = option(False, help="Never send text of other open documents.")
    # 1 keeps short right answers (``1``, ``)``, ``self``): a diffusion model's canvas is sized before it
    # runs, so a short answer is the model choosing end-of-text early, not a truncated guess.
    min_chars: int = option(
        1, ge=0, le=1000, help="Drop suggestions shorter than this (after stripping whitespace)."
    )
    max_line_suffix: int = option(
        8,
        ge=0,
        le=10_000,
        help="While typing, ask nothing when more than this many characters (besides spaces and closing "
        "brackets, quotes and punctuation) follow the cursor on its line: mid-line edits rarely want "
        "suggestions (llama.vim's rule). Explicit (invoked) requests always ask.",
    )
    candidates: int = option(
        3,
        ge=1,
        le=8,
        help="Suggestions to offer on an explicit (invoked) request, to cycle through; automatic ones "
        "offer one.",
    )
    hole_marker: str = like(FillOptions, "hole_marker")
    hole_tokens: int = like(FillOptions, "hole_tokens")
    max_seconds: float | None = option(
        None,
        ge=0.001,
        le=3600.0,
        help="Time budget per request in the daemon; when spent it answers with what is unmasked so far.",
    )
    snooze_minutes: float = option(
        5.0,
        ge=0.1,
        le=1440.0,
        help="How long ``diffu.snooze`` pauses suggestions while typing when it is given no duration.",
    )
    # The daemon's address and start-up, as diffu's config declares them (and checks them).
    url: str | None = like(
        Config, "url", help="Daemon URL; unset: ``DIFFU_URL``, then the discovery file, then auto-start."
    )
    api_key: str | None = like(
        Config,
        "api_key",
        help="Daemon API key; unset: ``DIFFU_API_KEY`` or the token file in diffu's config directory.",
    )
    model: str | None = like(
        Config,
        "model",
        help="Checkpoint to auto-start a daemon with when none is running (else the diffu config's model).",
    )
    autostart: bool | None = like(
        Config,
        "autostart",
        default=None,
        help="Start a daemon when none is running; unset: the diffu config's ``autostart``.",
    )

    sampling: SamplingOptions = dataclasses.field(default_factory=SamplingOptions)

    def __post_init__(self) -> None:
        validate(self)

    def request_sampling(
        self, steps: int, *, temperature: float | None = None, seed: int | None = None
    ) -> SamplingOptions:
        """The sampling of a request: the user's knobs with the request's ``steps``, the settings'
        temperature (or a candidate's), and a candidate's ``seed`` (else the user's, if set)."""
        return dataclasses.replace(
            self.sampling,
            steps=steps,
            temperature=self.temperature if temperature is None else temperature,
            seed=self.sampling.seed if seed is None else seed,
        )

    def fingerprint(self) -> str:
        """The settings that shape an answer (:data:`ANSWER_SHAPING`), as one key: the server drops its
        cached suggestions when it changes, and a suggestion is only reused under the same."""
        return repr(tuple(getattr(self, name) for name in ANSWER_SHAPING))

    def replace(self, **changes: Any) -> Settings:
        """These settings with ``changes`` by option name (``top_p`` changes ``sampling``)."""
        return VIEW.replace(self, changes)

    def to_json(self) -> dict[str, Any]:
        return {camel(k): list(v) if isinstance(v, tuple) else v for k, v in VIEW.values(self).items()}


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


# The prompt's budget where the user sets none; the daemon's warm-up plans with the same
# (assistant.server.warmup.EDITOR).
DEFAULT_CONTEXT_TOKENS = 1024


def context_budget(settings: Settings) -> int:
    """The prompt's token budget: the user's ``contextTokens``, else :data:`DEFAULT_CONTEXT_TOKENS`."""
    return settings.context_tokens or DEFAULT_CONTEXT_TOKENS


def row_limit(settings: Settings, max_context: int | None, recommended: int | None) -> int | None:
    """The longest row (prompt and canvas) a suggestion takes: the model's context, or the shorter row the
    daemon's model recommends for editors (``editor_context`` in /v1/models: where more context buys no
    quality, a shorter row is a faster forward) when the user sets no ``contextTokens``."""
    if settings.context_tokens is not None or recommended is None:
        return max_context
    return recommended if max_context is None else min(max_context, recommended)


VIEW = Flat(Settings, "sampling")
FIELDS = VIEW.options
# The settings that change what a suggestion would be: where it is asked (url, model), the canvas and
# its sampling, the prompt built around the cursor and the cleaning after. The rest decide whether or
# when to ask, how many candidates an explicit request offers, or concern fill-holes.
ANSWER_SHAPING = (
    "max_tokens",
    "steps",
    "temperature",
    "context_tokens",
    "prefix_fraction",
    "snippet_tokens",
    "current_file_only",
    "min_chars",
    "url",
    "model",
    "sampling",
)
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


_JSON_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string", tuple: "array"}


def editor_schema() -> dict[str, dict[str, Any]]:
    """Each setting's facts as an editor's settings UI declares them (VS Code's ``package.json``
    ``contributes.configuration``, in JSON schema): type, default, bounds and choices, by key with the
    section (``diffu.debounceMs``). An unset string is "" there (what an empty field in the UI sends)."""
    out: dict[str, dict[str, Any]] = {}
    for name, opt in FIELDS.items():
        kind = _JSON_TYPES[opt.kind]
        text = opt.kind is str
        facts: dict[str, Any] = {"type": [kind, "null"] if opt.optional and not text else kind}
        if opt.kind is tuple:
            facts["items"] = {"type": _JSON_TYPES[opt.base]}
        default = opt.default
        facts["default"] = "" if default is None and text else list(default) if opt.kind is tuple else default
        bounds = (
            ("minimum", opt.ge),
            ("exclusiveMinimum", opt.gt),
            ("maximum", opt.le),
            ("exclusiveMaximum", opt.lt),
        )
        facts.update({key: bound for key, bound in bounds if bound is not None})
        if opt.choices is not None:
            unset = ("" if text else None,) if opt.optional else ()
            facts["enum"] = [*unset, *opt.choices]
        out[f"{SECTION}.{camel(name)}"] = facts
    return out


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
            changes[name] = FIELDS[name].read(value, json=True)
        except OptionError as exc:
            problems.append(f"{camel(name)}: {exc.problem}; keeping {VIEW.get(base, name)!r}")
    return base.replace(**changes), problems


def settings_section(data: Any) -> Any:
    """The diffu section of a didChangeConfiguration payload, or None when it carries none."""
    if isinstance(data, dict) and SECTION in data:
        return data[SECTION]
    if isinstance(data, dict) and any(k in KEYS or k in ALIASES for k in data):
        return data
    return None
