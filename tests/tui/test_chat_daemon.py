"""``diffu chat`` against real daemons: the fake runtime (no JAX) and, end to end, a tiny checkpoint."""

from __future__ import annotations

import asyncio
import fcntl
import io
import os
import re
import select
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from rich.console import Console
from textual.widgets import Button

from assistant import discovery
from assistant.cli.chat import after_chat
from assistant.client import Client, SamplingOptions
from assistant.client import start_daemon as start_background
from assistant.config import Config, load_config
from tests.assistant.helpers import (
    REPO,
    DaemonProcess,
    isolated_env,
    run_cli_opening_gate,
    start_daemon,
    stop_background_daemons,
    wait_until,
)
from tests.tui.helpers import answered, ask, open_gate_when_loading, screen_text, until
from tui.app import ChatApp
from tui.backend import DaemonBackend
from tui.once import run_once
from tui.render import header_text
from tui.settings import ChatSettings
from tui.store import ChatStore
from tui.widgets import ErrorNotice

SIZE = (100, 34)
PROMPT = "Write a function that adds two numbers."


def daemon_config(daemon: DaemonProcess) -> Config:
    return Config(url=daemon.url, api_key=daemon.token, autostart=False)


def counters(daemon: DaemonProcess) -> dict[str, int]:
    return httpx.get(daemon.url + "/v1/diffu/status", headers=daemon.headers).json()["counters"]


def running(daemon: DaemonProcess) -> int:
    return httpx.get(daemon.url + "/v1/diffu/status", headers=daemon.headers).json()["queue"]["running"]


@pytest.mark.asyncio
async def test_escape_stops_the_job_on_the_daemon(
    fake_daemon: DaemonProcess, make_app: Callable[..., ChatApp]
) -> None:
    settings = ChatSettings(max_new_tokens=16, steps=1000, temperature=0.0)  # 20 s at 20 ms a step
    app = make_app(DaemonBackend(daemon_config(fake_daemon)), baseline=settings)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.connected)
        cancelled_before = (await asyncio.to_thread(counters, fake_daemon))["cancelled"]
        answer = await ask(pilot, "def slow():")
        await until(pilot, lambda: len(answer.trace) >= 3)
        assert "/1000 · " in screen_text(app)
        await pilot.press("escape")
        await until(pilot, lambda: not answer.live)
        assert answer.finish_reason == "cancelled" and len(answer.trace) < 1000
        # The daemon stopped the job (not only the client stopped reading): nothing runs, one more
        # cancelled job in its counters.
        assert await asyncio.to_thread(wait_until, lambda: running(fake_daemon) == 0, 5.0)
        assert (await asyncio.to_thread(counters, fake_daemon))["cancelled"] == cancelled_before + 1
        assert "cancelled at step" in screen_text(app)


@pytest.mark.asyncio
async def test_a_setting_the_daemon_refuses_is_shown_inline(
    fake_daemon: DaemonProcess, make_app: Callable[..., ChatApp]
) -> None:
    settings = ChatSettings(max_new_tokens=16, steps=2000)  # the daemon's max_steps is 1024
    app = make_app(DaemonBackend(daemon_config(fake_daemon)), baseline=settings)
    async with app.run_test(size=SIZE) as pilot:
        answer = await ask(pilot, PROMPT)
        await until(pilot, lambda: answer.query(ErrorNotice))
        shown = screen_text(app)
        assert "the daemon refused the request (400): steps: must be <= 1024" in shown
        assert answer.query_one("#open-settings", Button) and "Traceback" not in shown


