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


@dataclass(frozen=True, kw_only=True)
class Config:
    """The effective settings of the daemon and its clients."""

    model: str | None = None
    """Checkpoint directory or hub id the daemon serves (``fake:`` runs the JAX-free test backend)."""
    dtype: str | None = None
    """Parameter dtype (``bfloat16``, ``float32``, ...); None lets the runtime choose."""
    quantize: str | None = None
    """Weight-only quantization at load: ``int8`` or ``int4`` (see model_runtime/quant.py); None: off."""
    host: str = "127.0.0.1"
    """Bind address. Anything but loopback exposes the model to the network and is logged as a warning."""
    port: int = DEFAULT_PORT
    """TCP port; 0 picks a free one."""
    api_key: str | None = None
    """Bearer token; None uses (and on first start creates) the token file in the config directory."""
    auth: bool = True
    """False switches authentication off: any key, or none, is accepted."""
    url: str | None = None
    """Clients only: talk to this daemon instead of looking for one (``DIFFU_URL``)."""
    autostart: bool = True
    """Clients only: start a background daemon when none is running."""
    allowed_hosts: tuple[str, ...] = ()
    """Extra Host-header names accepted on a loopback bind (the DNS-rebinding allowlist)."""
    cors_origins: tuple[str, ...] = ()
    """Extra browser origins allowed besides http(s)://localhost, 127.0.0.1 and [::1] on any port."""
    queue_size: int = 64
    """Requests waiting for the engine before new ones get 503 + Retry-After."""
    max_batch: int = 16
    """Most requests run together in one canvas batch (the runtime's buckets may allow fewer)."""
    max_body_bytes: int = 4 * 1024 * 1024
    """Request bodies larger than this get 413."""
    max_steps: int = 1024
    """Largest ``steps`` a request may ask for."""
    max_seconds: float = 300.0
    """Time budget of one generation; past it the request ends with what is unmasked so far."""
    default_max_tokens: int = 256
    """Generated tokens when an OpenAI-style request gives no ``max_tokens``."""
    infill_tokens: int = 32
    """Canvas length of an infill request that gives none."""
    warmup: bool = True
    """Compile the likeliest programs between requests from the start (assistant.server.warmup), so most
    requests find theirs compiled; off, each is compiled when a request first needs it."""
    length_buckets: tuple[int, ...] = (256, 384, 512, 1024, 2048)
    """Canvas lengths (prompt + generated tokens) compiled for; a request is padded to the next one. 384
    holds a chat's first question with its 256-token answer (on CPU it runs 25% faster than 512)."""
    batch_buckets: tuple[int, ...] | None = None
    """Batch sizes compiled for; concurrent requests are batched up to the largest. None: (1, 4, 16) on
    an accelerator, (1, 4) on CPU (few requests run at once there, and every bucket is a compile)."""
    max_programs: int = DEFAULT_MAX_PROGRAMS
    """Compiled programs kept in memory at once; past it the least recently used is dropped (and compiled
    again if needed). ``/v1/diffu/status`` reports them and the memory ceiling this sets."""
    max_context: int | None = None
    """Longest prompt + canvas in tokens; None: the model's limit (2048 for DiffuCoder)."""
    tp: int = 1
    """Tensor parallel: devices sharing one copy of the model (heads, MLP hidden and vocabulary split)."""
    dp: int | None = None
    """Data parallel replicas when ``tp`` > 1; None: every remaining device."""
    shutdown_grace: float = 10.0
    read_timeout: float = 15.0
    """Seconds a client has to send a whole request (head and body); a half-sent one is closed after it."""
    max_connections: int = 256
    """Open connections at most; past it a new one closes the longest idle or unauthenticated one, so
    idle sockets cannot lock clients with the token out (503 only when all serve such clients)."""
    """Seconds in-flight requests get to finish on SIGTERM/SIGINT before they are cancelled."""
    log_level: str = "info"

    def __post_init__(self) -> None:
        def check(cond: bool, key: str, msg: str) -> None:
            if not cond:
                raise ConfigError(key, "default", msg)

        check(0 <= self.port <= 65535, "port", f"must be in 0..65535, got {self.port}")
        check(bool(self.host), "host", "must not be empty")
        for key in ("queue_size", "max_batch", "max_steps", "default_max_tokens", "infill_tokens"):
            check(getattr(self, key) >= 1, key, f"must be >= 1, got {getattr(self, key)}")
        check(self.max_body_bytes >= 1024, "max_body_bytes", f"must be >= 1024, got {self.max_body_bytes}")
        check(self.max_seconds > 0, "max_seconds", f"must be > 0, got {self.max_seconds}")
        for key in ("length_buckets", "batch_buckets"):
            values = getattr(self, key)
            if values is None and key == "batch_buckets":
                continue
            check(
                bool(values) and all(isinstance(v, int) and v >= 1 for v in values),
                key,
                f"must be a non-empty list of integers >= 1, got {list(values)}",
            )
        check(self.max_programs >= 2, "max_programs", f"must be >= 2, got {self.max_programs}")
        if self.max_context is not None:
            check(self.max_context >= 2, "max_context", f"must be >= 2, got {self.max_context}")
        check(
            self.quantize in (None, "int8", "int4"),
            "quantize",
            f"must be int8 or int4 (or unset), got {self.quantize!r}",
        )
        check(self.tp >= 1, "tp", f"must be >= 1, got {self.tp}")
        if self.dp is not None:
            check(self.dp >= 1, "dp", f"must be >= 1, got {self.dp}")
        check(self.shutdown_grace >= 0, "shutdown_grace", f"must be >= 0, got {self.shutdown_grace}")
        check(0 < self.read_timeout <= 3600, "read_timeout", f"must be in (0, 3600], got {self.read_timeout}")
        check(
            8 <= self.max_connections <= 65536,
            "max_connections",
            f"must be in 8..65536, got {self.max_connections}",
        )
        check(
            self.log_level in LOG_LEVELS,
            "log_level",
            f"must be one of {', '.join(LOG_LEVELS)}; got {self.log_level!r}",
        )
        if self.api_key is not None:
            check(
                bool(self.api_key.strip()) and self.api_key.isprintable() and " " not in self.api_key,
                "api_key",
                "must be a non-empty string without spaces",
            )
        if self.url is not None:
            check(
                self.url.startswith(("http://", "https://")),
                "url",
                f"must start with http:// or https://, got {self.url!r}",
            )

    @property
    def log_level_number(self) -> int:
        return logging.getLevelNamesMapping()[self.log_level.upper()]

    def replace(self, **changes: Any) -> Config:
        return dataclasses.replace(self, **changes)


