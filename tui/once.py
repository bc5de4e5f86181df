"""``diffu chat --once PROMPT``: one answer without the full-screen app, for scripts and quick questions.

While the answer denoises, the canvas is drawn in place on stderr (when it is a terminal; a transient Rich
Live, redrawn at most 30 times a second); then the final answer is printed to stdout, so
``diffu chat --once "..." > answer.md`` captures only the answer. With stderr not a terminal either, the
answer is asked for without its steps. ``--file`` puts files in front of the prompt as the full chat
does (:mod:`tui.context`: one line for the first that cannot be sent, and nothing is); ``--json`` prints
one object (the answer, the prompt's tokens, each file's) instead of the answer. No Textual import on this
path.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

from rich.console import Console, Group
from rich.live import Live

from assistant.client import APIError, Client, DaemonUnavailable, Done, Step, Waiting, stderr_progress
from assistant.config import Config
from assistant.errors import UsageError
from assistant.wire import HEALTH_OK
from assistant.workspace.files import with_files
from tui.context import ChatContext, ContextFile, Limit
from tui.render import (
    Trace,
    answer_stats,
    canvas_text,
    header_text,
    retried_note,
    retried_stats,
    retry_label,
    summary,
)
from tui.settings import ChatSettings

_NOTES = {
    "length": "the answer filled the whole canvas (max_new_tokens) and may be cut short",
    "time": "the daemon's time budget ran out; the answer is unfinished",
    "cancelled": "the daemon cancelled the request",
}


def loading_progress() -> Callable[[str, float, str], None]:
    """Report a daemon's loading and compiling on stderr, and nothing when it was ready anyway."""
    report = stderr_progress()
    loading = False

    def progress(stage: str, fraction: float, detail: str) -> None:
        nonlocal loading
        if stage != HEALTH_OK or loading:
            loading = True
            report(stage, fraction, detail)

    return progress


def run_once(
    config: Config,
    settings: ChatSettings,
    prompt: str,
    *,
    files: Sequence[str] = (),
    root: Path | None = None,
    as_json: bool = False,
    out: TextIO | None = None,
    console: Console | None = None,
    for_model: Callable[[dict[str, Any]], ChatSettings] | None = None,
) -> int:
    """Answer ``prompt`` (one user turn, ``files`` in front of it), showing the denoising live; returns
    the exit code. ``as_json``: no live view, one JSON object on ``out`` instead of the answer.

    ``for_model`` turns the model's chat defaults (from the daemon's status) into the settings to use,
    layered as the full chat layers them; without it, ``settings`` are used as they are.
    """
    out = out or sys.stdout
    console = console or Console(stderr=True, soft_wrap=True)
    watched = console.is_terminal and not as_json  # a live view only for someone watching
    done: Done | None = None
    retried: dict[str, Any] | None = None
    try:
        with (
            # Its request goes as soon as the daemon takes it: the chat's first program, if still being
            # compiled, is waited for then, and the daemon's other ready-time compiles are not.
            Client(config=config, progress=loading_progress(), wait_compiled=False) as client,
            Live(console=console, transient=True, refresh_per_second=30, vertical_overflow="crop") as live,
        ):
            status = client.status()
            if for_model is not None:
                settings = for_model(status.chat_settings)
            limit = Limit(status.max_context, settings.max_new_tokens)
            blocks, in_context = _context_files(client, files, root or Path.cwd(), limit)
            messages = [{"role": "user", "content": with_files(blocks, prompt)}]
            trace, done = _answer(client, live, watched, messages, settings)
            retry = settings.retry_for(done.text, done.finish_reason) if done is not None else None
            if done is not None and retry is not None:
                # The chat's answer is the second decode's (see ChatSettings.retry_settings).
                retried = retried_stats(done.stats, retry)
                trace, done = _answer(client, live, watched, messages, retry, label=retry_label(retry))
    except (DaemonUnavailable, APIError) as exc:
        raise UsageError(str(exc)) from None
    if done is None:
        raise UsageError("the daemon ended the stream without an answer")
    stats = answer_stats(done.stats, retried)
    if as_json:
        result = {
            "answer": done.text,
            "finish_reason": done.finish_reason,
            "prompt_tokens": int(done.usage.get("prompt_tokens", done.stats.prompt_tokens)),
            "files": [{"path": f.name, "tokens": f.tokens} for f in in_context],
            "stats": stats,
        }
        out.write(json.dumps(result) + "\n")
        out.flush()
        return 0
    out.write(done.text if done.text.endswith("\n") else done.text + "\n")
    out.flush()
    if console.is_terminal:
        console.print(f"[dim]{summary(stats, len(trace))}[/]")
    if done.finish_reason in _NOTES:
        console.print(f"diffu: note: {_NOTES[done.finish_reason]}", style="yellow", highlight=False)
    if retried is not None and not console.is_terminal:  # a terminal saw it in the summary line
        console.print(f"diffu: note: {retried_note(retried)}", style="yellow", highlight=False)
    return 0


def _context_files(
    client: Client, refs: Sequence[str], root: Path, limit: Limit
) -> tuple[list[str], list[ContextFile]]:
    """The files' blocks for the prompt, counted by the daemon; a UsageError (one line) when any cannot
    be sent, as the full chat refuses them."""
    if not refs:
        return [], []

    async def count(text: str) -> int:
        return len(client.tokenize(text))  # one short request; this command has nothing else to do

    context = ChatContext(root, count)

    async def read() -> tuple[list[str], list[str]]:
        refused = [line for line, error in await context.add(list(refs), limit) if error]
        if refused:
            return [], refused
        return await context.blocks(limit)

    blocks, problems = asyncio.run(read())
    if problems:
        raise UsageError("; ".join(problems))
    return blocks, context.files


def _answer(
    client: Client,
    live: Live,
    watched: bool,
    messages: list[dict[str, str]],
    settings: ChatSettings,
    *,
    label: str = "",
) -> tuple[Trace, Done | None]:
    """One decode of the answer, drawn live (under ``label``) when someone watches; its trace and final
    event."""
    trace = Trace(settings.max_new_tokens)
    tokens, sampling = settings.max_new_tokens, settings.request_sampling()
    if not watched:
        # Nobody sees a live view: ask for the answer alone, which the daemon runs without a host
        # round trip per step (the fast decoder then runs each block as one program).
        return trace, client.generate(messages=messages, max_new_tokens=tokens, sampling=sampling)
    done: Done | None = None
    for event in client.stream_generate(messages=messages, max_new_tokens=tokens, sampling=sampling):
        if isinstance(event, Step):
            trace.add(event)
            # Live redraws on its own clock (30 Hz); update() only swaps what it draws.
            live.update(Group(header_text(trace, label=label), canvas_text(event)), refresh=False)
        elif isinstance(event, Waiting):
            trace.waiting = event
            live.update(header_text(trace, label=label), refresh=False)
        else:
            done = event
    return trace, done