@pytest.mark.asyncio
async def test_a_model_that_fails_to_load_is_reported_inline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make_app: Callable[..., ChatApp]
) -> None:
    # The model loads until the gate file appears, which the chat opens once it shows the load: its health
    # stream is open then, however slowly this machine runs, so it hears why the load failed.
    gate = tmp_path / "loaded"
    daemon = start_daemon(tmp_path / "bad", f"fake:load_gate={gate},max_context=0", wait=False)
    open_gate_when_loading(monkeypatch, gate)
    try:
        app = make_app(DaemonBackend(daemon_config(daemon)))
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.query(ErrorNotice), timeout=20)
            # The notice is in the DOM before it is painted: wait for the screen to show it (a fresh-clone CI
            # run on a busy machine read the screen in between).
            await until(pilot, lambda: "could not load its model" in screen_text(app), timeout=10)
            shown = screen_text(app)
            assert "could not load its model: max_context: must be >= 2" in shown and "Retry" in shown
            assert not app.connected and "Traceback" not in shown
    finally:
        gate.touch()
        daemon.proc.wait(30)


@pytest.mark.asyncio
async def test_auto_starts_a_daemon_with_visible_progress(
    diffu_home: Path, monkeypatch: pytest.MonkeyPatch, make_app: Callable[..., ChatApp]
) -> None:
    # The model loads until the gate file appears, which the chat opens once it has shown the load: on two
    # cores busy with the rest of the suite the health stream can open seconds after the daemon announced
    # itself, and a load of a fixed time could be over by then (a 0.5 s one was, in a fresh-clone CI run).
    gate = diffu_home / "loaded"
    monkeypatch.setenv("DIFFU_MODEL", f"fake:load_gate={gate},warmup_delay=0.1")
    monkeypatch.setenv("DIFFU_PORT", "0")
    shown = open_gate_when_loading(monkeypatch, gate)
    app = make_app(DaemonBackend(load_config()[0]))
    try:
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.connected, timeout=60)
            stages = [stage for stage, _, _ in shown]
            assert stages[1] == "starting" and "fake:load_gate=" in shown[1][2]
            # Loaded, then the chat's first program compiled, and only then ready.
            assert stages.index("loading") < stages.index("compiling") < stages.index("ok") == len(stages) - 1
            # The clients' first programs (the chat's, the editors', the HTTP APIs') compile before ready.
            first = next(d for s, _, d in shown if s == "compiling")
            assert re.fullmatch(r"compiling the clients' first programs \(0 of \d+\)", first), first
            await answered(pilot, PROMPT)
    finally:
        gate.touch()
        stop_background_daemons(diffu_home)


def test_once_draws_the_canvas_in_place_then_prints_the_answer(fake_daemon: DaemonProcess) -> None:
    settings = ChatSettings(max_new_tokens=24, steps=6, temperature=0.0)
    terminal = io.StringIO()
    out = io.StringIO()
    console = Console(file=terminal, force_terminal=True, width=80, color_system=None)
    assert run_once(daemon_config(fake_daemon), settings, PROMPT, out=out, console=console) == 0
    with Client(config=daemon_config(fake_daemon)) as client:
        expected = client.generate(
            messages=[{"role": "user", "content": PROMPT}],
            max_new_tokens=settings.max_new_tokens,
            sampling=settings.request_sampling(),
        )
    assert out.getvalue() == expected.text + "\n"
    drawn = terminal.getvalue()
    assert "/6 · " in drawn and "░" in drawn and "tokens revealed" in drawn  # the live canvas
    assert "diffu: ready" not in drawn  # the daemon was ready: no progress line
    assert "\x1b[2K" in drawn or "\x1b[1A" in drawn  # redrawn in place, not scrolled


