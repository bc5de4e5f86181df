"""The server's connection to the daemon as the user sees it (#34 B, C, E): it comes back after the daemon
restarts even while the user keeps typing, the status item follows the connection as it changes, and the
daemon's start-up stages are said once ("loading the model", never "loading the model: loading the model").
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path

import pytest
from lsprotocol import types

from assistant.client.calls import warm_body
from assistant.wire import ENDED, HEALTH_OK, Stage
from lsp.daemon_link import RETRY_SECONDS, LinkHooks, Progress
from lsp.settings import Settings
from lsp.state import STAGES, stage_message, status_item
from lsp.suggest import warm_shapes
from tests.assistant.helpers import isolated_env, start_daemon
from tests.lsp.conftest import wait_for

SOURCE = "def total(items):\n    result = 0\n    for x in items:\n        result = \n    return result\n"

# What the daemon says beside its stage (scheduler, loader, fake loader), and errors the server reports
# as the "failed" stage.
DAEMON_DETAILS = (
    "loading the model",
    "reading config",
    "loading weights",
    "loading fake weights",
    "downloading DiffuCoder from the Hugging Face hub",
    "ready",
    "warming (1 of 3)",
    "model load failed",
    "stopped",
    "cannot reach the diffu daemon at http://127.0.0.1:9: [Errno 111] Connection refused",
    "the diffu daemon could not load its model: no config.json",
)


MODEL = "fake:step_delay=0.002,load_delay=1.0"  # both daemons: one model, so one discovery file


def _discovery_env(shared: Path) -> dict[str, str]:
    """A server that knows no URL and finds the daemon of ``MODEL`` as editors do: its discovery file."""
    dirs = ("DIFFU_CONFIG_DIR", "DIFFU_RUNTIME_DIR", "DIFFU_LOG_DIR")
    return {"DIFFU_MODEL": MODEL, **{k: v for k, v in isolated_env(shared).items() if k in dirs}}


def _stems(text: str) -> Counter[str]:
    words = "".join(c.lower() if c.isalpha() else " " for c in text).split()
    return Counter(w[:4] for w in words if len(w) >= 4)


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_no_stage_words_twice(stage: str) -> None:
    """E: every stage with every detail the daemon sends: no word of the stage said twice."""
    assert stage_message(stage, "") == STAGES[stage]
    for detail in (*DAEMON_DETAILS, STAGES[stage], stage):
        message = stage_message(stage, detail)
        if detail == "ready" and stage not in (Stage.READY, HEALTH_OK, *ENDED):
            continue  # a step's own "ready" (test_a_loaded_model_is_not_said_to_be_ready)
        assert detail in message, (stage, detail, message)  # the detail is never lost
        phrase, said = _stems(STAGES[stage]), _stems(detail)
        repeated = {s for s, n in _stems(message).items() if n > max(phrase[s], said[s])}
        assert not repeated, f"{stage!r} + {detail!r} -> {message!r} repeats {sorted(repeated)}"


@pytest.mark.parametrize("stage", [Stage.STARTING, Stage.LOADING, Stage.COMPILING, Stage.WARMING])
def test_a_loaded_model_is_not_said_to_be_ready(stage: str) -> None:
    """#44 E: the model loader reports "ready" once the weights are in (stage ``loading``, 100%), and the
    status item said "loading the model: ready" while the daemon could not answer yet."""
    message = stage_message(stage, "ready")
    assert "ready" not in message, message
    assert stage_message(Stage.LOADING, "ready") == "model loaded"
    item = status_item(
        enabled=True,
        paused=None,
        link_state="connecting",
        busy=False,
        error="",
        detail=message,
        latency_ms=None,
        model="",
    )
    assert item.state == "connecting" and "ready" not in item.message


class RecordedProgress:
    """The editor's side of ``$/progress`` (pygls's ``Progress``), recording what the server sends."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str | None, int | None]] = []

    async def create_async(self, token: str) -> None:
        del token

    def begin(self, token: str, value: types.WorkDoneProgressBegin) -> None:
        self.sent.append(("begin", value.message, value.percentage))

    def report(self, token: str, value: types.WorkDoneProgressReport) -> None:
        self.sent.append(("report", value.message, value.percentage))

    def end(self, token: str, value: types.WorkDoneProgressEnd) -> None:
        self.sent.append(("end", value.message, None))


