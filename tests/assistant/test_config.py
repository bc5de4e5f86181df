"""Config precedence (flags > env > file > defaults), errors naming key and source, `config show`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from assistant.config import DEFAULT_PORT, Config, ConfigError, load_config, render_toml

REPO = Path(__file__).resolve().parents[2]


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_defaults_without_file_or_env(tmp_path: Path) -> None:
    config, sources = load_config(env={}, path=tmp_path / "absent.toml")
    # No model configured: the demo model bundled in the package.
    assert config == Config(model=config.model) and config.model.endswith("model_runtime/bundled/model")
    assert config.host == "127.0.0.1" and config.port == DEFAULT_PORT and config.auth
    assert sources.pop("model") == "default (the bundled demo model)"
    assert set(sources.values()) == {"default"}


def test_flags_beat_env_beat_file(tmp_path: Path) -> None:
    path = write(
        tmp_path / "config.toml",
        'model = "/from/file"\nport = 9000\nqueue_size = 3\n'
        'cors_origins = ["https://app.example"]\nlength_buckets = [128, 256]\n',
    )
    env = {"DIFFU_PORT": "9100", "DIFFU_QUEUE_SIZE": "5", "DIFFU_AUTH": "false", "DIFFU_CONFIG_DIR": "/x"}
    config, sources = load_config({"port": 9200, "model": None}, env=env, path=path)
    assert config.port == 9200 and sources["port"] == "flag"
    assert config.queue_size == 5 and sources["queue_size"] == "DIFFU_QUEUE_SIZE"
    assert config.auth is False
    assert config.model == "/from/file" and sources["model"] == str(path)  # a None flag does not override
    assert config.cors_origins == ("https://app.example",) and config.length_buckets == (128, 256)


def test_env_lists_and_optional_values(tmp_path: Path) -> None:
    env = {
        "DIFFU_BATCH_BUCKETS": "1, 4,16",
        "DIFFU_ALLOWED_HOSTS": "devbox,devbox.lan",
        "DIFFU_MAX_CONTEXT": "",
        "DIFFU_API_KEY": "secret-key",
    }
    config, _ = load_config(env=env, path=tmp_path / "none.toml")
    assert config.batch_buckets == (1, 4, 16)
    assert config.allowed_hosts == ("devbox", "devbox.lan")
    assert config.max_context is None and config.api_key == "secret-key"


@pytest.mark.parametrize(
    ("toml", "env", "message"),
    [
        ("prot = 1\n", {}, "prot: unknown key"),
        ('port = "high"\n', {}, "port: must be an integer, got 'high'"),
        ("port = 70000\n", {}, "port: must be in 0..65535, got 70000"),
        ("", {"DIFFU_PORT": "eighty"}, "DIFFU_PORT: port: must be an integer, got 'eighty'"),
        ("", {"DIFFU_AUTH": "maybe"}, "DIFFU_AUTH: auth: must be a boolean"),
        ("", {"DIFFU_QUEUE_SIZE": "0"}, "DIFFU_QUEUE_SIZE: queue_size: must be >= 1, got 0"),
        ("batch_buckets = []\n", {}, "batch_buckets: must be a non-empty list"),
        ('log_level = "loud"\n', {}, "log_level: must be one of debug, info, warning, error"),
        ("port = \n", {}, "invalid TOML"),
    ],
)
def test_bad_values_name_key_and_source(tmp_path: Path, toml: str, env: dict[str, str], message: str) -> None:
    path = write(tmp_path / "config.toml", toml)
    with pytest.raises(ConfigError) as info:
        load_config(env=env, path=path)
    assert message in str(info.value)
    if not env:
        assert str(path) in str(info.value)


def test_flag_errors_name_the_flag(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="^--port: must be in 0..65535"):
        load_config({"port": -1}, env={}, path=tmp_path / "none.toml")


def test_render_masks_the_api_key() -> None:
    text = render_toml(Config(api_key="abcdefghijklmnop"), {"api_key": "DIFFU_API_KEY"})
    assert "abcdefghijklmnop" not in text and 'api_key = "abcd…"' in text and "# DIFFU_API_KEY" in text


def test_config_show_command(tmp_path: Path) -> None:
    write(tmp_path / "config" / "config.toml", 'model = "/models/DiffuCoder"\nqueue_size = 7\n')
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("DIFFU_")},
        "DIFFU_CONFIG_DIR": str(tmp_path / "config"),
        "DIFFU_PORT": "8123",
    }
    out = subprocess.run(
        [sys.executable, "-m", "assistant.cli", "config", "show"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert any(line.startswith('model = "/models/DiffuCoder"') and "config.toml" in line for line in lines)
    assert any(line.startswith("port = 8123") and "# DIFFU_PORT" in line for line in lines)
    assert any(line.startswith("queue_size = 7") for line in lines)
    bad = subprocess.run(
        [sys.executable, "-m", "assistant.cli", "config", "show"],
        cwd=REPO,
        env={**env, "DIFFU_PORT": "x"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "DIFFU_PORT: port: must be an integer" in bad.stderr
    assert "Traceback" not in bad.stderr
