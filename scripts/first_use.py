"""A newcomer's first minutes with ``diffu chat``, scripted: is "ready" ready, and does a prompt ever wait
for a compile it does not need?

    python scripts/first_use.py [--repo .] [--fresh] [--json OUT.json]

Every diffu directory and the XDG cache (JAX's persistent compilation cache) is a new empty temporary
directory. ``--fresh`` first clones ``--repo`` and installs it into a new virtualenv (``pip install -e
.``, not timed), as the README's quick start does; without it this checkout's ``.venv`` is used. Then the
chat itself (``assistant.cli.chat.chat_app``, driven by Textual's Pilot in a child process of that
installation) starts a daemon for the bundled model, as ``diffu chat`` does, and:

1. as soon as it shows ready (its connection bar gone), sends a first prompt;
2. right after that answer, a second prompt of another length in the same conversation (its prompt holds
   the first exchange: another length bucket);
3. presses ctrl+n, waits until the daemon is compiling an editor shape in the background (60 s at most),
   and sends a third prompt;
4. then, the chat open and idle, each other client's first request with its defaults, one kind at a time
   (``scripts/first_use_clients.py``): a raw ``diffu generate``, two chats' first prompts at once, and
   each editor suggestion kind (the cursor line, an empty line, a block), automatic and invoked, as
   ``diffu lsp`` sends them.

For each request it records what the daemon was compiling when it was sent, every ``waiting`` event it
got and why, its own compile seconds (and, for the other clients, the programs it compiled or read from
the cache), the seconds to its first step and to its answer. It prints them with the machine and the load
average, each other client's seconds to its first forward beside issue #44's goal (1 s, marked OVER past
it), and exits 1 when the first prompt waited for a compile, any request waited for the warm-up, or any
other client's request compiled or waited (``--json`` writes the figures).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.first_contact import ROOT, cpu_name, fresh_install  # noqa: E402
from scripts.first_use_clients import note, other_clients, show_clients, start  # noqa: E402

if TYPE_CHECKING:
    from textual.pilot import Pilot

    from assistant.daemon_status import DaemonStatus
    from tui.app import ChatApp
    from tui.settings import ChatSettings

PROMPTS = (
    "Write a Python function `reverse_string(s)`. Return the string reversed.",
    "Now write a Python function `count_vowels(text)`. Return how many vowels (a, e, i, o and u, in either "
    "case) the text holds; every other character, digits, spaces and punctuation included, counts for "
    "nothing, and an empty text gives 0.",
    "Write a Python function `square(x)`. Return the square of x.",
)
EDITOR_WAIT = 60.0  # seconds to wait for an editor compile before the third prompt


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=Path, default=ROOT, help="the checkout to measure (default: this one)")
    parser.add_argument("--fresh", action="store_true", help="clone --repo and pip install it first")
    parser.add_argument("--timeout", type=float, default=1200.0, help="seconds allowed for the session")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument("--drive", action="store_true", help=argparse.SUPPRESS)  # the child's part
    args = parser.parse_args()
    if args.drive:
        print(json.dumps(asyncio.run(drive())))
        return 0

    work = Path(tempfile.mkdtemp(prefix="diffu-first-use-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DIFFU_", "XDG_", "JAX_"))}
    for name in ("config", "runtime", "log", "data"):
        env[f"DIFFU_{name.upper()}_DIR"] = str(work / name)
    env["XDG_CACHE_HOME"] = str(work / "cache")  # JAX's persistent compilation cache lives here
    repo = args.repo
    try:
        if args.fresh:
            diffu = fresh_install(repo, work)
            repo = diffu.parents[2]
        python = repo / ".venv/bin/python"
        if not python.exists():
            print(f"no {python}: install the checkout first (or pass --fresh)", file=sys.stderr)
            return 2
        load_before = os.getloadavg()
        child = subprocess.run(
            [str(python), str(repo / "scripts/first_use.py"), "--drive"],
            env=env, cwd=repo, capture_output=True, text=True, timeout=args.timeout,
        )  # fmt: skip
        load_after = os.getloadavg()
        if child.returncode != 0:
            print(f"the chat session failed ({child.returncode}):\n{child.stderr[-4000:]}", file=sys.stderr)
            return 1
        session = json.loads(child.stdout.strip().splitlines()[-1])
    finally:
        # Never leave a daemon behind, whatever failed.
        subprocess.run(
            [str(repo / ".venv/bin/diffu"), "daemon", "stop"], env=env, capture_output=True, check=False
        )
        shutil.rmtree(work, ignore_errors=True)
    report = {
        "machine": f"{os.cpu_count()} cores, {cpu_name()}",
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in load_after],
        "fresh_clone": args.fresh,
        **session,
    }
    problems = show(report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 1 if problems else 0


def show(report: dict[str, Any]) -> list[str]:
    """Print the figures; return what went against "ready means ready" (empty when nothing did)."""
    print(f"machine: {report['machine']}")
    before, after = report["load_average_before"], report["load_average_after"]
    print(f"load average (1, 5, 15 min): {before} before, {after} after")
    print(
        f"the chat showed ready {report['ready_seconds']:.1f} s after it started "
        "(daemon auto-started, empty caches)"
    )
    problems = []
    for r in report["requests"]:
        waits = "; ".join(f"{w['reason']}: {w['detail']}" for w in r["waits"]) or "none"
        print(
            f"- {r['what']} (decode {r['decode']}), sent {r['sent_after_ready']:.1f} s after ready while the "
            f"daemon compiled: {r['daemon_compiling'] or 'nothing'}\n"
            f"  waited for: {waits}; its own compile {r['compile_seconds']:.2f} s; first step after "
            f"{r['first_step_seconds']:.2f} s; answer after {r['answer_seconds']:.2f} s"
        )
        if r["what"] == "first prompt" and r["decode"] == 1 and (r["waits"] or r["compile_seconds"] > 0):
            problems.append("the first prompt sent at ready waited for a compile")
        if any(w["reason"] == "warm-up" for w in r["waits"]):
            problems.append(f"{r['what']} waited for the warm-up's compile")
    problems += show_clients(report.get("other_clients", []))
    for problem in problems:
        print(f"PROBLEM: {problem}")
    return problems


async def drive() -> dict[str, Any]:
    """The child: the chat as ``diffu chat`` builds it, driven by Pilot; the figures as a dict."""
    from assistant.cli.chat import chat_app
    from assistant.client import Done, Step, Waiting
    from assistant.config import load_config
    from tui.backend import DaemonBackend
    from tui.store import ChatStore

    records: list[dict[str, Any]] = []
    asked: dict[str, tuple[list[dict[str, str]], ChatSettings]] = {}  # each prompt's first decode

    class TimedBackend(DaemonBackend):
        """The chat's own backend, noting each request's waits, first step and answer."""

        what = "first prompt"

        async def generate(
            self, messages: list[dict[str, str]], settings: ChatSettings, *, session: str | None = None
        ) -> AsyncIterator[Step | Waiting | Done]:
            record = start(self.what, await self.status())
            record["decode"] = 1 + sum(1 for r in records if r["what"] == self.what)
            records.append(record)
            asked.setdefault(self.what, ([dict(m) for m in messages], settings))
            async for event in super().generate(messages, settings, session=session):
                note(record, event, record["sent"])
                yield event

    backend = TimedBackend(load_config()[0])
    store = ChatStore()
    app = chat_app(backend, store)
    app.animation_level = "none"
    started = time.monotonic()
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            ready = await converse(Conversation(app, pilot, backend))
            # Two more chats' first prompts: the first and the one after ctrl+n, as the chat sent them.
            others = await other_clients([asked["first prompt"], asked["prompt after ctrl+n"]])
    finally:
        store.close()
    for r in records + others["other_clients"]:
        r["sent_after_ready"] = round(r.pop("sent") - ready, 3)
    return {
        "ready_seconds": round(ready - started, 3),
        "prompts": list(PROMPTS),
        "requests": records,
        **others,
    }


class Labelled(Protocol):
    """drive's TimedBackend: the chat's backend, with the label of the request it sends next."""

    what: str

    async def status(self) -> DaemonStatus: ...


@dataclass
class Conversation:
    """The chat under Pilot, and its backend (whose ``what`` labels the next request)."""

    app: ChatApp
    pilot: Pilot[None]
    backend: Labelled

    async def until(self, predicate: Callable[[], object], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                return False
            await self.pilot.pause(0.05)
        return True

    async def send(self, what: str, text: str) -> None:
        """Type ``text`` and send it; wait for its answer, drawn as Markdown."""
        from textual.widgets import Markdown

        from tui.widgets import AnswerView, PromptInput

        app = self.app
        self.backend.what = what
        before = len(app.query(AnswerView))
        prompt = app.query_one(PromptInput)
        prompt.focus()
        prompt.load_text(text)
        await self.pilot.press("enter")
        await self.until(lambda: len(app.query(AnswerView)) > before, 60)
        answer = list(app.query(AnswerView))[-1]
        if not await self.until(lambda: not answer.live and answer.query(Markdown), 600):
            raise RuntimeError(f"no answer to the {what} within 600 s")

    async def editor_compiling(self) -> bool:
        status = await self.backend.status()
        return "infill" in (status.engine.compiling or "")


async def converse(chat: Conversation) -> float:
    """The prompts, as a user sends them once the chat connected; when it connected (monotonic)."""
    if not await chat.until(lambda: chat.app.connected, 600):
        raise RuntimeError("the chat did not connect within 600 s")
    ready = time.monotonic()
    await chat.send("first prompt", PROMPTS[0])
    await chat.send("second prompt, another length", PROMPTS[1])
    await chat.pilot.press("ctrl+n")
    deadline = time.monotonic() + EDITOR_WAIT
    while time.monotonic() < deadline and not await chat.editor_compiling():
        await chat.pilot.pause(0.2)
    await chat.send("prompt after ctrl+n", PROMPTS[2])
    return ready


if __name__ == "__main__":
    sys.exit(main())
