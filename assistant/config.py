"""diffu's configuration: defaults < ``config.toml`` < ``DIFFU_*`` environment variables < command-line flags.

Everything is parsed once into the frozen :class:`Config`; a bad value raises :class:`ConfigError` naming
the key and where it came from (``config.toml: port: ...``, ``DIFFU_PORT: ...``, ``--port: ...``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from assistant import paths
from assistant.errors import UsageError
from model_runtime.options import OptionError, option, options, validate
from model_runtime.params import DEFAULT_MAX_PROGRAMS

DEFAULT_PORT = 8012  # llama.cpp's llama-server default, so llama.vim / llama.vscode work unconfigured
ENV_PREFIX = "DIFFU_"
LOG_LEVELS = ("debug", "info", "warning", "error")


class ConfigError(UsageError):
    """A configuration value is invalid; ``key`` names it and ``source`` says where it was set."""

    def __init__(self, key: str, source: str, message: str) -> None:
        where = key if source in ("default", "flag") else f"{source}: {key}"
        if source == "flag":
            where = "--" + key.replace("_", "-")
        super().__init__(f"{where}: {message}")
        self.key = key
        self.source = source
        self.problem = message


def http_url(value: str) -> str:
    """The rule of a daemon URL option (the config's, the editors')."""
    if value.startswith(("http://", "https://")):
        return ""
    return f"must start with http:// or https://, got {value!r}"


def _api_key(value: str) -> str:
    ok = bool(value.strip()) and value.isprintable() and " " not in value
    return "" if ok else "must be a non-empty string without spaces"


def _buckets(values: tuple[int, ...]) -> str:
    ok = bool(values) and all(v >= 1 for v in values)
    return "" if ok else f"must be a non-empty list of integers >= 1, got {list(values)}"


def _quantize(value: str) -> str:
    return "" if value in ("int8", "int4") else f"expected one of int8, int4; got {value!r}"


def _host(value: str) -> str:
    return "" if value else "must not be empty"


@dataclass(frozen=True, kw_only=True)
class Config:
    """The effective settings of the daemon and its clients: each an option (``model_runtime.options``)
    with its type, default, bounds and help, read alike from config.toml, ``DIFFU_*`` and flags."""

    model: str | None = option(
        None, help="checkpoint directory or hub id the daemon serves (fake: runs the JAX-free test backend)"
    )
    dtype: str | None = option(
        None, help="parameter dtype (bfloat16, float32, ...); unset lets the runtime choose"
    )
    quantize: str | None = option(
        None,
        rule=_quantize,
        help="weight-only quantization at load: int8 or int4 (see model_runtime/quant.py); unset: off",
    )
    host: str = option(
        "127.0.0.1",
        rule=_host,
        help="bind address; anything but loopback exposes the model to the network (and is logged as a "
        "warning)",
    )
    port: int = option(DEFAULT_PORT, ge=0, le=65535, help="TCP port; 0 picks a free one")
    api_key: str | None = option(
        None,
        rule=_api_key,
        help="Bearer token; unset uses (and on first start creates) the token file in the config directory",
    )
    auth: bool = option(True, help="false switches authentication off: any key, or none, is accepted")
    url: str | None = option(
        None, rule=http_url, help="clients only: talk to this daemon instead of looking for one"
    )
    autostart: bool = option(True, help="clients only: start a background daemon when none is running")
    stop_daemon_with_chat: bool = option(
        False,
        help="diffu chat stops the daemon it started when it quits; by default the daemon stays, keeping "
        "the model loaded and its programs compiled for the next chat, diffu generate, eval and editors",
    )
    allowed_hosts: tuple[str, ...] = option(
        (), help="extra Host-header names accepted on a loopback bind (the DNS-rebinding allowlist)"
    )
    cors_origins: tuple[str, ...] = option(
        (), help="extra browser origins allowed besides http(s)://localhost, 127.0.0.1 and [::1] on any port"
    )
    queue_size: int = option(
        64, ge=1, help="requests waiting for the engine before new ones get 503 + Retry-After"
    )
    max_batch: int = option(
        16,
        ge=1,
        help="most requests run together in one canvas batch (the runtime's buckets may allow fewer)",
    )
    max_body_bytes: int = option(4 * 1024 * 1024, ge=1024, help="request bodies larger than this get 413")
    max_steps: int = option(1024, ge=1, help="largest steps a request may ask for")
    max_seconds: float = option(
        300.0,
        gt=0,
        help="time budget of one generation; past it the request ends with what is unmasked so far",
    )
    default_max_tokens: int = option(
        256, ge=1, help="generated tokens when an OpenAI-style request gives no max_tokens"
    )
    infill_tokens: int = option(32, ge=1, help="canvas length of an infill request that gives none")
    warmup: bool = option(
        True,
        help="compile the likeliest programs between requests from the start (assistant.server.warmup), so "
        "most requests find theirs compiled; off, each is compiled when a request first needs it",
    )
    warm_threads: int = option(
        2,
        ge=1,
        le=64,
        help="programs the warm-up compiles at once where the runtime compiles beside a running batch (CPU): "
        "XLA compiles one program on one core",
    )
    # 384 holds a chat's first question with its 256-token answer (on CPU it runs 25% faster than 512).
    length_buckets: tuple[int, ...] = option(
        (256, 384, 512, 1024, 2048),
        rule=_buckets,
        help="canvas lengths (prompt + generated tokens) compiled for; a request is padded to the next one",
    )
    batch_buckets: tuple[int, ...] | None = option(
        None,
        rule=_buckets,
        help="batch sizes compiled for; concurrent requests are batched up to the largest. Unset: (1, 4, 16) "
        "on an accelerator, (1, 2, 4) on CPU (few requests run at once there, and a forward's time grows "
        "with its rows)",
    )
    max_programs: int = option(
        DEFAULT_MAX_PROGRAMS,
        ge=2,
        help="compiled programs kept in memory at once; past it the least recently used is dropped (and "
        "compiled again if needed). /v1/diffu/status reports them and the memory ceiling this sets",
    )
    max_context: int | None = option(
        None, ge=2, help="longest prompt + canvas in tokens; unset: the model's limit (2048 for DiffuCoder)"
    )
    tp: int = option(
        1,
        ge=1,
        help="tensor parallel: devices sharing one copy of the model (heads, MLP hidden and vocabulary "
        "split)",
    )
    dp: int | None = option(
        None, ge=1, help="data parallel replicas when tp > 1; unset: every remaining device"
    )
    shutdown_grace: float = option(
        10.0,
        ge=0,
        help="seconds in-flight requests get to finish on SIGTERM/SIGINT before they are cancelled",
    )
    read_timeout: float = option(
        15.0,
        gt=0,
        le=3600,
        help="seconds a client has to send a whole request (head and body); a half-sent one is closed "
        "after it",
    )
    max_connections: int = option(
        256,
        ge=8,
        le=65536,
        help="open connections at most; past it a new one closes the longest idle or unauthenticated one "
        "(503 only when all serve requests with the token), so idle sockets cannot lock clients out",
    )
    log_level: str = option("info", choices=LOG_LEVELS, help="the daemon's log level")

    def __post_init__(self) -> None:
        validate(self, lambda key, problem: ConfigError(key, "default", problem))

    @property
    def log_level_number(self) -> int:
        return logging.getLevelNamesMapping()[self.log_level.upper()]

    def replace(self, **changes: Any) -> Config:
        return dataclasses.replace(self, **changes)


FIELDS = options(Config)
# Tables of config.toml that belong to a client, which reads and validates them itself: diffu chat's
# [chat] (generation defaults) and [keymap] (binding id -> keys), see tui/settings.py.
CLIENT_TABLES = ("chat", "keymap")


def _read(name: str, value: Any, source: str) -> Any:
    """A value from TOML (typed), the environment (text) or a flag, read as its option reads it."""
    try:
        return FIELDS[name].read(value, text=source.startswith(ENV_PREFIX))
    except OptionError as exc:
        raise ConfigError(name, source, exc.problem) from None


def read_config_file(path: Path) -> dict[str, Any]:
    """The raw, type-checked keys of a config.toml; a missing file is an empty config."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise ConfigError("config.toml", str(path), f"cannot read it: {exc}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("config.toml", str(path), f"invalid TOML: {exc}") from None
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key in CLIENT_TABLES and isinstance(value, dict):
            continue  # read and checked by the client that owns it
        if key not in FIELDS:
            raise ConfigError(key, str(path), f"unknown key (known: {', '.join(sorted(FIELDS))})")
        out[key] = _read(key, value, str(path))
    return out


