"""The other clients' first requests for ``scripts/first_use.py``: once the chat has answered, the daemon
ready and warm, each other client sends the request it sends with its defaults, one kind at a time:

1. ``diffu generate --raw`` (its own parser, settings and request: ``assistant.cli.generate``);
2. two chats at once: two more chats' first prompts, sent together (the chat's backend and settings);
3. each editor suggestion kind (the cursor line, an empty line, a block), automatic and invoked, as
   ``diffu lsp`` asks for them (``lsp.suggest.ask`` on a ``DaemonLink`` connected as the server's is, its
   warm-up request included, with ``lsp.settings.Settings()``).

Each request is streamed (the same programs as unstreamed: the daemon runs the same steps and only sends
them), so its record holds the seconds from its send to its first forward (the first ``step`` event),
its ``waiting`` events and why, and what it compiled (``DoneStats``). Issue #44's goal: within
:data:`GOAL_SECONDS`, with no compile and no wait.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from assistant.client import Done, Step, Waiting
    from assistant.daemon_status import DaemonStatus
    from lsp.settings import Settings
    from lsp.suggest import Cursor
    from tui.settings import ChatSettings

    Messages = list[dict[str, str]]

GOAL_SECONDS = 1.0  # issue #44: every client's first request starts its first forward within this
# A raw prompt as ``diffu generate --raw`` takes it: a function's signature and docstring.
RAW_PROMPT = 'def fibonacci(n: int) -> int:\n    """Return the n-th Fibonacci number (0, 1, 1, 2, ...)."""\n'
# The file the editor suggestions are asked in (longer than the prompt's budget, as most files are), and
# the code typed into it before the last top-level function, the cursor at its end, per kind.
DOCUMENT = "assistant/server/warmup.py"
TYPED = {
    "single_line": "def total(values: list[int]) -> int:\n    result = 0\n    for value in values:\n"
    "        result += value\n    return ",
    "empty_line": "def total(values: list[int]) -> int:\n    result = 0\n    ",
    "block": "def total(values: list[int]) -> int:\n    ",
}


async def other_clients(chats: Sequence[tuple[Messages, ChatSettings]]) -> dict[str, Any]:
    """Every other client's first requests, one kind at a time; ``chats``: two first prompts as the chat
    sent them (messages and settings). Each record's ``sent`` is monotonic."""
    records = [await asyncio.to_thread(raw_generate)]
    records += await two_chats(chats)
    editors, log = await editor_kinds()
    return {"other_clients": records + editors, "editor_log": log}


def start(what: str, status: DaemonStatus) -> dict[str, Any]:
    """A request's record as it is sent: what the daemon compiles meanwhile, the send time (monotonic)."""
    return {
        "what": what,
        "daemon_compiling": status.engine.compiling,
        "daemon_stage": status.engine.stage,
        "waits": [],
        "sent": time.monotonic(),
    }


def note(record: dict[str, Any], event: Step | Waiting | Done, sent: float) -> None:
    """One event of the request into its record: a wait, its first step, its answer and what it cost."""
    from assistant.client import Done, Step, Waiting

    now = round(time.monotonic() - sent, 3)
    if isinstance(event, Waiting):
        record["waits"].append({"at": now, "reason": event.reason, "detail": event.detail})
    elif isinstance(event, Step):
        record.setdefault("first_step_seconds", now)
    elif isinstance(event, Done):
        stats = event.stats
        record["answer_seconds"] = now
        record["compile_seconds"] = stats.compile_seconds
        record["compiled_programs"] = stats.compiled_programs
        record["cache_hits"] = stats.cache_hits
        record["queue_seconds"] = stats.queue_seconds
        record["batch_size"] = stats.batch_size
        record["bucket"] = list(stats.bucket) if stats.bucket else None
        record["prompt_tokens"] = stats.prompt_tokens
        record["finish_reason"] = event.finish_reason