def test_diffu_chat_once_command(fake_daemon: DaemonProcess, diffu_home: Path, store: ChatStore) -> None:
    # Settings saved from the settings screen apply to --once too (and keep this test short).
    settings = ChatSettings(max_new_tokens=24, steps=6, temperature=0.0)
    store.save_settings(settings.to_dict())
    env = {
        **fake_daemon.env,
        "DIFFU_URL": fake_daemon.url,
        "DIFFU_API_KEY": fake_daemon.token,
        "DIFFU_DATA_DIR": str(diffu_home / "data"),
    }

    def chat(*args: str, stdin: str | None = None, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "assistant.cli", "chat", *args],
            cwd=REPO,
            env={**env, **extra},
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
        )

    once = chat("--once", PROMPT)
    assert once.returncode == 0, once.stderr
    with Client(config=daemon_config(fake_daemon)) as client:
        expected = client.generate(
            messages=[{"role": "user", "content": PROMPT}],
            max_new_tokens=settings.max_new_tokens,
            sampling=settings.request_sampling(),
        )
    assert once.stdout == expected.text + "\n" and "Traceback" not in once.stderr
    # An answer that fills its canvas gets a note on stderr: one line, not wrapped at 80 columns although
    # stderr is a pipe. The fake fills the canvas for about half the prompts; take the first that does.
    with Client(config=daemon_config(fake_daemon)) as client:
        full = next(
            p
            for p in (f"{PROMPT} ({i})" for i in range(20))
            if client.generate(
                messages=[{"role": "user", "content": p}],
                max_new_tokens=settings.max_new_tokens,
                sampling=settings.request_sampling(),
            ).finish_reason
            == "length"
        )
    noted = chat("--once", full)
    assert noted.returncode == 0
    assert "diffu: note: the answer filled the whole canvas (max_new_tokens) and may be cut short\n" in (
        noted.stderr
    )
    piped = chat("--once", "-", stdin=PROMPT)
    assert piped.returncode == 0 and piped.stdout == once.stdout  # greedy: the same answer
    empty = chat("--once", "  ")
    assert empty.returncode == 2 and "diffu: error: --once: the prompt is empty" in empty.stderr
    gone = chat("--once", PROMPT, DIFFU_URL="http://127.0.0.1:9", DIFFU_AUTOSTART="0")
    assert gone.returncode == 2 and "cannot reach the diffu daemon at http://127.0.0.1:9" in gone.stderr
    assert "Traceback" not in gone.stderr
    no_tty = chat()
    assert no_tty.returncode == 2 and "diffu chat needs a terminal; use --once" in no_tty.stderr


