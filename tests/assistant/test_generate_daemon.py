"""``diffu generate`` as a client of a running daemon: by default when one runs, always with ``--daemon``,
never with ``--local``; and the model's own settings either way."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx

from tests.assistant.helpers import REPO, isolated_env, start_daemon


def run(daemon, tmp_path, *args: str) -> subprocess.CompletedProcess:
    env = isolated_env(tmp_path, DIFFU_URL=daemon.url, DIFFU_API_KEY=daemon.token)
    return subprocess.run(
        [sys.executable, "-m", "assistant", "generate", "--daemon", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_generate_through_the_daemon(fake_daemon, tmp_path):
    out = run(
        fake_daemon, tmp_path, "--prompt", "hello", "--prompt", "bye", "--max-new-tokens", "8", "--json"
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert len(data["text"]) == 2 and all(isinstance(t, str) for t in data["text"])
    assert all(r in ("stop", "length") for r in data["finish_reason"])
    infill = run(
        fake_daemon, tmp_path, "--raw", "--prompt", "def f(", "--suffix", "):\n", "--infill-tokens", "4"
    )
    assert infill.returncode == 0, infill.stderr
    # The daemon was ready: no progress line was drawn, so none is closed with "diffu: ready".
    assert "diffu: ready" not in out.stderr + infill.stderr


def test_daemon_errors_are_one_line(fake_daemon, tmp_path):
    bad = run(fake_daemon, tmp_path, "--prompt", "x", "--top-k", "-3")
    assert bad.returncode == 2 and "--top-k" in bad.stderr and "Traceback" not in bad.stderr
    env_url = "http://127.0.0.1:9"  # nothing listens on the discard port
    env = isolated_env(tmp_path, DIFFU_URL=env_url)
    down = subprocess.run(
        [sys.executable, "-m", "assistant", "generate", "--daemon", "--prompt", "x"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert down.returncode == 2 and "diffu: error:" in down.stderr and "Traceback" not in down.stderr


def test_json_has_one_shape_in_process_and_through_the_daemon(fake_daemon, tiny_dir, tmp_path):
    args = ["--raw", "--prompt", "def f(", "--prompt", "import os, sys", "--max-new-tokens", "8", "--json"]
    through = run(fake_daemon, tmp_path, *args)
    assert through.returncode == 0, through.stderr
    local = subprocess.run(
        [sys.executable, "-m", "assistant", "generate", "--model", str(tiny_dir), *args],
        env=isolated_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert local.returncode == 0, local.stderr
    daemon_out, local_out = json.loads(through.stdout), json.loads(local.stdout)
    # The same fields, the same stats, each a list per prompt where it is one.
    assert set(daemon_out) == set(local_out) == {"prompt_ids", "sequences", "text", "finish_reason", "stats"}
    assert set(daemon_out["stats"]) == set(local_out["stats"])
    for out in (daemon_out, local_out):
        assert all(len(out[key]) == 2 for key in ("prompt_ids", "sequences", "text", "finish_reason"))
        # Full canvases, left-padded to the longest: each ends with its prompt and 8 generated tokens.
        short, long_ = out["prompt_ids"]
        assert len(out["sequences"][0]) == len(out["sequences"][1]) == len(long_) + 8
        assert out["sequences"][1][: len(long_)] == long_
        assert out["sequences"][0][len(long_) - len(short) : len(long_)] == short
        assert out["stats"]["new_tokens"] == 16 and out["stats"]["steps"] >= 1
    # Both print the same stats line on stderr.
    assert "tokens in" in through.stderr and "tokens in" in local.stderr


def test_a_running_daemon_answers_generate_without_loading_the_model_here(tmp_path):
    """No DIFFU_URL: the daemon is found through its discovery file, as the chat's would be. The command
    imports no JAX (so it loads and compiles nothing) and answers at once."""
    model = "fake:step_delay=0.002"
    env = isolated_env(tmp_path, DIFFU_MODEL=model)
    daemon = start_daemon(tmp_path, model, env=env)
    probe = (
        "import sys, time; from assistant.cli.main import main; t = time.perf_counter(); "
        "code = main(sys.argv[1:]); print(f'{time.perf_counter() - t:.2f}', file=sys.stderr); "
        "assert 'jax' not in sys.modules, 'jax was imported'; sys.exit(code)"
    )
    args = ["generate", "--raw", "--prompt", "def f(x):", "--max-new-tokens", "8"]
    try:
        answer = subprocess.run(
            [sys.executable, "-c", probe, *args],
            env=env, capture_output=True, text=True, timeout=60, cwd=REPO,
        )  # fmt: skip
        assert answer.returncode == 0, answer.stderr
        assert answer.stdout.strip() and "tokens in" in answer.stderr
        assert float(answer.stderr.strip().splitlines()[-1]) < 3.0  # seconds inside main(), fake daemon
        status = httpx.get(daemon.url + "/v1/diffu/status", headers=daemon.headers).json()
        assert status["counters"]["completed"] == 1  # the daemon answered it
        # --local loads the model in this process instead: here the fake spec, which only a daemon serves.
        local = subprocess.run(
            [sys.executable, "-m", "assistant", "generate", "--local", "--prompt", "x"],
            env=env, capture_output=True, text=True, timeout=120, cwd=REPO,
        )  # fmt: skip
        assert local.returncode == 2 and "fake:step_delay=0.002" in local.stderr
        assert (
            httpx.get(daemon.url + "/v1/diffu/status", headers=daemon.headers).json()["counters"]["completed"]
            == 1
        )
        both = subprocess.run(
            [sys.executable, "-m", "assistant", "generate", "--local", "--daemon", "--prompt", "x"],
            env=env, capture_output=True, text=True, timeout=60, cwd=REPO,
        )  # fmt: skip
        assert both.returncode == 2 and "not allowed with argument" in both.stderr
    finally:
        daemon.stop()