@pytest.mark.asyncio
async def test_progress_reports_only_what_changed() -> None:
    """#44 E: the loader reports every tensor it places (52 updates in 5 s, 23 of them the percentage
    before); the editor gets a report only when the words or the whole percentage change."""
    editor = RecordedProgress()
    hooks = LinkHooks(
        log=lambda message, *, level="info", show=False: None,
        changed=lambda: None,
        warm_shapes=lambda context: [],
        work_done=lambda: editor,  # type: ignore[arg-type,return-value]
    )
    progress = Progress(hooks)
    updates = [(Stage.LOADING, 0.0, "reading config")]
    updates += [(Stage.LOADING, i / 300, "loading weights") for i in range(301)]
    updates += [
        (Stage.LOADING, 1.0, "ready"),
        (Stage.COMPILING, 0.0, "compiling the clients' first programs (0 of 2)"),
    ]
    for stage, fraction, detail in updates:
        progress(stage, fraction, detail)
        for _ in range(3):  # the task forwards each update before the next one comes
            await asyncio.sleep(0)
    progress(HEALTH_OK, 1.0, "")
    await wait_for(lambda: editor.sent and editor.sent[-1][0] == "end", what="the end of the progress")
    shown = [(message, percentage) for kind, message, percentage in editor.sent if kind != "end"]
    assert all(a != b for a, b in zip(shown, shown[1:], strict=False)), shown  # no report repeats one
    # Every change is said: each whole percentage of the load, then the model loaded, then compiling.
    assert [p for m, p in shown if m == "loading weights"] == list(range(81))
    assert shown[-2:] == [
        ("model loaded", 80),
        ("compiling the clients' first programs (0 of 2)", 80),
    ]
    assert editor.sent[-1] == ("end", "model ready", None)


@pytest.mark.asyncio
async def test_status_says_ready_as_soon_as_connected(lsp, fake_daemon) -> None:
    """C: the status item follows the connection when it is made, not when a first suggestion ends: no
    suggestion is ever asked for here, and it says ready."""
    session = await lsp("neovim-0.12", daemon=fake_daemon)
    await wait_for(lambda: any("connected to" in m for m in session.logs()), what="the connection")
    await wait_for(
        lambda: session.status_items and session.status_items[-1]["state"] == "ready",
        what="a status item saying ready after the connection",
    )
    assert session.status_items[-1]["model"] == "fake"


@pytest.mark.asyncio
async def test_reconnects_after_a_restart_while_the_user_types(lsp, tmp_path: Path, capsys) -> None:
    """B: the daemon stops; another starts (a new port, found through its discovery file) while the user
    types, a request a second. Every request inside the fail-fast window used to start the window again,
    so the server never looked for the new daemon; now it is back within the window after it is ready."""
    shared = tmp_path / "shared"
    env = _discovery_env(shared)
    first = start_daemon(shared, MODEL, env=isolated_env(shared))
    second = None
    session = await lsp("neovim-0.12", env=env)  # no URL: the discovery file, as editors find daemons
    uri = session.open("total.py", SOURCE)
    try:
        assert (await session.inline(uri, 3, 17, invoked=True)).items
        assert (await session.status())["url"] == first.url
        first.stop()
        answers: list[tuple[float, bool]] = []
        typing = True

        async def type_along() -> None:
            while typing:
                result = await session.inline(uri, 3, 17, invoked=True)  # invoked: never the cache
                answers.append((time.monotonic(), bool(result.items)))
                await asyncio.sleep(1.0)

        typist = asyncio.ensure_future(type_along())
        await wait_for(lambda: answers and not answers[-1][1], what="requests failing without a daemon")
        second = start_daemon(shared, MODEL, env=isolated_env(shared), wait=False)
        await asyncio.to_thread(second.wait_ready, warm=False)
        ready = time.monotonic()
        await wait_for(lambda: answers and answers[-1][1], timeout=RETRY_SECONDS + 10, what="a suggestion")
        typing = False
        await typist
        # Connected again (the status item says ready) within the window after the daemon is ready; the
        # next request (a second later at most) gets its suggestion.
        lost = next(i for i, item in enumerate(session.status_items) if item["state"] == "unavailable")
        back = next(
            t
            for t, item in zip(session.status_times[lost:], session.status_items[lost:], strict=True)
            if item["state"] == "ready"
        )
        answered = next(t for t, ok in answers if ok)
        with capsys.disabled():
            print(
                f"\nafter the new daemon was ready: reconnected in {back - ready:.2f} s, a suggestion in",
                end="",
            )
            print(f" {answered - ready:.2f} s")
        assert back - ready < RETRY_SECONDS + 0.5, (back - ready, answers)
        assert answered - back < 1.0 + 0.5
        assert (await session.status())["url"] == second.url != first.url
        assert session.status_items[-1]["state"] == "ready"
        assert any(i["state"] == "unavailable" for i in session.status_items)
    finally:
        first.stop()
        if second is not None:
            second.stop()


