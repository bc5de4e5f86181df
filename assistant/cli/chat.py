"""``diffu chat``: the Textual chat (live denoising, replay, history, files in context), or one ``--once``
answer (``--json``: as one JSON object).

Textual is imported inside :func:`run`, so the CLI stays fast for every other command.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from assistant.errors import UsageError

ONCE_PROMPT_AFTER = "\0"  # --once given without its prompt: the positional PROMPT, or stdin

if TYPE_CHECKING:
    from assistant.client import Endpoint
    from assistant.config import Config
    from tui.app import ChatApp
    from tui.backend import Backend
    from tui.store import ChatStore


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "chat",
        help="chat with the model in a terminal UI that shows the denoising live",
        description="Chat with DiffuCoder through the diffu daemon (DIFFU_URL, a running daemon, or one "
        "started for --model). Generation settings come from the [chat] table of config.toml and the "
        "settings screen (F2); keys from its [keymap] table (F1 lists the binding ids).",
    )
    parser.add_argument(
        "--model",
        default=None,
        help="model for an auto-started daemon (default: $DIFFU_MODEL or config.toml)",
    )
    parser.add_argument(
        "--once",
        metavar="PROMPT",
        nargs="?",
        const=ONCE_PROMPT_AFTER,
        default=None,
        help="answer one prompt without the full-screen UI (the denoising is drawn on "
        "stderr, the answer printed to stdout) and exit; '-' reads the prompt from stdin, and so does "
        "--once given no prompt when stdin is not a terminal",
    )
    parser.add_argument(
        "prompt",
        nargs="?",
        metavar="PROMPT",
        default=None,
        help="the prompt of --once, when it is not given right after it (diffu chat --once --json PROMPT)",
    )
    parser.add_argument(
        "--file",
        metavar="PATH[:FIRST-LAST]",
        action="append",
        default=[],
        help="put a file (or a range of its lines) in the conversation's context; repeatable. It is read "
        "again at every turn and sent in front of the prompt (docs/chat.md has the format)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="with --once: print one JSON object (answer, finish_reason, prompt_tokens, files with their "
        "tokens, stats) instead of the answer",
    )
    parser.add_argument(
        "--conversation",
        metavar="ID",
        default=None,
        help="reopen a saved conversation (the conversations list, ctrl+o, shows them)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from assistant import paths
    from assistant.config import load_config
    from tui import keys
    from tui.settings import read_chat_config

    config, _ = load_config({"model": args.model} if args.model else None)
    chat_config = read_chat_config(paths.config_file(), keys.DESCRIPTIONS)
    check_files(args.file)
    if args.once is None and (args.prompt is not None or args.json):
        raise UsageError(
            f"{'--json' if args.json else 'a PROMPT'} goes with --once (diffu chat --once PROMPT)"
        )
    if args.once is not None:
        if args.conversation:
            raise UsageError("--once answers a single prompt; it cannot be combined with --conversation")
        from tui.once import run_once
        from tui.settings import ChatSettings, apply_saved
        from tui.store import ChatStore

        prompt = once_prompt(args.once, args.prompt)
        store = ChatStore()
        try:
            saved = store.saved_settings()
        finally:
            store.close()

        def for_model(model_defaults: Mapping[str, object]) -> ChatSettings:
            # The settings screen's saved values apply here too: one set of settings per user.
            baseline, problem = chat_config.for_model(model_defaults)
            settings, saved_problem = apply_saved(baseline, saved)
            for note in (problem, saved_problem):
                if note:
                    print(f"diffu: warning: {note}", file=sys.stderr)
            return settings

        settings = apply_saved(chat_config.settings, saved)[0]
        return run_once(config, settings, prompt, files=args.file, as_json=args.json, for_model=for_model)
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise UsageError("diffu chat needs a terminal; use --once PROMPT for scripts and pipes")

    from tui.backend import DaemonBackend
    from tui.store import ChatStore

    store = ChatStore()
    backend = DaemonBackend(config)
    try:
        if args.conversation and store.conversation(args.conversation) is None:
            raise UsageError(f"--conversation: no saved conversation {args.conversation!r}")
        app = chat_app(backend, store, conversation_id=args.conversation, files=args.file)
        app.run()
    finally:
        store.close()
    if backend.started_daemon is not None:
        after_chat(config, backend.started_daemon)
    return app.return_code or 0


def once_prompt(once: str, positional: str | None) -> str:
    """The prompt of ``--once``: its value, the positional PROMPT, or stdin (``-``, or none given and
    stdin not a terminal)."""
    if once != ONCE_PROMPT_AFTER and positional is not None:
        raise UsageError(f"two prompts: --once {once!r} and {positional!r}; give one")
    prompt = positional if once == ONCE_PROMPT_AFTER else once
    if prompt == "-" or (prompt is None and not sys.stdin.isatty()):
        prompt = sys.stdin.read()
    if not (prompt or "").strip():
        raise UsageError("--once: the prompt is empty")
    return prompt or ""


def check_files(refs: Sequence[str]) -> None:
    """Each ``--file`` must be a readable text file (one line for the first that is not) before anything
    starts; whether it fits is checked against the model once the daemon is reached."""
    from assistant.workspace.files import parse_ref, read_text, select_lines

    for text in refs:
        ref = parse_ref(text)
        select_lines(read_text(Path(ref.path), ref.path), ref)


def chat_app(
    backend: Backend, store: ChatStore, *, conversation_id: str | None = None, files: Sequence[str] = ()
) -> ChatApp:
    """The full-screen chat as ``diffu chat`` runs it: settings and keymap from config.toml, layered over
    the model's chat defaults once connected (``scripts/first_use.py`` drives this same app)."""
    from assistant import paths
    from tui import keys
    from tui.app import ChatApp
    from tui.settings import read_chat_config

    chat_config = read_chat_config(paths.config_file(), keys.DESCRIPTIONS)
    return ChatApp(
        backend,
        store,
        baseline=chat_config.settings,
        for_model=chat_config.for_model,
        keymap=chat_config.keymap,
        config_file=paths.config_file(),
        conversation_id=conversation_id,
        files=files,
    )


