"""Daemon behaviour that needs a controllable step time: a real ``diffu serve`` on the fake runtime.

Queue limits, time budgets, explicit cancel, SIGTERM, CORS and body limits, ``--no-auth``, the
``diffu daemon`` commands and the client library, without paying for JAX.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from assistant import sse
from tests.assistant.helpers import (
    REPO,
    DaemonProcess,
    isolated_env,
    run_cli_opening_gate,
    start_daemon,
    stop_background_daemons,
    wait_until,
)

LONG = {"prompt": "def slow(x):", "max_new_tokens": 16, "steps": 1000}  # 20 s at 20 ms a step


def first_step_id(events: Iterator[sse.ServerSentEvent]) -> str:
    """Read a stream's events up to its first step; the caller keeps reading the same iterator."""
    for event in events:
        if event.event == "step":
            return event.json()["id"]
    raise AssertionError("no step event")


def test_full_queue_answers_503_with_retry_after(fake_daemon: DaemonProcess) -> None:
    async def main() -> httpx.Response:
        async with httpx.AsyncClient(base_url=fake_daemon.url, headers=fake_daemon.headers, timeout=60) as c:
            running = asyncio.ensure_future(c.post("/v1/diffu/generate", json={**LONG, "stream": False}))
            assert await asyncio.to_thread(wait_until, lambda: _queue(fake_daemon)["running"] == 1)
            # Different seeds: equal parameters would be batched instead of queued.
            waiting = [
                asyncio.ensure_future(
                    c.post("/v1/diffu/generate", json={**LONG, "seed": i + 1, "stream": False})
                )
                for i in range(4)
            ]
            assert await asyncio.to_thread(wait_until, lambda: _queue(fake_daemon)["pending"] == 4)
            refused = await c.post("/v1/diffu/generate", json={**LONG, "seed": 99, "stream": False})
            for task in [running, *waiting]:
                task.cancel()  # closing the connections cancels the jobs
            await asyncio.gather(running, *waiting, return_exceptions=True)
            return refused

    refused = asyncio.run(main())
    assert refused.status_code == 503 and int(refused.headers["retry-after"]) >= 1
    assert "queue is full" in refused.json()["error"]["message"]
    assert wait_until(
        lambda: _queue(fake_daemon) == {"pending": 0, "running": 0, "capacity": 4, "max_batch": 16}
    )


def _queue(daemon: DaemonProcess) -> dict[str, int]:
    return httpx.get(daemon.url + "/v1/diffu/status", headers=daemon.headers).json()["queue"]


def test_time_budget_and_explicit_cancel(fake_daemon: DaemonProcess) -> None:
    with fake_daemon.client() as c:
        budget = c.post("/v1/diffu/generate", json={**LONG, "max_seconds": 0.3, "stream": False})
        assert budget.status_code == 200
        data = budget.json()
        assert data["finish_reason"] == "time" and data["stats"]["steps"] < 100
        with c.stream("POST", "/v1/diffu/generate", json=LONG) as stream:
            events = sse.iter_events(stream.iter_lines())
            job_id = first_step_id(events)
            cancel = c.post("/v1/diffu/cancel", json={"id": job_id})
            rest = list(events)
        assert cancel.status_code == 200 and cancel.json() == {"id": job_id, "cancelled": True}
        done = [e.json() for e in rest if e.event == "done"]
        assert done and done[0]["finish_reason"] == "cancelled"
        again = c.post("/v1/diffu/cancel", json={"id": job_id})
        assert again.status_code == 404 and "no queued or running request" in again.json()["error"]["message"]


def test_the_llama_time_budget_returns_what_is_unmasked(fake_daemon: DaemonProcess) -> None:
    with fake_daemon.client() as c:
        r = c.post(
            "/infill",
            json={
                "input_prefix": "def f():\n",
                "input_suffix": "\n",
                "n_predict": 64,
                "steps": 1000,
                "t_max_predict_ms": 200,
            },
        )
    assert r.status_code == 200 and r.json()["stop_type"] == "limit" and r.json()["timings"]["steps"] < 100