@pytest.mark.asyncio
async def test_reconnects_while_nobody_types(lsp, tmp_path: Path) -> None:
    """B: with no request at all, the server finds the restarted daemon on its own and says so."""
    shared = tmp_path / "shared"
    env = _discovery_env(shared)
    first = start_daemon(shared, MODEL, env=isolated_env(shared))
    second = None
    session = await lsp("neovim-0.12", env=env)
    uri = session.open("total.py", SOURCE)
    try:
        assert (await session.inline(uri, 3, 17, invoked=True)).items
        first.stop()
        assert (await session.inline(uri, 3, 17, invoked=True)).items == ()
        await wait_for(lambda: session.status_items[-1]["state"] == "unavailable", what="unavailable")
        second = start_daemon(shared, MODEL, env=isolated_env(shared))
        # The link retries every RETRY_SECONDS: it finds the new daemon by itself, without a request.
        await wait_for(
            lambda: session.status_items[-1]["state"] == "ready",
            timeout=10 * RETRY_SECONDS,
            what="the status item to say ready again",
        )
        assert (await session.status())["url"] == second.url
        assert (await session.inline(uri, 3, 17, invoked=True)).items
        assert not [m for m in session.client.messages if m.type == types.MessageType.Error][1:]
    finally:
        first.stop()
        if second is not None:
            second.stop()


@pytest.mark.asyncio
async def test_a_transparent_reconnection_names_the_live_daemon_and_warms_it(lsp, tmp_path: Path) -> None:
    """#44 E: the daemon is replaced between two requests (found through its discovery file); the client
    reconnects on its own inside the next request, which succeeds. The server used to keep naming the dead
    daemon's URL in diffu.status and never asked the new daemon to compile the editor's shapes."""
    shared = tmp_path / "shared"
    env = _discovery_env(shared)
    first = start_daemon(shared, MODEL, env=isolated_env(shared))
    second = None
    # A temperature the daemon's own warm-up does not use: those programs come only from the editor.
    settings = {"temperature": 0.5}
    session = await lsp("neovim-0.12", env=env, settings=settings)
    uri = session.open("total.py", SOURCE)
    try:
        assert (await session.inline(uri, 3, 17, invoked=True)).items
        assert (await session.status())["url"] == first.url
        first.stop()
        second = start_daemon(shared, MODEL, env=isolated_env(shared))
        assert (await session.inline(uri, 3, 17, invoked=True)).items  # no failure: reconnected inside
        assert not any(item["state"] == "unavailable" for item in session.status_items)
        for _ in range(500):
            status = await session.status()
            if status["url"] != first.url:
                break
            await asyncio.sleep(0.02)
        assert status["url"] == second.url

        def asked() -> list[str]:
            return [m for m in session.logs() if "asked the daemon to warm" in m]

        await wait_for(lambda: len(asked()) == 2, what="a warm request to each daemon")
        await wait_for(lambda: second.health()["stage"] == "ready", what="the new daemon's warm-up")
        with second.client() as http:
            entry = http.get("/v1/models").json()["data"][0]
            shapes = warm_shapes(Settings(temperature=0.5), entry["context_length"], entry["editor_context"])
            again = http.post("/v1/diffu/warm", json=warm_body(shapes)).json()
        assert again["queued"] == 0 and again["compiled"] == list(range(len(shapes))), (again, asked())
    finally:
        first.stop()
        if second is not None:
            second.stop()