def after_chat(config: Config, started: Endpoint) -> None:
    """What becomes of the daemon this chat started, said on stderr: stopped with the chat
    (``stop_daemon_with_chat``), or left running with the model warm, and how to stop it."""
    from assistant import discovery
    from assistant.client import spawn
    from model_runtime.memory import resident_bytes

    info = started.info
    if info is None:
        return
    if not discovery.is_live(info):
        # It was stopped or replaced while the chat ran: name the daemon that serves the model now.
        now = discovery.find_daemon(config.model)
        running = (
            f"pid {now.pid} ({now.url}) serves {now.model} now; 'diffu daemon stop' stops it"
            if now is not None
            else f"no daemon serves {config.model} now"
        )
        print(f"diffu: the daemon this chat started (pid {info.pid}) has exited; {running}", file=sys.stderr)
        return
    if config.stop_daemon_with_chat:
        stopped = spawn.stop_daemon(info, timeout=config.shutdown_grace + 5)
        state = "stopped" if stopped else "could not stop (see 'diffu daemon logs')"
        print(f"diffu: {state} the daemon this chat started (pid {info.pid})", file=sys.stderr)
        return
    resident = resident_bytes(info.pid)
    memory = f", {resident / 2**20:.0f} MB" if resident else ""
    print(
        f"diffu: the daemon this chat started (pid {info.pid}, {started.url}{memory}) keeps the model "
        "loaded and compiled for the next chat, diffu generate and your editor; 'diffu daemon stop' "
        "stops it (stop_daemon_with_chat = true in config.toml: with the chat)",
        file=sys.stderr,
    )