def raw_generate() -> dict[str, Any]:
    """``diffu generate --raw`` through the daemon, as its ``run`` sends it (``--json``: no live view)."""
    import argparse

    from assistant.cli import generate
    from assistant.cli.model_options import daemon_config, sampling_params
    from assistant.client import Client

    parser = argparse.ArgumentParser()
    generate.register(parser.add_subparsers())
    args = parser.parse_args(["generate", "--prompt", RAW_PROMPT, "--raw", "--json", "--daemon"])
    config = daemon_config(args, local_only=("history",))
    assert config is not None, "--daemon: through the daemon"

    class Timed(Client):
        record: dict[str, Any]

        def stream_generate(self, **kwargs: Any) -> Iterator[Step | Waiting | Done]:
            for event in super().stream_generate(**kwargs):
                note(self.record, event, self.record["sent"])
                yield event

    client = Timed(config=config, autostart=args.daemon, wait_compiled=False)
    with client:  # as generate's run makes it
        status = client.status()
        params = sampling_params(args, model=status.chat_defaults)
        client.record = start("diffu generate --raw", status)
        generate._daemon_answer(client, args, RAW_PROMPT, params)
    return client.record


async def two_chats(chats: Sequence[tuple[Messages, ChatSettings]]) -> list[dict[str, Any]]:
    """Two more chats (a backend each, as two ``diffu chat``), their first prompts sent at once."""
    from assistant.config import load_config
    from tui.backend import DaemonBackend

    backends = [DaemonBackend(load_config()[0]) for _ in chats]
    for backend in backends:
        await backend.connect(lambda stage, fraction, detail: None)
    status = await backends[0].status()
    records = [start(f"two chats at once, chat {i + 1}", status) for i in range(len(chats))]

    async def chat(i: int) -> None:
        messages, settings = chats[i]
        events = backends[i].generate(messages, settings, session=f"first-use-chat-{i + 1}")
        async for event in events:
            note(records[i], event, records[i]["sent"])

    try:
        await asyncio.gather(*(chat(i) for i in range(len(chats))))
    finally:
        for backend in backends:
            await backend.aclose()
    return records


async def editor_kinds() -> tuple[list[dict[str, Any]], list[str]]:
    """Each suggestion kind, automatic then invoked, as ``diffu lsp`` asks for it; and the link's log."""
    from assistant.client import APIError, AsyncClient, DaemonUnavailable, Done
    from lsp.daemon_link import DaemonLink, LinkHooks
    from lsp.settings import Settings
    from lsp.suggest import ask, warm_shapes

    settings = Settings()
    log: list[str] = []

    def say(message: str, *, level: str = "info", show: bool = False) -> None:
        log.append(message)

    hooks = LinkHooks(
        say,
        lambda: None,
        lambda context, recommended: warm_shapes(settings, context, recommended),
        lambda: None,
    )
    link = DaemonLink(hooks)
    # As the server configures it, but never starting a second daemon: the chat's runs.
    link.configure(url=settings.url, api_key=settings.api_key, model=settings.model, autostart=False)
    connected = await link.ready()  # the server's connection: the daemon's facts, its warm-up request
    assert link.config is not None
    deadline = time.monotonic() + 10
    while link.warmed is None and time.monotonic() < deadline:
        await asyncio.sleep(0.05)

    class Timed(AsyncClient):
        """The server's client, its infill streamed to see the first step (the same request else)."""

        record: dict[str, Any]

        async def infill(self, prefix: str, suffix: str = "", **kwargs: Any) -> Done:
            candidate: dict[str, Any] = {"session": kwargs.get("session"), "waits": []}
            self.record["candidates"].append(candidate)
            events: AsyncIterator[Step | Waiting | Done] = self.stream_infill(prefix, suffix, **kwargs)
            try:
                async for event in events:
                    note(candidate, event, self.record["sent"])
                    if isinstance(event, Done):
                        return event
            except APIError as exc:  # a prompt too long: the link learns from it and sends it again
                candidate["refused"] = exc.message
                raise
            raise DaemonUnavailable("the daemon ended the stream without an answer")

    # The link's own client's settings (lsp.daemon_link.DaemonLink._build).
    timeout = link.config.max_seconds + 60
    client = Timed(config=link.config, timeout=timeout, wait_compiled=False)
    records = []
    try:
        for kind, cursor in cursors(settings):
            status = await client.status()
            record = client.record = start(f"editor, {kind}", status) | {"candidates": []}
            asked = await ask(link, client, cursor, settings, (), "first-use-editor")
            record.update(canvas=asked.plan.canvas, steps=asked.plan.steps)
            records.append(summed(record))
    finally:
        await client.aclose()
        await connected.aclose()
    return records, log


