"""Pausing suggestions (#34): ``diffu.toggle`` and ``diffu.snooze``, as Copilot, Tabby and llama.vim offer.

While paused, typing asks the daemon nothing; an explicit request still does. The status item says
paused (until when, for a snooze), and says ready again when a snooze ends on its own.
"""

from __future__ import annotations

import re
import time

import pytest
from pygls.exceptions import JsonRpcInvalidParams

from tests.lsp.conftest import daemon_counter, wait_for

pytestmark = pytest.mark.asyncio

SOURCE = "def total(items):\n    result = 0\n    for x in items:\n        result = \n    return result\n"


async def test_toggle_and_snooze(lsp, fake_daemon) -> None:
    session = await lsp("neovim-0.12", daemon=fake_daemon)
    uri = session.open("total.py", SOURCE)
    await wait_for(
        lambda: session.status_items and session.status_items[-1]["state"] == "ready", what="ready"
    )

    item = await session.command("diffu.toggle")
    assert item["state"] == "paused" and item["message"] == "paused until toggled"
    await wait_for(lambda: session.status_items[-1]["state"] == "paused", what="the paused status item")
    requests = daemon_counter(fake_daemon, "requests")
    assert (await session.inline(uri, 3, 17)).items == ()  # typing: nothing, and no model call
    assert daemon_counter(fake_daemon, "requests") == requests
    assert (await session.inline(uri, 3, 17, invoked=True)).items  # asked for: still made
    assert (await session.status())["paused"] is True

    assert (await session.command("diffu.toggle"))["state"] == "ready"
    await wait_for(lambda: session.status_items[-1]["state"] == "ready", what="the ready status item")
    session.replace_all(uri, SOURCE.replace("for x", "for y"))  # not from the cache
    assert (await session.inline(uri, 3, 17)).items

    # A snooze ends on its own (0.02 minutes here), and the status item says so when it does.
    item = await session.command("diffu.snooze", 0.02)
    assert item["state"] == "paused" and re.fullmatch(r"paused until \d\d:\d\d", item["message"])
    assert (await session.inline(uri, 3, 17)).items == ()
    snoozed = time.monotonic()
    await wait_for(lambda: session.status_items[-1]["state"] == "ready", what="the end of the snooze")
    assert time.monotonic() - snoozed > 0.5
    assert (await session.inline(uri, 3, 17)).items

    # Without a duration: the snoozeMinutes setting; toggling ends a snooze too.
    session.configure({"snoozeMinutes": 120})
    for _ in range(100):
        if (await session.status())["settings"]["snoozeMinutes"] == 120:
            break
    before = time.time()
    item = await session.command("diffu.snooze")
    ends = {time.strftime("%H:%M", time.localtime(t + 120 * 60)) for t in (before, time.time())}
    assert item["message"] in {f"paused until {end}" for end in ends}, item
    assert (await session.command("diffu.toggle"))["state"] == "ready"
    with pytest.raises(JsonRpcInvalidParams):
        await session.command("diffu.snooze", "a while")
    with pytest.raises(JsonRpcInvalidParams):
        await session.command("diffu.snooze", -1)