def test_cors_only_for_local_origins_and_body_limit(fake_daemon: DaemonProcess) -> None:
    with fake_daemon.client() as c:
        ok = c.get("/v1/models", headers={"origin": "http://localhost:5173"})
        assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == "http://localhost:5173"
        preflight = c.options(
            "/v1/chat/completions",
            headers={
                "origin": "http://127.0.0.1:3000",
                "access-control-request-method": "POST",
                "access-control-request-headers": "authorization, content-type",
            },
        )
        assert preflight.status_code == 204
        assert "authorization" in preflight.headers["access-control-allow-headers"]
        foreign = c.get("/v1/models", headers={"origin": "https://evil.example"})
        assert foreign.status_code == 403 and "access-control-allow-origin" not in foreign.headers
        foreign_preflight = c.options(
            "/v1/models", headers={"origin": "https://evil.example", "access-control-request-method": "GET"}
        )
        assert foreign_preflight.status_code == 403
        big = c.post(
            "/v1/completions",
            content=b'{"prompt": "' + b"x" * 70000 + b'"}',
            headers={"content-type": "application/json"},
        )
        assert big.status_code == 413 and "limit 65536 bytes" in big.json()["error"]["message"]


def test_streaming_client_that_leaves_cancels_its_job(fake_daemon: DaemonProcess) -> None:
    from assistant.client import Client, SamplingOptions, Step

    before = httpx.get(fake_daemon.url + "/v1/diffu/status", headers=fake_daemon.headers).json()["counters"]
    with Client(fake_daemon.url, fake_daemon.token, autostart=False) as client:
        slow = SamplingOptions(steps=1000)
        for event in client.stream_generate(prompt="def f(x):", max_new_tokens=16, sampling=slow):
            assert isinstance(event, Step)
            break  # leaving the loop closes the stream
    assert wait_until(
        lambda: (
            httpx.get(fake_daemon.url + "/v1/diffu/status", headers=fake_daemon.headers).json()["counters"][
                "cancelled"
            ]
            == before["cancelled"] + 1
        )
    )


def test_sync_and_async_clients(fake_daemon: DaemonProcess) -> None:
    from assistant.client import APIError, AsyncClient, Client, Done, SamplingOptions, Step
    from assistant.daemon_status import DaemonStatus

    four = SamplingOptions(steps=4)
    hi = [{"role": "user", "content": "hi"}]
    with Client(fake_daemon.url, fake_daemon.token, autostart=False) as client:
        events = list(client.stream_generate(messages=hi, max_new_tokens=8, sampling=four))
        assert [type(e) for e in events] == [Step] * 4 + [Done]
        done = client.generate(messages=hi, max_new_tokens=8, sampling=four)
        assert done.text == events[-1].text  # deterministic model: streamed and not agree
        # The stats come back as the type the daemon built them in, every field filled.
        stats = done.stats
        assert stats.steps == 4 and stats.canvas_tokens == 8 and stats.batch_size == 1
        assert stats.new_tokens == done.usage["completion_tokens"] and stats.bucket is not None
        assert stats.bucket[0] == 1 and stats.bucket[1] >= stats.prompt_tokens + stats.canvas_tokens
        assert stats.decoder == "reference" and stats.generate_seconds > 0 and stats.cancel_reason is None
        infill = client.infill("def f(", "):\n", canvas_tokens=8, sampling=four)
        assert infill.usage["completion_tokens"] <= 8
        assert (
            client.chat_completions([{"role": "user", "content": "hi"}], max_tokens=8)["object"]
            == "chat.completion"
        )
        with pytest.raises(APIError) as info:
            client.generate(prompt="x", sampling=SamplingOptions(steps=0))
        assert info.value.status == 400 and info.value.param == "steps"
        assert client.cancel("no-such-request") is False  # a 404, read as the table says

    async def run_async() -> tuple[list[object], DaemonStatus]:
        async with AsyncClient(fake_daemon.url, fake_daemon.token, autostart=False) as client:
            two = SamplingOptions(steps=2)
            events = [e async for e in client.stream_infill("def f(", "):\n", canvas_tokens=8, sampling=two)]
            assert await client.cancel("no-such-request") is False
            return events, await client.status()

    events, status = asyncio.run(run_async())
    assert [type(e) for e in events] == [Step, Step, Done] and status.model == "fake"
    assert status.counters.completed >= 3  # the three requests above are in


