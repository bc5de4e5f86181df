"""Warm means warm for every client (issue #44): once the daemon says ready, the first request of each of
its clients, sent as that client sends it with its built-in settings, starts without a compile: the
chat (a first question, a longer second turn, two chats at once), ``diffu generate --raw``, and each of
the editors' suggestion kinds, automatic and invoked with its candidates.

The daemon runs the fake runtime (its compiles are sleeps) taking the bundled model's
``generation_config.json``, so it chooses decoders as the bundled model does, and its program keys are
the real decoders' own (``decoders.Decoder.keys``): a request whose program the warm-up missed compiles,
and says so (``compiled_programs``, a ``waiting`` event), whatever else the daemon is doing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from assistant.client import Client, Done, Waiting
from assistant.infill.context import Mode
from assistant.infill.postprocess import scope_of
from assistant.wire import prompt_budget
from lsp.settings import Settings, context_budget, row_limit
from lsp.suggest import CANDIDATE_TEMPERATURE, mode_sampling
from model_runtime.bundled import bundled_model_dir
from tests.assistant.helpers import REPO, DaemonProcess, isolated_env, start_daemon
from tui.settings import ChatConfig, ChatSettings

# The bundled model's context (1024) and the daemon's default buckets on CPU; a compile is a tenth of a
# second, so a missed program shows as compiled_programs 1.
MODEL = f"fake:warmup_delay=0.1,step_delay=0.001,max_context=1024,generation={bundled_model_dir()}"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> DaemonProcess:
    root = tmp_path_factory.mktemp("warm-for-all")
    env = isolated_env(root, DIFFU_BATCH_BUCKETS="1,4")
    proc = start_daemon(root, MODEL, env=env, wait=False)
    proc.wait_ready(warm=False)  # /health says ok: what ready waits for is compiled
    yield proc
    proc.stop()


def answer(events: object) -> tuple[Done, list[Waiting]]:
    seen = list(events)  # type: ignore[call-overload]
    done = seen[-1]
    assert isinstance(done, Done)
    return done, [e for e in seen if isinstance(e, Waiting)]


def no_compile(done: Done, waits: list[Waiting]) -> None:
    assert done.stats.compiled_programs == 0 and not waits, (done.stats, waits)


def chat_settings(client: Client) -> ChatSettings:
    """The chat's built-in settings over the model's chat settings, as ``diffu chat`` layers them."""
    return ChatConfig().for_model(client.status().chat_settings)[0]


def test_the_chat_first_and_later_turns_and_two_chats_at_once(daemon: DaemonProcess) -> None:
    with Client(daemon.url, daemon.token, autostart=False) as client:
        settings = chat_settings(client)
        assert settings.decoder == "sliding"  # the bundled model's chat decoder (diffu_chat)

        def ask(content: str) -> tuple[Done, list[Waiting]]:
            sampling = settings.request_sampling()
            messages = [{"role": "user", "content": content}]
            return answer(
                client.stream_generate(
                    messages=messages, max_new_tokens=settings.max_new_tokens, sampling=sampling
                )
            )

        no_compile(*ask("Write a Python function `add(a, b)`."))
        # A second turn: the first exchange and another question, another length bucket.
        done, waits = ask("Now write `mean(xs)`. " + "It returns the average of the numbers. " * 6)
        no_compile(done, waits)
        assert done.stats.bucket[1] > 256
        with ThreadPoolExecutor(2) as pool:
            both = list(pool.map(ask, ["Write `square(x)`.", "Write `cube(x)`."]))
        for done, waits in both:
            no_compile(done, waits)


def test_diffu_generate_on_a_raw_prompt(daemon: DaemonProcess, tmp_path: Path) -> None:
    env = isolated_env(tmp_path, DIFFU_URL=daemon.url, DIFFU_API_KEY=daemon.token)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "assistant.cli",
            "generate",
            "--raw",
            "--json",
            "--prompt",
            "def parse_date(text):",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["stats"]["compiled_programs"] == 0


@pytest.mark.parametrize(
    ("mode", "before", "after"),
    [
        (Mode.SINGLE_LINE, "def f(x):\n    y = ", "\n    return y\n"),
        (Mode.EMPTY_LINE, "def f(x):\n    y = x + 1\n    ", "\n    return y\n"),
        (Mode.BLOCK, "def f(x):\n    if x:\n", "\n    return 0\n"),
    ],
)
def test_each_editor_suggestion_kind_automatic_and_invoked(
    daemon: DaemonProcess, mode: Mode, before: str, after: str
) -> None:
    """Each kind as ``lsp.suggest`` asks it: its canvas and end (``mode_sampling``), a prompt of the whole
    context budget (files longer than it are the common case), automatic (half the canvas in steps)
    and invoked (the greedy answer with every step, and the sampled candidates, sent at once)."""
    settings = Settings()
    canvas = {Mode.SINGLE_LINE: 24, Mode.EMPTY_LINE: 32, Mode.BLOCK: settings.max_tokens}[mode]
    lines = before.split("\n")
    scope = scope_of(lines[-1], lines[-2], mode)
    # The fake tokenizer spends a token per character: a budget's worth of file around the cursor, within
    # the row the model recommends (the bundled model's 512 tokens), which the server learns from
    # /v1/models.
    with daemon.client() as http:
        entry = http.get("/v1/models").json()["data"][0]
    assert (entry["context_length"], entry["editor_context"]) == (1024, 512)
    limit = row_limit(settings, entry["context_length"], entry["editor_context"])
    budget = prompt_budget(context_budget(settings), canvas, limit)
    prefix = "x = 1\n" * ((budget * 3 // 4) // 6) + before
    suffix = after + "# end\n" * ((budget - len(prefix) - len(after)) // 6)
    with Client(daemon.url, daemon.token, autostart=False) as client:

        def ask(
            steps: int, temperature: float | None = None, seed: int | None = None
        ) -> tuple[Done, list[Waiting]]:
            sampling = mode_sampling(settings, mode, steps, scope=scope, temperature=temperature, seed=seed)
            return answer(client.stream_infill(prefix, suffix, canvas_tokens=canvas, sampling=sampling))

        no_compile(*ask(max(1, canvas // 2)))
        candidates = [(None, None)] + [(CANDIDATE_TEMPERATURE, k) for k in range(1, settings.candidates)]
        with ThreadPoolExecutor(len(candidates)) as pool:
            for done, waits in pool.map(lambda c: ask(canvas, *c), candidates):
                no_compile(done, waits)
