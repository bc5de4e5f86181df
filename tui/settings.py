"""Chat settings: generation knobs and the keymap, from defaults, ``config.toml`` and the settings screen.

Precedence: built-in defaults < the model's chat defaults (its ``generation_config.json``, reported by
the daemon once it is reached) < the ``[chat]`` table of ``config.toml`` < values saved from the settings
screen (kept in the chat database, see :mod:`tui.store`). ``[keymap]`` maps binding ids (``diffu chat``'s
help screen lists them) to Textual key strings::

    [chat]
    max_new_tokens = 256
    temperature = 0.4
    decoder = "fast"

    [keymap]
    replay = "ctrl+r,f6"
    copy-code = "ctrl+g"

Every value is checked the way the daemon will check it (``SamplingParams``), so a bad setting is an error
that names its key before any request is sent.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from assistant.client.core import SamplingOptions
from assistant.errors import UsageError
from assistant.evals.instructions import unparsed_code
from model_runtime.generation_config import retry_block_problem, retry_request
from model_runtime.params import ALGS, DECODERS, ParamError, SamplingParams


class SettingsError(UsageError):
    """A chat setting is invalid; ``key`` names it."""

    def __init__(self, key: str, message: str, *, where: str = "") -> None:
        super().__init__(f"{where}{key}: {message}")
        self.key = key
        self.message = message


def _knob(default: Any, doc: str) -> Any:
    """A settings field whose help text the settings screen shows next to its input."""
    return dataclasses.field(default=default, metadata={"help": doc})


@dataclass(frozen=True, kw_only=True)
class ChatSettings:
    """The generation knobs ``diffu chat`` sends with every request."""

    max_new_tokens: int = _knob(256, "canvas length: the longest possible answer, in tokens")
    steps: int | None = _knob(None, "denoising steps; empty: one per token (the best quality)")
    temperature: float = _knob(0.4, "0 is greedy; DiffuCoder's README uses 0.4 (Instruct)")
    top_p: float | None = _knob(0.95, "nucleus filtering; empty or 1 switches it off")
    top_k: int | None = _knob(None, "top-k filtering; empty: the reference's implicit 50; 0: off")
    alg: str = _knob("entropy", "which masked positions to commit first")
    alg_temp: float | None = _knob(None, "sample positions at this temperature; empty: most confident")
    decoder: str = _knob("model", "model: what the model recommends; or reference, fast")
    block_length: int = _knob(32, "fast decoder: tokens per block")
    threshold: float = _knob(0.9, "fast decoder: commit positions at least this confident")
    retry_block: int = _knob(0, "unparsable code: decode again in blocks this long; 0: never")

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            _check_type(f.name, getattr(self, f.name))
        try:
            self.sampling_params()
        except ParamError as exc:
            raise SettingsError(exc.field, str(exc).split(": ", 1)[1]) from None
        problem = retry_block_problem(self.retry_block)
        if problem:
            raise SettingsError("retry_block", problem)

    def sampling_params(self) -> SamplingParams:
        """The same knobs as the runtime validates them (raises ParamError naming the field)."""
        return SamplingParams(
            max_new_tokens=self.max_new_tokens,
            steps=self.steps if self.steps is not None else self.max_new_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            alg=self.alg,
            alg_temp=self.alg_temp,
            decoder="reference" if self.decoder == MODEL_DECODER else self.decoder,
            block_length=self.block_length,
            threshold=self.threshold,
        )

    def retry_settings(self) -> ChatSettings | None:
        """The settings of the second decode an answer gets when its python block does not parse
        (``retry_block``; None: never). The fast decoder in blocks of ``retry_block`` on
        the canvas rounded up to whole blocks, steps scaled with it, everything else as it was.

        Why a second decode helps a small model: most of its broken blocks break on the ``def`` line,
        written while the end of the answer is already committed; one long block lets it settle the
        header and the end together (docs/chat.md has the measured effect)."""
        block = self.retry_block
        if not block:
            return None
        return self.replace(**retry_request(self.max_new_tokens, self.steps, block), retry_block=0)

    def retry_for(self, text: str, finish_reason: str | None) -> ChatSettings | None:
        """:meth:`retry_settings` when an answer that ended so (``stop``, or ``length``: cut short) needs
        them: it opens a python block and none of its closed blocks parses. None otherwise (an answer the
        daemon cancelled or ran out of time on is shown as it is)."""
        if finish_reason not in ("stop", "length") or not unparsed_code(text):
            return None
        return self.retry_settings()

    def sampling(self) -> SamplingOptions:
        """The knobs a request sends; unset ones are left to the daemon's defaults."""
        fast_only = self.decoder != "reference"  # the reference decoder ignores the fast decoder's knobs
        return SamplingOptions(
            steps=self.steps,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            alg=self.alg,
            alg_temp=self.alg_temp,
            # "model": the daemon picks the decoder its model recommends.
            decoder=None if self.decoder == MODEL_DECODER else self.decoder,
            block_length=self.block_length if fast_only else None,
            threshold=self.threshold if fast_only else None,
        )

    def request_params(self) -> dict[str, Any]:
        """The fields of a ``/v1/diffu/generate`` body these settings make (what a request carries)."""
        return {"max_new_tokens": self.max_new_tokens, **self.sampling().body()}

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> ChatSettings:
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_mapping(
        cls, data: Mapping[str, Any], *, base: ChatSettings | None = None, where: str = ""
    ) -> ChatSettings:
        """``base`` with the keys of ``data`` applied; an unknown key or bad value names itself."""
        base = base or cls()
        unknown = sorted(set(data) - set(FIELDS))
        if unknown:
            raise SettingsError(unknown[0], f"unknown setting (known: {', '.join(FIELDS)})", where=where)
        try:
            return base.replace(**dict(data))
        except SettingsError as exc:
            raise SettingsError(exc.key, exc.message, where=where) from None


