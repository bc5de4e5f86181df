"""Two processes x 4 virtual CPU devices joined by jax.distributed (gloo): one 8-device mesh."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.assistant.helpers import isolated_env, virtual_devices_env

ENV = virtual_devices_env(4)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def single(generate_argv) -> dict:
    """What ``generate_argv`` prints on one device."""
    run = subprocess.run(
        generate_argv, capture_output=True, text=True, timeout=300, env={**os.environ, **ENV}
    )
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def multihost_flags(port: int, rank: int) -> list[str]:
    return ["--coordinator", f"127.0.0.1:{port}", "--num-processes", "2", "--process-id", str(rank)]


def test_two_hosts_generate_what_one_device_generates(generate_argv, single):
    args = generate_argv
    env = {**os.environ, **ENV}
    port = free_port()
    hosts = [
        subprocess.Popen(
            args
            + [
                "--tp",
                "4",
                "--dp",
                "2",
                *multihost_flags(port, i),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for i in range(2)
    ]
    outs = [h.communicate(timeout=300) for h in hosts]
    assert [h.returncode for h in hosts] == [0, 0], outs[0][1][-2000:] + outs[1][1][-2000:]
    # Only process 0 prints the answer (gloo itself logs connection lines on stdout).
    answers = [[ln for ln in out.splitlines() if ln.startswith("{")] for out, _ in outs]
    assert len(answers[0]) == 1 and answers[1] == []
    assert json.loads(answers[0][0])["sequences"] == single["sequences"]


def test_a_daemon_over_two_hosts_serves_from_process_0_and_the_other_follows(shard_dir, single, tmp_path):
    # One bucket: its one warm-up shape (an editor's infill, greedy) is the program the requests below run.
    buckets = {"DIFFU_LENGTH_BUCKETS": "64", "DIFFU_MAX_CONTEXT": "64", "DIFFU_BATCH_BUCKETS": "2"}
    env = {**isolated_env(tmp_path), **ENV, **buckets}
    port = free_port()
    serve = [sys.executable, "-m", "assistant", "serve", "--model", str(shard_dir), "--tp", "4", "--dp", "2"]
    logs = [(tmp_path / f"process{i}.txt").open("w") for i in range(2)]
    follower = subprocess.Popen(
        serve + multihost_flags(port, 1), stdout=logs[1], stderr=subprocess.STDOUT, text=True, env=env
    )
    leader = subprocess.Popen(
        serve + ["--port", "0", *multihost_flags(port, 0)],
        stdout=subprocess.PIPE,
        stderr=logs[0],
        text=True,
        env=env,
    )
    try:
        url = None
        for line in leader.stdout:  # gloo may print its own lines first
            if "listening on" in line:
                url = line.split("listening on ", 1)[1].split()[0]
                break
        assert url, (tmp_path / "process0.txt").read_text()[-3000:]
        token = (tmp_path / "config" / "token").read_text().strip()
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=url, headers=headers, timeout=120) as c:
            deadline = time.monotonic() + 240
            # Serving once loaded; then the warm-up's compiles, on both hosts, before anything is timed.
            while c.get("/health").json().get("stage") != "ready":
                assert time.monotonic() < deadline and leader.poll() is None and follower.poll() is None
                time.sleep(0.5)
            mesh = c.get("/v1/diffu/status").json()["mesh"]
            assert (mesh["processes"], mesh["devices"], mesh["tp"], mesh["dp"]) == (2, 8, 4, 2)
            body = {"prompt": "def add(a, b):", "max_new_tokens": 16, "steps": 16, "temperature": 0}
            # A streamed request dropped after its first step: both hosts stop that batch together...
            with c.stream("POST", "/v1/diffu/generate", json={**body, "steps": 400}) as r:
                assert r.status_code == 200
                assert any(line.startswith("event: step") for line in r.iter_lines())
            # ...so the next request runs on both and answers what one device generates.
            answer = c.post("/v1/diffu/generate", json={**body, "stream": False})
            assert answer.status_code == 200, answer.text
            assert answer.json()["text"] == single["text"][0]
            with c.stream("POST", "/v1/diffu/generate", json=body) as r:
                steps = [ln for ln in r.iter_lines() if ln.startswith("event: step")]
            assert len(steps) == 16
        leader.send_signal(signal.SIGTERM)
        assert leader.wait(60) == 0
        assert follower.wait(60) == 0  # released by process 0's stop
    finally:
        for proc in (leader, follower):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for f in logs:
            f.close()
    follower_log = Path(tmp_path / "process1.txt").read_text()
    assert "process 1 follows process 0" in follower_log
    assert "process 0 stopped after" in follower_log