def test_quitting_says_the_daemon_keeps_the_model_warm_or_stops_it_when_set(
    diffu_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = load_config({"model": "fake:warmup_delay=0.1", "port": 0})[0]
    started = start_background(config)
    assert started.info is not None
    try:
        after_chat(config, started)
        said = capsys.readouterr().err
        pid = started.info.pid
        assert said.startswith(f"diffu: the daemon this chat started (pid {pid}, {started.url}, ")
        assert "'diffu daemon stop' stops it (stop_daemon_with_chat = true in config.toml" in said
        assert " MB) keeps the model loaded" in said and said.count("\n") == 1
        assert discovery.find_daemon(config.model) is not None  # still there
        after_chat(config.replace(stop_daemon_with_chat=True), started)
        assert capsys.readouterr().err == f"diffu: stopped the daemon this chat started (pid {pid})\n"
        assert not list((diffu_home / "run").glob("*.json"))  # gone: lock and discovery file removed
        # Replaced while the chat ran (stopped, another one started for the model): the message names the
        # one that serves the model now, never the dead one as if it ran.
        other = start_background(config)
        assert other.info is not None and other.info.pid != pid
        after_chat(config, started)
        said = capsys.readouterr().err
        assert said == (
            f"diffu: the daemon this chat started (pid {pid}) has exited; pid {other.info.pid} "
            f"({other.url}) serves {config.model} now; 'diffu daemon stop' stops it\n"
        )
    finally:
        stop_background_daemons(diffu_home)


def test_once_on_a_daemon_it_starts_says_each_stage_on_one_line_each(diffu_home: Path) -> None:
    gate = diffu_home / "loaded"  # the model loads until this appears: once the loading stage was said
    env = isolated_env(
        diffu_home,
        DIFFU_MODEL=f"fake:load_gate={gate},warmup_delay=0.5",
        DIFFU_PORT="0",
        DIFFU_DATA_DIR=str(diffu_home / "data"),
    )
    try:
        code, lines, out, err = run_cli_opening_gate(
            ["chat", "--once", PROMPT], env, gate, lambda line: line.startswith("diffu: loading")
        )
    finally:
        stop_background_daemons(diffu_home)
    assert code == 0 and out.strip(), "".join(lines) + err
    lines = "".join([*lines, err]).splitlines()
    # Not a terminal: one line per stage. Its request goes as soon as the daemon takes requests, while the
    # chat's program still compiles (it waits for that one compile, not for the rest of the warm-up), and
    # no half-ready state is reported as ready.
    assert re.fullmatch(r"diffu: compiling the clients' first programs \(0 of \d+\)", lines[-1]), lines
    assert any(line.startswith("diffu: loading") for line in lines)
    assert not [line for line in lines if "warming" in line or "ready" in line]


def test_diffu_chat_answers_in_a_real_terminal(
    fake_daemon: DaemonProcess, diffu_home: Path, store: ChatStore
) -> None:
    """The real entry point on a pseudo-terminal: it starts, answers a typed prompt, and ctrl+q quits."""
    store.save_settings(ChatSettings(max_new_tokens=24, steps=6, temperature=0.0).to_dict())
    env = {
        **fake_daemon.env,
        "DIFFU_URL": fake_daemon.url,
        "DIFFU_API_KEY": fake_daemon.token,
        "DIFFU_DATA_DIR": str(diffu_home / "data"),
        "TERM": "xterm-256color",
        "COLUMNS": "100",
        "LINES": "30",
    }
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
    proc = subprocess.Popen(
        [sys.executable, "-m", "assistant.cli", "chat"],
        cwd=REPO,
        env=env,
        stdin=slave,
        stdout=slave,
        stderr=slave,
        start_new_session=True,
    )
    os.close(slave)
    seen = bytearray()

    def read_until(needle: bytes, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while needle not in seen:
            ready, _, _ = select.select([master], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise AssertionError(f"no {needle!r} on the terminal; it showed {bytes(seen[-2000:])!r}")
            try:
                seen.extend(os.read(master, 65536))
            except OSError:  # the child closed the terminal
                raise AssertionError(f"the chat exited; it showed {bytes(seen[-2000:])!r}") from None

    try:
        read_until(b"fake")  # connected: the model's name in the header
        os.write(master, b"hello\r")
        read_until(b"6 steps")  # the answer's stats line, under its Markdown
        os.write(master, b"\x11")  # ctrl+q
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(10)
        os.close(master)
    assert [m.role for m in store.messages(store.conversations()[0].id)] == ["user", "assistant"]


@pytest.mark.asyncio
async def test_end_to_end_with_a_tiny_checkpoint(
    tiny_daemon: DaemonProcess, make_app: Callable[..., ChatApp], store: ChatStore
) -> None:
    settings = ChatSettings(max_new_tokens=16, steps=8, temperature=0.0)
    app = make_app(DaemonBackend(daemon_config(tiny_daemon)), baseline=settings)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.connected, timeout=30)
        assert "DiffuCoder-micro" in app.sub_title
        answer = await ask(pilot, "Add two numbers.")
        # Its program compiles first: about 18 s on 2 loaded cores, over a minute at a load of 9 (a busy
        # fresh-clone run timed out at 60 s). The limit only ends a run that would never finish.
        await until(pilot, lambda: not answer.live, timeout=300)
        assert answer.finish_reason in ("stop", "length") and answer.stats["steps"] == 8
        # Every step arrived, the masks only went down, and the last step left none.
        masks = [frame.masks for frame in answer.trace.frames]
        assert [f.step for f in answer.trace.frames] == list(range(8)) and masks[-1] == 0
        assert all(a >= b for a, b in zip(masks, masks[1:], strict=False)) and masks[0] > 0
        assert "8 steps" in screen_text(app)
    saved = store.messages(app.conversation_id or "")
    assert [m.role for m in saved] == ["user", "assistant"] and saved[1].content == answer.content
    assert store.trace(saved[1].id) == answer.trace


def test_config_file_chat_and_keymap_tables_drive_the_command(
    fake_daemon: DaemonProcess, diffu_home: Path
) -> None:
    config = diffu_home / "config" / "config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    env = {
        **fake_daemon.env,
        "DIFFU_URL": fake_daemon.url,
        "DIFFU_API_KEY": fake_daemon.token,
        "DIFFU_DATA_DIR": str(diffu_home / "data"),
        "DIFFU_CONFIG_DIR": str(config.parent),
    }

    def once() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "assistant.cli", "chat", "--once", PROMPT],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    config.write_text('[chat]\nmax_new_tokens = 12\nsteps = 3\ntemperature = 0.0\n[keymap]\nreplay = "f9"\n')
    answer = once()
    assert answer.returncode == 0, answer.stderr
    with Client(config=daemon_config(fake_daemon)) as client:
        expected = client.generate(
            messages=[{"role": "user", "content": PROMPT}],
            max_new_tokens=12,
            sampling=SamplingOptions(
                steps=3, temperature=0.0, top_p=0.95, alg="entropy", decoder="reference"
            ),
        )
    assert answer.stdout == expected.text + "\n"
    config.write_text("[chat]\nsteps = 0\n")
    bad = once()
    assert bad.returncode == 2 and "config.toml: [chat] steps: must be >= 1, got 0" in bad.stderr
    config.write_text('[keymap]\nreplai = "f9"\n')
    bad = once()
    assert bad.returncode == 2 and "[keymap] replai: unknown binding id" in bad.stderr