def apply_saved(baseline: ChatSettings, saved: Mapping[str, Any]) -> tuple[ChatSettings, str]:
    """``baseline`` with the settings screen's saved values; a bad saved set is ignored and explained."""
    try:
        return ChatSettings.from_mapping(saved, base=baseline), ""
    except SettingsError as exc:
        # Saved by another diffu version, say: the baseline still works, and the user is told.
        return baseline, f"ignored the saved chat settings ({exc}); open Settings (f2) to fix them"


FIELDS: dict[str, dataclasses.Field[Any]] = {f.name: f for f in dataclasses.fields(ChatSettings)}
# "model": no decoder in the request; the daemon uses its model's (Runtime.default_decoder).
MODEL_DECODER = "model"
CHOICES: dict[str, tuple[str, ...]] = {"alg": ALGS, "decoder": (MODEL_DECODER, *DECODERS)}


def field_kind(name: str) -> tuple[str, bool]:
    """(base type, optional) of a field, from its annotation: ``("int", True)`` for ``int | None``."""
    annotation = str(FIELDS[name].type)
    return annotation.replace(" | None", ""), annotation.endswith("| None")


def _check_type(name: str, value: Any) -> None:
    base, optional = field_kind(name)
    if value is None:
        if not optional:
            raise SettingsError(name, "must be set")
        return
    ok = {
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, int | float) and not isinstance(value, bool),
        "str": isinstance(value, str),
    }[base]
    if not ok:
        expected = {"int": "an integer", "float": "a number", "str": "a string"}[base]
        raise SettingsError(name, f"must be {expected}, got {value!r}")
    if name in CHOICES and value not in CHOICES[name]:
        raise SettingsError(name, f"must be one of {', '.join(CHOICES[name])}; got {value!r}")