def test_no_auth_accepts_any_key_and_none(tmp_path: Path) -> None:
    daemon = start_daemon(tmp_path, "fake", "--no-auth")
    try:
        for headers in ({}, {"authorization": "Bearer anything"}, {"authorization": "Basic Zm9vOmJhcg=="}):
            r = httpx.get(daemon.url + "/v1/models", headers=headers)
            assert r.status_code == 200, r.text
        assert not (tmp_path / "config" / "token").exists()  # no token was needed, none was made
        assert "authentication is off" in daemon.log_text()
    finally:
        assert daemon.stop() == 0


@pytest.mark.parametrize(
    ("sig", "steps", "grace", "finished"),
    [
        (signal.SIGTERM, 1000, "0.5", False),  # 20 s of work, 0.5 s of grace: cancelled
        (signal.SIGINT, 40, "10", True),  # 0.8 s of work within the grace period: finished
    ],
)
def test_signals_stop_accepting_finish_or_cancel_work_and_remove_lock_and_discovery(
    tmp_path: Path, sig: int, steps: int, grace: str, finished: bool
) -> None:
    env = isolated_env(tmp_path, DIFFU_SHUTDOWN_GRACE=grace)
    daemon = start_daemon(tmp_path, "fake:step_delay=0.02", env=env)
    run_dir = tmp_path / "run"
    assert len(list(run_dir.glob("*.json"))) == 1 and len(list(run_dir.glob("*.lock"))) == 1
    body = {**LONG, "steps": steps}
    with daemon.client() as c, c.stream("POST", "/v1/diffu/generate", json=body) as stream:
        events = sse.iter_events(stream.iter_lines())
        first_step_id(events)
        t0 = time.perf_counter()
        daemon.proc.send_signal(sig)
        assert wait_until(lambda: _refused(daemon), timeout=5)  # no new connections once stopping
        try:
            rest = list(events)
        except httpx.HTTPError:
            rest = []  # the connection may be cut once the grace period is over
    assert daemon.proc.wait(15) == 0
    assert time.perf_counter() - t0 < 10  # not the 20 s the long generation wanted
    done = [e.json() for e in rest if e.event == "done"]
    if finished:
        assert done and done[0]["finish_reason"] in ("stop", "length")
    else:
        assert not done or done[0]["finish_reason"] == "cancelled"
    assert not list(run_dir.glob("*.json")) and not list(run_dir.glob("*.lock"))
    log = daemon.log_text()
    assert "stopped by signal" in log and "lock and discovery file removed" in log


def _refused(daemon: DaemonProcess) -> bool:
    """Whether a new connection goes unanswered: refused outright, or (when it raced the listening
    socket's close and sat in the kernel's accept queue) reset or closed before any response."""
    try:
        httpx.get(daemon.url + "/health", timeout=1)
    except (httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError):
        return True
    return False


def test_a_client_reconnects_to_a_restarted_daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from assistant import discovery
    from assistant.client import Client, SamplingOptions
    from assistant.client.spawn import wait_exit

    for key, value in isolated_env(tmp_path, DIFFU_MODEL="fake", DIFFU_PORT="0").items():
        monkeypatch.setenv(key, value)
    try:
        with Client() as client:
            first = client.status().pid  # no daemon yet: the client starts one
            os.kill(first, signal.SIGKILL)
            assert wait_exit(first, 10)
            two = SamplingOptions(steps=2)
            done = client.generate(prompt="def f():", max_new_tokens=8, sampling=two)  # gone: starts another
            second = client.status().pid
        assert second != first and done.finish_reason in ("stop", "length")
        info = discovery.find_daemon("fake")
        assert info is not None and info.pid == second
    finally:
        stop_background_daemons(tmp_path)