FIELDS = {f.name: f for f in dataclasses.fields(Config)}
# Tables of config.toml that belong to a client, which reads and validates them itself: diffu chat's
# [chat] (generation defaults) and [keymap] (binding id -> keys), see tui/settings.py.
CLIENT_TABLES = ("chat", "keymap")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _field_kind(name: str) -> str:
    """The value kind of a field: 'int', 'float', 'bool', 'str', 'optstr' or 'tuple'."""
    return {
        int: "int",
        float: "float",
        bool: "bool",
        str: "str",
        "int": "int",
        "float": "float",
        "bool": "bool",
        "str": "str",
        "str | None": "optstr",
        "tuple[str, ...]": "tuple",
        "tuple[int, ...]": "ints",
        "tuple[int, ...] | None": "optints",
        "int | None": "optint",
    }[FIELDS[name].type]


def _coerce(name: str, value: Any, source: str) -> Any:
    """Convert a value from TOML (typed), the environment (a string) or a flag to the field's type."""
    kind = _field_kind(name)
    from_text = isinstance(value, str) and source.startswith(ENV_PREFIX)
    if kind == "optstr":
        if not isinstance(value, str):
            raise ConfigError(name, source, f"must be a string, got {value!r}")
        return value or None
    if kind == "str":
        if not isinstance(value, str):
            raise ConfigError(name, source, f"must be a string, got {value!r}")
        return value
    if kind == "bool":
        if from_text:
            if value.strip().lower() in _TRUE:
                return True
            if value.strip().lower() in _FALSE:
                return False
            raise ConfigError(name, source, f"must be a boolean (1/0, true/false), got {value!r}")
        if not isinstance(value, bool):
            raise ConfigError(name, source, f"must be true or false, got {value!r}")
        return value
    if kind == "optint":
        if from_text and not value.strip():
            return None
        kind = "int"
    if kind == "optints":
        if from_text and not value.strip():
            return None
        kind = "ints"
    if kind == "ints":
        items = [v.strip() for v in value.split(",") if v.strip()] if from_text else value
        if not isinstance(items, list | tuple):
            raise ConfigError(name, source, f"must be a list of integers, got {value!r}")
        out = []
        for item in items:
            try:
                out.append(int(item) if isinstance(item, str) else item)
            except ValueError:
                raise ConfigError(name, source, f"must be a list of integers, got {value!r}") from None
            if not isinstance(out[-1], int) or isinstance(out[-1], bool):
                raise ConfigError(name, source, f"must be a list of integers, got {value!r}")
        return tuple(out)
    if kind == "int":
        if from_text:
            try:
                return int(value.strip())
            except ValueError:
                raise ConfigError(name, source, f"must be an integer, got {value!r}") from None
        if not isinstance(value, int) or isinstance(value, bool):
            raise ConfigError(name, source, f"must be an integer, got {value!r}")
        return value
    if kind == "float":
        if from_text:
            try:
                return float(value.strip())
            except ValueError:
                raise ConfigError(name, source, f"must be a number, got {value!r}") from None
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise ConfigError(name, source, f"must be a number, got {value!r}")
        return float(value)
    # tuple of strings: a TOML array, or a comma-separated environment variable
    if from_text:
        return tuple(part.strip() for part in value.split(",") if part.strip())
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise ConfigError(name, source, f"must be a list of strings, got {value!r}")
    return tuple(value)


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
        out[key] = _coerce(key, value, str(path))
    return out


def env_values(env: Mapping[str, str]) -> dict[str, tuple[Any, str]]:
    """Config values set through ``DIFFU_<KEY>`` variables, with the variable name as source.

    Other ``DIFFU_*`` variables (``DIFFU_CONFIG_DIR``, ...) are not config keys and are left alone.
    """
    out: dict[str, tuple[Any, str]] = {}
    for name in FIELDS:
        var = ENV_PREFIX + name.upper()
        if var in env:
            out[name] = (_coerce(name, env[var], var), var)
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
        values[key], sources[key] = _coerce(key, value, "flag"), "flag"
    if values.get("model") is None:
        bundled = bundled_model()
        if bundled is not None:
            values["model"], sources["model"] = bundled, "default (the bundled demo model)"
    try:
        return Config(**values), sources
    except ConfigError as exc:
        # Re-raise with the source of the offending value, so the message says what to fix where.
        raise ConfigError(exc.key, sources.get(exc.key, "default"), str(exc).split(": ", 1)[1]) from None


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