def parse_field(name: str, text: str) -> Any:
    """A value typed into the settings screen, converted to the field's type (empty: unset)."""
    base, optional = field_kind(name)
    text = text.strip()
    if not text:
        if optional:
            return None
        raise SettingsError(name, "must be set")
    if base == "int":
        try:
            return int(text)
        except ValueError:
            raise SettingsError(name, f"must be an integer, got {text!r}") from None
    if base == "float":
        try:
            return float(text)
        except ValueError:
            raise SettingsError(name, f"must be a number, got {text!r}") from None
    return text


def format_field(value: Any) -> str:
    """The text a settings-screen input shows for ``value`` (empty for unset)."""
    return "" if value is None else str(value)


# -- the config file ----------------------------------------------------------------------------------
# Textual key names: letters, digits, underscores, "+" between modifiers; comma-separated alternatives.
_KEYS = re.compile(r"^[A-Za-z0-9_]+(\+[A-Za-z0-9_]+)*(,[A-Za-z0-9_]+(\+[A-Za-z0-9_]+)*)*$")


@dataclass(frozen=True)
class ChatConfig:
    """What ``config.toml`` says about the chat: settings (before screen overrides) and the keymap."""

    settings: ChatSettings = dataclasses.field(default_factory=ChatSettings)
    keymap: dict[str, str] = dataclasses.field(default_factory=dict)
    table: dict[str, Any] = dataclasses.field(default_factory=dict)  # [chat] as written

    def for_model(self, model_defaults: Mapping[str, Any]) -> tuple[ChatSettings, str]:
        """The baseline with a model: built-in < the model's chat defaults < ``[chat]``; plus a problem
        to show when the model's defaults cannot be taken (they are then left out)."""
        defaults = {k: v for k, v in model_defaults.items() if k in FIELDS and k != "decoder"}
        if "max_new_tokens" in self.table and "steps" not in self.table:
            defaults.pop("steps", None)  # the model's steps go with its canvas, not with the user's
        try:
            return ChatSettings.from_mapping(self.table, base=ChatSettings.from_mapping(defaults)), ""
        except SettingsError as exc:
            return self.settings, f"ignored the model's chat defaults ({exc})"


def read_chat_config(path: Path, binding_ids: Mapping[str, str]) -> ChatConfig:
    """The ``[chat]`` and ``[keymap]`` tables of ``path`` (absent file or tables: defaults).

    ``binding_ids`` maps each configurable binding id to its description; an unknown id is an error that
    lists the known ones, so a typo does not silently leave a key unbound.
    """
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return ChatConfig()
    except OSError as exc:
        raise SettingsError("config.toml", f"cannot read it: {exc}", where=f"{path}: ") from None
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError("config.toml", f"invalid TOML: {exc}", where=f"{path}: ") from None
    chat = data.get("chat", {})
    if not isinstance(chat, dict):
        raise SettingsError("chat", "must be a table ([chat])", where=f"{path}: ")
    settings = ChatSettings.from_mapping(chat, where=f"{path}: [chat] ")
    keymap = parse_keymap(data.get("keymap", {}), binding_ids, where=f"{path}: ")
    return ChatConfig(settings, keymap, dict(chat))


def parse_keymap(table: Any, binding_ids: Mapping[str, str], *, where: str = "") -> dict[str, str]:
    """A ``[keymap]`` table checked against the known binding ids and key syntax."""
    if not isinstance(table, dict):
        raise SettingsError("keymap", "must be a table ([keymap])", where=where)
    keymap = {}
    for binding_id, keys in table.items():
        if binding_id not in binding_ids:
            raise SettingsError(
                f"[keymap] {binding_id}", f"unknown binding id (known: {', '.join(binding_ids)})", where=where
            )
        if not isinstance(keys, str) or not _KEYS.match(keys.replace(" ", "")):
            raise SettingsError(
                f"[keymap] {binding_id}",
                f'expected a key string such as "ctrl+r" or "f6,ctrl+r", got {keys!r}',
                where=where,
            )
        keymap[binding_id] = keys.replace(" ", "")
    return keymap