@pytest.fixture(scope="module")
def fast_daemon(tmp_path_factory: pytest.TempPathFactory, micro_dir: Path):  # type: ignore[no-untyped-def]
    """A daemon whose model recommends the fast decoder (as the bundled demo model does)."""
    from tests.assistant.helpers import TINY_ENV, isolated_env
    from tests.model_copies import with_generation_config

    root = tmp_path_factory.mktemp("fast-daemon")
    model = with_generation_config(micro_dir, root / "DiffuCoder-micro-fast", diffu_decoder="fast")
    # No warm-up: what is checked here is the stream, and a warm-up of every client's shapes would compile
    # programs this test never runs.
    daemon = start_daemon(root, str(model), "--no-warmup", env=isolated_env(root, **TINY_ENV))
    yield daemon
    daemon.stop()


@pytest.mark.asyncio
async def test_streaming_with_the_fast_decoder_shows_tokens_landing_inside_a_block(
    fast_daemon: DaemonProcess, make_app: Callable[..., ChatApp], store: ChatStore
) -> None:
    """Every forward is a frame: a 16-token block fills over several, not at once; header, summary,
    stats and the saved history count the same steps."""
    settings = ChatSettings(max_new_tokens=32, temperature=0.0, block_length=16)
    app = make_app(DaemonBackend(daemon_config(fast_daemon)), baseline=settings)
    headers: list[str] = []
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.connected, timeout=30)
        answer = await ask(pilot, "Add two numbers.")

        def finished() -> bool:  # and what the live header read meanwhile
            line = next((ln for ln in screen_text(app).splitlines() if "· block " in ln), None)
            if line and (not headers or headers[-1] != line):
                headers.append(line)
            return not answer.live

        await until(pilot, finished, timeout=120)
        assert answer.finish_reason in ("stop", "length")
        frames = answer.trace.frames
        assert all(f.blocks == 2 for f in frames) and "step " in headers[0] and "· block " in headers[0]
        # Inside the first block: frames where it is partly filled (the second block still all masks).
        inside = [f for f in frames if f.block == 0 and 16 < f.masks < 32]
        assert len(inside) >= 3, [(f.block, f.masks) for f in frames]
        assert all(len(f.unmasked) >= 1 for f in frames)  # every forward committed something
        # One count of steps everywhere: the frames, the last header, the stats, the summary line.
        steps = answer.stats["steps"]
        assert [f.step for f in frames] == list(range(steps))
        assert header_text(answer.trace).plain.startswith(f"step {steps} · block ")
        assert f"{steps} steps" in screen_text(app)
    saved = store.messages(app.conversation_id or "")
    assert len(store.trace(saved[1].id).frames) == steps
