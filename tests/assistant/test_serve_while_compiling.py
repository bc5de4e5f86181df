"""First contact (#16): a daemon serves as soon as its weights are loaded, warms its programs up between
requests, compiles ahead for clients that name their shapes (``POST /v1/diffu/warm``), and stops at once
even inside a compile.

The fake runtime (no JAX) stands for slow compiles with ``warmup_delay`` seconds per program; the real
one proves that a warmed shape is the program a request of that shape runs, and the clean exit.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import httpx
import pytest

from assistant import sse
from assistant.client import AsyncClient, Client, SamplingOptions, WarmShape
from assistant.config import Config
from assistant.server.job_builder import build_job, warm_task
from assistant.server.protocol import GenSpec
from assistant.server.warmup import CHAT_REQUEST, Shape
from tests.assistant.helpers import DaemonProcess, isolated_env, start_daemon, wait_until


def stream(daemon: DaemonProcess, path: str, body: dict) -> list[sse.ServerSentEvent]:
    with daemon.client() as c, c.stream("POST", path, json=body) as response:
        assert response.status_code == 200, response.read()
        return list(sse.iter_events(response.iter_lines()))


def test_ready_waits_for_the_clients_programs_and_a_request_is_answered_while_the_warm_up_goes_on(
    tmp_path: Path,
) -> None:
    # Half a second of compiling each shape: every client's first ones before ready, then the rest (longer
    # conversations, short files) in the background, three length buckets whatever the defaults are.
    env = isolated_env(tmp_path, DIFFU_LENGTH_BUCKETS="128,256,512")
    daemon = start_daemon(tmp_path, "fake:warmup_delay=0.5,step_delay=0.002", env=env, wait=False)
    try:
        daemon.wait_ready(warm=False)  # /health says ok: the clients' first programs are compiled
        # Before that it served already, but said 503 "compiling" while they compiled.
        assert (503, "compiling") in daemon.health_seen and daemon.health_seen[-1] == (200, "ok")
        health = daemon.health()
        assert health["status"] == "ok" and health["stage"] == "warming"
        total = health["shapes"]
        assert 0 < health["warmed"] < total and health["detail"] == f"warming ({health['warmed']} of {total})"
        assert health["eta_seconds"] is not None
        # The chat's first prompt (its built-in settings) the moment it is ready: no compile to wait for.
        chat = stream(
            daemon, "/v1/diffu/generate", {"messages": [{"role": "user", "content": "hi"}], **CHAT_REQUEST}
        )
        assert not [e for e in chat if e.event == "waiting"] and chat[-1].event == "done"
        # A shape of no warm-up: it waits for its own compile only, beside the warm-up's, and says so.
        events = stream(
            daemon,
            "/v1/diffu/generate",
            {
                "prompt": "def f(x):",
                "max_new_tokens": 8,
                "steps": 4,
                "temperature": 0.7,
                "alg": "topk_margin",
            },
        )
        during = daemon.health()
        waiting = [e.json() for e in events if e.event == "waiting"]
        done = next(e.json() for e in events if e.event == "done")
        assert [w["reason"] for w in waiting] == ["compiling"] and "compiling the program" in waiting[0][
            "detail"
        ]
        assert [e.event for e in events if e.event != "waiting"][-1] == "done"
        # Answered before the warm-up ended: its own compile only, not the warm-up's queue.
        assert during["stage"] == "warming" and during["warmed"] < total
        assert done["stats"]["compile_seconds"] >= 0.5 and done["stats"]["compiled_programs"] == 1
        daemon.wait_warmed(60)
        status = httpx.get(daemon.url + "/v1/diffu/status", headers=daemon.headers).json()["engine"]
        assert status["warmed"] == status["shapes"] == total and status["compiling"] is None
    finally:
        daemon.stop()


def test_the_warm_route_compiles_a_clients_shapes_ahead(tmp_path: Path) -> None:
    daemon = start_daemon(tmp_path, "fake:warmup_delay=0.3,step_delay=0.002", wait=False)
    try:
        daemon.wait_ready(warm=False)
        shape = {"prompt_tokens": 60, "max_new_tokens": 24, "infill": True, "temperature": 0.2, "steps": 12}
        with daemon.client() as c:
            first = c.post("/v1/diffu/warm", json={"shapes": [shape]})
            assert first.status_code == 202  # answered at once, compiled in the background
            assert first.json()["queued"] == 1 and first.json()["compiled"] == []
            daemon.wait_warmed(10)
            # Top-p on is another program; another top_k is not (a traced value, issue #17).
            shapes = [shape, {**shape, "top_k": 5}, {**shape, "top_p": 0.9}]
            again = c.post("/v1/diffu/warm", json={"shapes": shapes}).json()
            assert again["queued"] == 1 and again["compiled"] == [0, 1]
            daemon.wait_warmed(10)
            # A request of the warmed shape runs at once: no compile waited for, none done.
            events = stream(
                daemon,
                "/v1/diffu/infill",
                {
                    "prefix": "x" * 40,
                    "suffix": "y" * 20,
                    "canvas_tokens": 24,
                    "temperature": 0.2,
                    "steps": 12,
                },
            )
            assert not [e for e in events if e.event == "waiting"]
            assert next(e.json() for e in events if e.event == "done")["stats"]["compiled_programs"] == 0
            # Bad shapes are refused, naming the shape and the field.
            for body, param in (
                ({"shapes": [{"prompt_tokens": 1}]}, "shapes[0].max_new_tokens"),
                ({"shapes": [shape, {**shape, "colour": 1}]}, "shapes[1].colour"),
                ({"shapes": [{**shape, "top_p": 2}]}, "shapes[0].top_p"),
                ({"shapes": [{**shape, "prompt_tokens": 500}]}, "shapes[0].prompt_tokens"),
                ({"shapes": []}, "shapes"),
            ):
                refused = c.post("/v1/diffu/warm", json=body)
                assert refused.status_code == 400 and refused.json()["error"]["param"] == param, refused.text
            overflow = c.post("/v1/diffu/warm", json={"shapes": [{**shape, "prompt_tokens": 500}]}).json()
            assert overflow["error"]["code"] == "context_length_exceeded"
            assert overflow["error"]["details"]["context_length"] == 512
        # The clients: typed shapes, the same answer.
        config = Config(url=daemon.url, api_key=daemon.token, autostart=False)
        typed = WarmShape(
            prompt_tokens=60,
            max_new_tokens=24,
            infill=True,
            sampling=SamplingOptions(temperature=0.2, steps=12),
        )
        with Client(config=config) as client:
            assert client.warm([typed])["compiled"] == [0]

        async def from_async() -> dict:
            async with AsyncClient(config=config) as client:
                other = WarmShape(prompt_tokens=3, max_new_tokens=5, sampling=SamplingOptions(top_p=0.5))
                return await client.warm([typed, other])

        result = asyncio.run(from_async())
        assert result["compiled"] == [0] and result["queued"] == 1
    finally:
        daemon.stop()


CHAT = [{"role": "user", "content": "Write a function that adds two numbers."}]


# The reference decoder's infill row is the simple case (the whole canvas is sampled); its plain
# generation samples a window that the made-up rows must reproduce, and each reference program is long
# to compile, so that one is checked.
@pytest.mark.parametrize(("decoder", "mode"), [("fast", "chat"), ("fast", "infill"), ("reference", "chat")])
def test_a_warmed_shape_is_the_program_its_requests_run(runtime, decoder: str, mode: str) -> None:
    """Made-up rows of a shape compile exactly the programs real requests of that shape use."""
    config = Config()
    sampling = {"decoder": decoder, "temperature": 0.3, "top_p": 0.9}
    if mode == "chat":
        spec = GenSpec(mode="chat", canvas_tokens=24, sampling=SamplingOptions(**sampling), messages=CHAT)
    else:
        spec = GenSpec(mode="infill", canvas_tokens=8, sampling=SamplingOptions(**sampling),
                       prefix="def add(a, b):\n    ", suffix="\n\nprint(add(1, 2))\n")  # fmt: skip
    job, _ = build_job(runtime, spec, config)
    shape = Shape(job.prompt_tokens, spec.canvas_tokens, infill=mode == "infill", sampling=sampling)
    task = warm_task(runtime, shape, config)
    assert task.params == job.params
    runtime.compile(task.rows, task.params)
    assert runtime.compiled([job.row], job.params)


def test_sigterm_during_a_compile_exits_at_once_and_cleanly(tmp_path: Path, micro_dir: Path) -> None:
    # An empty compilation cache: the daemon compiles its first warm-up program when the signal comes.
    env = isolated_env(tmp_path, DIFFU_JAX_CACHE_DIR=str(tmp_path / "empty-cache"))
    daemon = start_daemon(tmp_path, str(micro_dir), env=env, wait=False)
    status = lambda: httpx.get(daemon.url + "/v1/diffu/status", headers=daemon.headers).json()  # noqa: E731
    assert wait_until(lambda: status()["engine"]["compiling"], 120, interval=0.02)
    daemon.proc.send_signal(signal.SIGTERM)
    code = daemon.proc.wait(30)
    stderr = (tmp_path / "stderr.txt").read_text()
    assert code == 0, stderr
    # It did not wait for the compile under way (XLA's cannot be interrupted): it exited beside it.
    assert "not waiting for it" in daemon.log_text()
    assert "terminate called" not in stderr and "FATAL" not in stderr and "Traceback" not in stderr
    assert "daemon exited; lock and discovery file removed" in daemon.log_text()
    assert not list((tmp_path / "run").glob("*.json"))