def test_a_non_loopback_bind_is_logged_and_skips_the_host_check(tmp_path: Path) -> None:
    daemon = start_daemon(tmp_path, "fake", "--host", "0.0.0.0")
    try:
        assert daemon.url.startswith("http://127.0.0.1:")
        r = httpx.get(daemon.url + "/v1/models", headers={**daemon.headers, "host": "devbox.example:8012"})
        assert r.status_code == 200
        assert "binding to 0.0.0.0: the model is reachable from other machines" in daemon.log_text()
    finally:
        daemon.stop()


def test_serve_errors_exit_2_with_a_message(tmp_path: Path) -> None:
    env = isolated_env(tmp_path)
    run = [sys.executable, "-m", "assistant.cli"]
    shown = subprocess.run(
        [*run, "config", "show"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    # With no model configured, the daemon and its clients use the demo model bundled in the package.
    assert (
        shown.returncode == 0
        and "bundled demo model" in shown.stdout
        and "model_runtime/bundled" in shown.stdout
    )
    empty = tmp_path / "not-a-checkpoint"
    empty.mkdir()
    bad = subprocess.run(
        [*run, "serve", "--model", str(empty), "--port", "0"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and f"cannot serve {empty}" in bad.stderr and "Traceback" not in bad.stderr
    assert not list((tmp_path / "run").glob("*.json"))
    daemon = start_daemon(tmp_path / "second", "fake")
    try:
        twice = subprocess.run(
            [*run, "serve", "--model", "fake", "--port", "0"],
            cwd=REPO,
            env=daemon.env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert twice.returncode == 2 and f"already running at {daemon.url}" in twice.stderr
    finally:
        daemon.stop()


def test_daemon_commands_start_status_logs_stop(tmp_path: Path) -> None:
    gate = tmp_path / "loaded"
    env = isolated_env(tmp_path, DIFFU_MODEL=f"fake:load_gate={gate},warmup_delay=0.05")

    def diffu(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "assistant.cli", *args],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    assert diffu("daemon", "status").returncode == 3
    # The model loads until the gate file appears, which happens once `daemon start` has shown the loading
    # stage: however slowly this machine runs, the stage is there to be seen.
    code, shown, out, err = run_cli_opening_gate(
        ["daemon", "start", "--port", "0"], env, gate, lambda line: "loading" in line
    )
    assert code == 0, "".join(shown) + err
    assert "started pid" in out and "ready to serve" in out and "loading" in shown[-1], (shown, out)
    info = json.loads(next((tmp_path / "run").glob("*.json")).read_text())
    try:
        again = diffu("daemon", "start", "--port", "0")
        assert again.returncode == 0 and f"already running at {info['url']}" in again.stdout
        status = diffu("daemon", "status")
        assert status.returncode == 0 and info["url"] in status.stdout
        assert "  state:   ready\n" in status.stdout  # the stage once, not "ready ready"
        as_json = json.loads(diffu("daemon", "status", "--json").stdout)
        assert as_json[0]["pid"] == info["pid"] and as_json[0]["server"]["engine"]["stage"] == "ready"
        logs = diffu("daemon", "logs", "-n", "200")
        assert logs.returncode == 0 and "listening on" in logs.stdout and "engine ready" in logs.stdout
    finally:
        stop = diffu("daemon", "stop")
        stop_background_daemons(tmp_path)
    assert stop.returncode == 0 and f"stopped pid {info['pid']}" in stop.stdout
    assert diffu("daemon", "status").returncode == 3
    assert not list((tmp_path / "run").glob("*.json"))


def test_health_stream_reports_a_failed_load(tmp_path: Path) -> None:
    from assistant.client import Client, DaemonUnavailable

    gate = tmp_path / "loaded"
    spec = f"fake:load_gate={gate},max_context=0"
    daemon = start_daemon(tmp_path, spec, wait=False)

    def opens_the_gate(stage: str, fraction: float, detail: str) -> None:
        if stage == "loading":  # the client watches the load: now let it fail
            gate.touch()

    try:
        with (
            Client(daemon.url, daemon.token, autostart=False, progress=opens_the_gate) as client,
            pytest.raises(DaemonUnavailable, match="could not load its model: max_context: must be >= 2"),
        ):
            client.connect()
    finally:
        gate.touch()
        daemon.proc.wait(30)
    assert daemon.proc.returncode == 2
    assert f"cannot serve {spec}: max_context: must be >= 2" in (tmp_path / "stderr.txt").read_text()


def test_the_bundled_model_is_named_for_what_it_is_not_its_folder(tmp_path):
    from assistant.config import Config
    from assistant.server.http.app import HttpApp
    from model_runtime.bundled import bundled_model_dir

    def names(model: str) -> str:
        return HttpApp(Config(model=model), loader=lambda progress: None, warmup=False).model_name()

    assert names(str(bundled_model_dir())) == "diffu-demo"
    (tmp_path / "DiffuCoder-7B-Instruct").mkdir()
    assert names(str(tmp_path / "DiffuCoder-7B-Instruct")) == "DiffuCoder-7B-Instruct"
    assert names("apple/DiffuCoder-7B-Base") == "apple/DiffuCoder-7B-Base"


def test_errors_carry_their_facts_as_fields(fake_daemon: DaemonProcess) -> None:
    from assistant.client import APIError, AsyncClient, Client

    with Client(fake_daemon.url, fake_daemon.token, autostart=False) as client:
        with pytest.raises(APIError) as info:
            client.infill("x" * 600, "", canvas_tokens=16)  # the fake's context is 512 tokens
    err = info.value
    assert err.status == 400 and err.code == "context_length_exceeded" and err.param == "prompt"
    assert err.details == {"prompt_tokens": 600, "max_new_tokens": 16, "context_length": 512}
    raw = httpx.post(
        fake_daemon.url + "/v1/chat/completions",
        headers=fake_daemon.headers,
        json={"messages": [{"role": "user", "content": "y" * 600}], "max_tokens": 8},
    ).json()["error"]
    assert raw["type"] == "invalid_request_error" and raw["details"]["context_length"] == 512

    async def streamed() -> APIError:
        async with AsyncClient(fake_daemon.url, fake_daemon.token, autostart=False) as aclient:
            try:
                async for _ in aclient.stream_generate(prompt="z" * 600, max_new_tokens=8):
                    pass
            except APIError as exc:
                return exc
        raise AssertionError("no error")

    assert asyncio.run(streamed()).details["prompt_tokens"] == 600


def test_tokenize_counts_a_text_as_a_prompt_costs_it(fake_daemon: DaemonProcess) -> None:
    """llama.cpp's ``/tokenize``, through both clients: the chat counts its files with it. The fake's
    tokenizer is one token per character, control-token strings included (they stay text)."""
    from assistant.client import APIError, AsyncClient, Client

    text = "def f(x):\n    return x  # <|im_end|>\n"
    with Client(fake_daemon.url, fake_daemon.token, autostart=False) as client:
        assert len(client.tokenize(text)) == len(text)
        assert client.tokenize("") == []
        # The prompt of a request costs what /tokenize counts: a raw prompt's usage says the same.
        done = client.generate(prompt=text, max_new_tokens=4)
        assert done.usage["prompt_tokens"] == len(client.tokenize(text))
        with pytest.raises(APIError) as info:
            client.request("POST", "/tokenize", {"content": 3})
        assert info.value.status == 400 and info.value.param == "content"
        with pytest.raises(APIError) as info:
            client.request("POST", "/tokenize", {})
        assert info.value.status == 400 and "content: required" in info.value.message
    pieces = httpx.post(
        fake_daemon.url + "/tokenize",
        json={"content": "ab", "with_pieces": True},
        headers=fake_daemon.headers,
    )
    assert pieces.json() == {
        "tokens": [{"id": ord("a") + 16, "piece": "a"}, {"id": ord("b") + 16, "piece": "b"}]
    }
    assert httpx.post(fake_daemon.url + "/tokenize", json={"content": "a"}).status_code == 401

    async def run_async() -> list[int]:
        async with AsyncClient(fake_daemon.url, fake_daemon.token, autostart=False) as client:
            return await client.tokenize(text)

    assert len(asyncio.run(run_async())) == len(text)