def env_values(env: Mapping[str, str]) -> dict[str, tuple[Any, str]]:
    """Config values set through ``DIFFU_<KEY>`` variables, with the variable name as source.

    Other ``DIFFU_*`` variables (``DIFFU_CONFIG_DIR``, ...) are not config keys and are left alone.
    """
    out: dict[str, tuple[Any, str]] = {}
    for name in FIELDS:
        var = ENV_PREFIX + name.upper()
        if var in env:
            out[name] = (_read(name, env[var], var), var)
    return out


def bundled_model() -> str | None:
    """The demo model that ships in the package, used when no model is configured (None if absent)."""
    from model_runtime.bundled import bundled_model_dir

    path = bundled_model_dir()
    return str(path) if (path / "config.json").is_file() else None


def load_config(
    flags: Mapping[str, Any] | None = None, *, env: Mapping[str, str] | None = None, path: Path | None = None
) -> tuple[Config, dict[str, str]]:
    """The effective config and, per key, where its value came from (default, a file, a variable, flag).

    ``flags`` holds command-line values; None entries mean "not given" and do not override.
    """
    env = os.environ if env is None else env
    path = paths.config_file() if path is None else path
    values: dict[str, Any] = {}
    sources: dict[str, str] = {name: "default" for name in FIELDS}
    for key, value in read_config_file(path).items():
        values[key], sources[key] = value, str(path)
    for key, (value, var) in env_values(env).items():
        values[key], sources[key] = value, var
    for key, value in (flags or {}).items():
        if value is None:
            continue
        if key not in FIELDS:
            raise ConfigError(key, "flag", "not a config key")
        values[key], sources[key] = _read(key, value, "flag"), "flag"
    if values.get("model") is None:
        bundled = bundled_model()
        if bundled is not None:
            values["model"], sources["model"] = bundled, "default (the bundled demo model)"
    try:
        return Config(**values), sources
    except ConfigError as exc:
        # Re-raise with the source of the offending value, so the message says what to fix where.
        raise ConfigError(exc.key, sources.get(exc.key, "default"), exc.problem) from None


def render_toml(config: Config, sources: Mapping[str, str] | None = None, *, reveal: bool = False) -> str:
    """The config as TOML, each line commented with its source; ``api_key`` masked unless ``reveal``."""
    lines = []
    for name in FIELDS:
        value = getattr(config, name)
        if name == "api_key" and value and not reveal:
            value = value[:4] + "…" if len(value) > 8 else "…"
        if value is None:
            text = f"# {name} = (unset)"
        elif isinstance(value, bool):
            text = f"{name} = {'true' if value else 'false'}"
        elif isinstance(value, int | float):
            text = f"{name} = {value}"
        elif isinstance(value, tuple):
            text = f"{name} = [{', '.join(str(v) if isinstance(v, int) else _toml_str(v) for v in value)}]"
        else:
            text = f"{name} = {_toml_str(str(value))}"
        source = (sources or {}).get(name)
        lines.append(f"{text:<48}  # {source}" if source else text)
    return "\n".join(lines) + "\n"


def _toml_str(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