def cursors(settings: Settings) -> Iterator[tuple[str, Cursor]]:
    """Per suggestion kind, a cursor in :data:`DOCUMENT` that ``lsp.suggest.plan`` gives that kind,
    automatic (typing) then invoked (the user's key)."""
    from lsp.suggest import Cursor, plan

    text = (Path(__file__).resolve().parents[1] / DOCUMENT).read_text(encoding="utf-8")
    cut = text.rfind("\ndef ") + 1
    for kind, typed in TYPED.items():
        for invoked in (False, True):
            cursor = Cursor(DOCUMENT, "python", text[:cut] + typed, "\n\n\n" + text[cut:], invoked)
            mode = plan(cursor, settings).mode.value
            if mode != kind:
                raise RuntimeError(f"the {kind} cursor is a {mode} for lsp.suggest.plan")
            how = "invoked: greedy and sampled candidates" if invoked else "automatic"
            yield f"{kind.replace('_', ' ')} ({how})", cursor


def summed(record: dict[str, Any]) -> dict[str, Any]:
    """An editor request's figures from its candidates': the first step of any, the last answer, every
    wait and compile (a candidate the daemon refused, its prompt too long, was rebuilt and sent again)."""
    answered = [c for c in record["candidates"] if "answer_seconds" in c]
    steps = [c["first_step_seconds"] for c in answered if "first_step_seconds" in c]
    if steps:
        record["first_step_seconds"] = min(steps)
    record["answer_seconds"] = max((c["answer_seconds"] for c in answered), default=None)
    record["waits"] = [w for c in record["candidates"] for w in c["waits"]]
    for key in ("compile_seconds", "compiled_programs", "cache_hits"):
        record[key] = round(sum(c[key] for c in answered), 3)
    record["batch_size"] = max((c["batch_size"] for c in answered), default=0)
    record["prompt_tokens"] = max((c["prompt_tokens"] for c in answered), default=0)
    record["sent_again"] = sum("refused" in c for c in record["candidates"])
    return record


def show_clients(records: Sequence[dict[str, Any]]) -> list[str]:
    """Print the other clients' lines; return their problems (a compile, or a wait)."""
    if not records:
        return []
    print(f"other clients' first requests, one kind at a time (goal: first forward within {GOAL_SECONDS} s):")
    problems = []
    for r in records:
        first = r.get("first_step_seconds")
        said = "none" if first is None else f"{first:.2f} s"
        late = " OVER" if first is None or first > GOAL_SECONDS else ""
        waits = "; ".join(f"{w['reason']}: {w['detail']}" for w in r["waits"]) or "none"
        compiled = r.get("compiled_programs", 0), r.get("cache_hits", 0), r.get("compile_seconds", 0)
        again = f", {r['sent_again']} sent again (prompt too long)" if r.get("sent_again") else ""
        print(
            f"- {r['what']}, sent {r['sent_after_ready']:.1f} s after ready while the daemon compiled: "
            f"{r['daemon_compiling'] or 'nothing'}\n"
            f"  first forward after {said} (goal {GOAL_SECONDS} s){late}; waited for: {waits}; compiled "
            f"{compiled[0]} program(s), {compiled[1]} from the cache, {compiled[2]:.2f} s; batch "
            f"{r.get('batch_size', 0)}, {r.get('prompt_tokens', 0)} prompt tokens{again}; answer after "
            f"{r.get('answer_seconds') or 0:.2f} s"
        )
        if any(compiled):
            problems.append(f"{r['what']} compiled (issue #44: no compile after the chat's first answer)")
        if r["waits"]:
            problems.append(f"{r['what']} waited ({waits})")
        if first is None:
            problems.append(f"{r['what']} never ran a step")
    return problems
