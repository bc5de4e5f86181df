"""#44: typing never starves suggestions. A keystroke every 300 ms, each sending a suggestion request (as
an editor does), against a daemon whose suggestion takes longer than that (the fake model, 8 steps of
100 ms): each request used to supersede the one before it, cancelling its daemon job, so no suggestion
ever arrived while the user typed. The assertions count answers and daemon jobs, never time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from lsprotocol import types
from pygls.exceptions import JsonRpcRequestCancelled

from tests.assistant.helpers import DaemonProcess, isolated_env, start_daemon
from tests.lsp.conftest import Session, daemon_counter, daemon_running, wait_for

pytestmark = pytest.mark.asyncio

SOURCE = "def total(items):\n    result = 0\n    for x in items:\n        result = \n    return result\n"
LINE, COLUMN = 3, 17  # the end of "        result = "
SETTINGS = {"steps": 8, "debounceMs": 0}  # 8 fake steps of 100 ms: each suggestion takes 0.8 s or more
KEYSTROKE_SECONDS = 0.3


@pytest.fixture(scope="module")
def slow_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    root = tmp_path_factory.mktemp("slow-daemon")
    daemon = start_daemon(root, "fake:step_delay=0.1", env=isolated_env(root))
    yield daemon
    daemon.stop()


async def type_along(
    session: Session, daemon: DaemonProcess, keys: str
) -> tuple[list[tuple[str, list[str]]], int]:
    """Type ``keys`` at the end of the line, one every KEYSTROKE_SECONDS, each followed by an automatic
    request, without waiting for the answers (an editor does not). Returns (what was typed since the
    first key, the texts offered) for each request but the last (nothing supersedes it), and how many
    daemon jobs completed before the last key was typed."""
    uri = session.open("total.py", SOURCE)
    completed = daemon_counter(daemon, "completed")
    requests: list[tuple[str, asyncio.Future[Any]]] = []
    for i, key in enumerate(keys):
        if i:
            await asyncio.sleep(KEYSTROKE_SECONDS)
        if i == len(keys) - 1:
            completed = daemon_counter(daemon, "completed") - completed
        session.insert(uri, LINE, COLUMN + i, key)
        requests.append((keys[1 : i + 1], asyncio.ensure_future(session.inline(uri, LINE, COLUMN + i + 1))))
    answers = [(typed, [item.insert_text for item in (await request).items]) for typed, request in requests]
    return answers[:-1], completed


async def test_typing_what_the_model_suggests_gets_suggestions_while_typing(
    lsp, slow_daemon: DaemonProcess, capsys
) -> None:
    """The user types what the model would suggest after their first key. The suggestion made for the
    first key is let finish while the next keys are typed, and offered, trimmed by them; later keys are
    answered from it too. Before, every request was superseded before its answer: none was offered."""
    first = "x"
    oracle = await lsp("neovim-0.12", daemon=slow_daemon, settings=SETTINGS)
    uri = oracle.open("total.py", SOURCE.replace("result = \n", f"result = {first}\n"))
    (item,) = (await oracle.inline(uri, LINE, COLUMN + 1)).items  # what the model says after that key
    meant = item.insert_text
    assert len(meant) >= 8, meant
    session = await lsp("neovim-0.12", daemon=slow_daemon, settings=SETTINGS)
    answers, completed = await type_along(session, slow_daemon, first + meant[:-1])
    offered = [(typed, texts) for typed, texts in answers if texts]
    with capsys.disabled():
        print(f"\ntyping along: {len(offered)} of {len(answers)} requests offered a suggestion", end="")
        print(f" ({completed} daemon jobs completed)")
    assert offered, answers
    for typed, texts in offered:
        assert texts == [meant[len(typed) :]], (typed, texts)  # what is left of it after what was typed
    status = await session.status()
    assert status["counters"]["joined"] >= 1


async def test_typing_something_else_still_completes_suggestions(
    lsp, slow_daemon: DaemonProcess, capsys
) -> None:
    """The user types what the model does not suggest: nothing stale is offered, and the daemon still
    finishes suggestions while the keys come (the newest request makes its own once the one it waited
    for does not continue what was typed). Before, every job was cancelled by the next keystroke."""
    session = await lsp("neovim-0.12", daemon=slow_daemon, settings=SETTINGS)
    answers, completed = await type_along(session, slow_daemon, "q" * 12)  # the fake model has no q
    with capsys.disabled():
        print(f"\ntyping something else: {completed} daemon jobs completed for {len(answers)} requests")
    assert all(not texts for _, texts in answers), answers
    assert completed >= 2, completed


async def test_a_request_the_editor_cancels_leaves_its_suggestion_to_the_next_one(
    lsp, slow_daemon: DaemonProcess
) -> None:
    """VS Code cancels its request ($/cancelRequest) on each keystroke before it sends the next one: the
    cancelled request's daemon job runs on for the request that follows, which offers its answer. With
    no request following, the job is cancelled after a short while."""
    session = await lsp("neovim-0.12", daemon=slow_daemon, settings=SETTINGS)
    uri = session.open("total.py", SOURCE)
    requests = daemon_counter(slow_daemon, "requests")
    first = asyncio.ensure_future(session.inline(uri, LINE, COLUMN, msg_id="key-1"))
    await wait_for(lambda: daemon_running(slow_daemon) >= 1, what="the job to run")
    session.client.cancel_request(types.CancelParams(id="key-1"))
    with pytest.raises(JsonRpcRequestCancelled):
        await first
    again = await session.inline(uri, LINE, COLUMN)  # the next request, at the same place
    assert again.items and daemon_counter(slow_daemon, "requests") == requests + 1
    assert (await session.status())["counters"]["joined"] == 1
    # Nobody follows a cancelled request: its job does not run to its end.
    cancelled = daemon_counter(slow_daemon, "cancelled")
    session.insert(uri, LINE, COLUMN, "(")
    lone = asyncio.ensure_future(session.inline(uri, LINE, COLUMN + 1, msg_id="key-2"))
    await wait_for(lambda: daemon_running(slow_daemon) >= 1, what="the second job to run")
    session.client.cancel_request(types.CancelParams(id="key-2"))
    with pytest.raises(JsonRpcRequestCancelled):
        await lone
    await wait_for(lambda: daemon_counter(slow_daemon, "cancelled") > cancelled, what="the job's cancel")
