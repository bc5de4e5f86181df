"""Two processes x 4 virtual CPU devices joined by jax.distributed (gloo): one 8-device mesh."""

from __future__ import annotations

import json
import os
import socket
import subprocess


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_hosts_generate_what_one_device_generates(generate_argv):
    args = generate_argv
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu"}
    single = subprocess.run(args, capture_output=True, text=True, timeout=300, env=env)
    assert single.returncode == 0, single.stderr
    port = free_port()
    hosts = [
        subprocess.Popen(
            args
            + [
                "--tp",
                "4",
                "--dp",
                "2",
                "--coordinator",
                f"127.0.0.1:{port}",
                "--num-processes",
                "2",
                "--process-id",
                str(i),
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
    assert json.loads(answers[0][0])["sequences"] == json.loads(single.stdout)["sequences"]
