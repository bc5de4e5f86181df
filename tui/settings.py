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

Every value is checked the way the daemon will check it (by ``SamplingParams``' declaration), so a bad
setting is an error that names its key before any request is sent.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from assistant.code_blocks import unparsed_code
from assistant.errors import UsageError
from assistant.wire import SamplingOptions
from model_runtime.generation_config import retry_block_problem, retry_request
from model_runtime.options import Flat, Option, OptionError, like, option, options, validate
from model_runtime.params import DECODERS, ParamError, SamplingParams, decoder_knobs


class SettingsError(UsageError):
    """A chat setting is invalid; ``key`` names it."""

    def __init__(self, key: str, message: str, *, where: str = "") -> None:
        super().__init__(f"{where}{key}: {message}")
        self.key = key
        self.message = message


# "model": no decoder in the request; the daemon uses its model's (Runtime.default_decoder).
MODEL_DECODER = "model"


def requested_decoder(choice: str) -> str | None:
    """The decoder a request names for the chat's ``decoder`` setting: none for "model" (the daemon picks
    its model's), else the one chosen."""
    return None if choice == MODEL_DECODER else choice


def decoder_knobs_of(choice: str) -> frozenset[str]:
    """The sampling options the decoder of a ``decoder`` setting reads beyond the common ones; for
    "model", every decoder's (the daemon may pick any)."""
    return decoder_knobs(requested_decoder(choice))


@dataclass(frozen=True, kw_only=True)
class ChatSettings:
    """The generation knobs ``diffu chat`` sends with every request: ``SamplingParams``' options (their
    bounds and choices) with the chat's defaults, and help worded for the settings screen."""

    max_new_tokens: int = like(
        SamplingParams,
        "max_new_tokens",
        default=256,
        help="canvas length: the longest possible answer, in tokens",
    )
    steps: int | None = like(
        SamplingParams, "steps", default=None, help="denoising steps; empty: one per token (the best quality)"
    )
    temperature: float = like(
        SamplingParams,
        "temperature",
        default=0.4,
        help="0 is greedy; DiffuCoder's README uses 0.4 (Instruct)",
    )
    top_p: float | None = like(
        SamplingParams, "top_p", default=0.95, help="nucleus filtering; empty or 1 switches it off"
    )
    top_k: int | None = like(
        SamplingParams, "top_k", help="top-k filtering; empty: the reference's implicit 50; 0: off"
    )
    alg: str = like(SamplingParams, "alg")
    alg_temp: float | None = like(
        SamplingParams, "alg_temp", help="sample positions at this temperature; empty: most confident"
    )
    decoder: str = like(
        SamplingParams,
        "decoder",
        default=MODEL_DECODER,
        choices=(MODEL_DECODER, *DECODERS),
        help="model: what the model recommends; or reference, fast, sliding",
    )
    block_length: int = like(SamplingParams, "block_length")
    threshold: float = like(SamplingParams, "threshold")
    retry_block: int = option(
        0, rule=retry_block_problem, help="unparsable code: decode again in blocks this long; 0: never"
    )
    # The other sampling knobs (eps, seed, factor, and any the runtime gains), under their own names (see
    # VIEW): a row each on the settings screen and a key in [chat]; unset, the daemon's default.
    sampling: SamplingOptions = dataclasses.field(default_factory=SamplingOptions)

    def __post_init__(self) -> None:
        validate(self, SettingsError)
        try:  # what SamplingParams checks across its fields, if anything
            self.sampling_params()
        except ParamError as exc:
            raise SettingsError(exc.field, exc.problem) from None

    def sampling_params(self) -> SamplingParams:
        """The same knobs as the runtime validates them (raises ParamError naming the field)."""
        return SamplingParams(
            **{k: v for k, v in self.sampling.body().items() if k not in OWN},
            max_new_tokens=self.max_new_tokens,
            steps=self.steps if self.steps is not None else self.max_new_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            alg=self.alg,
            alg_temp=self.alg_temp,
            # "model" is checked as the reference decoder: the daemon's choice is not known here.
            decoder=requested_decoder(self.decoder) or "reference",
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

    def request_sampling(self) -> SamplingOptions:
        """The knobs a request sends; unset ones are left to the daemon's defaults."""
        reads = decoder_knobs_of(self.decoder)  # a knob the decoder ignores is left unset
        return dataclasses.replace(
            self.sampling,
            steps=self.steps,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            alg=self.alg,
            alg_temp=self.alg_temp,
            # "model": the daemon picks the decoder its model recommends.
            decoder=requested_decoder(self.decoder),
            block_length=self.block_length if "block_length" in reads else None,
            threshold=self.threshold if "threshold" in reads else None,
        )

    def request_params(self) -> dict[str, Any]:
        """The fields of a ``/v1/diffu/generate`` body these settings make (what a request carries)."""
        return {"max_new_tokens": self.max_new_tokens, **self.request_sampling().body()}

    def to_dict(self) -> dict[str, Any]:
        """Every setting by name (the nested sampling knobs under their own): what the screen saves."""
        return VIEW.values(self)

    def get(self, name: str) -> Any:
        """The setting ``name``, the chat's own or a nested sampling knob."""
        return VIEW.get(self, name)

    def replace(self, **changes: Any) -> ChatSettings:
        """These settings with ``changes`` by setting name (``seed`` changes ``sampling``)."""
        return VIEW.replace(self, changes)

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


OWN = options(ChatSettings)  # the knobs the chat declares itself
VIEW = Flat(ChatSettings, "sampling")
FIELDS: Mapping[str, Option] = VIEW.options


def parse_field(name: str, text: str) -> Any:
    """A value typed into the settings screen, read as its option reads text (empty: unset)."""
    try:
        return FIELDS[name].read(text, text=True)
    except OptionError as exc:
        raise SettingsError(name, exc.problem) from None


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
        defaults = {k: v for k, v in model_defaults.items() if k in FIELDS}
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
