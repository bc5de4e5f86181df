"""``diffu chat``: the Textual chat (live denoising, replay, history), or one ``--once`` answer.

Textual is imported inside :func:`run`, so the CLI stays fast for every other command.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from assistant.errors import UsageError


def register(subparsers: Any) -> None:
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
        default=None,
        help="answer one prompt without the full-screen UI (the denoising is drawn on "
        "stderr, the answer printed to stdout) and exit; '-' reads the prompt from stdin",
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
    if args.once is not None:
        if args.conversation:
            raise UsageError("--once answers a single prompt; it cannot be combined with --conversation")
        from tui.once import run_once
        from tui.settings import ChatSettings, apply_saved
        from tui.store import ChatStore

        prompt = sys.stdin.read() if args.once == "-" else args.once
        if not prompt.strip():
            raise UsageError("--once: the prompt is empty")
        store = ChatStore()
        try:
            saved = store.saved_settings()
        finally:
            store.close()

        def for_model(model_defaults: dict) -> ChatSettings:
            # The settings screen's saved values apply here too: one set of settings per user.
            baseline, problem = chat_config.for_model(model_defaults)
            settings, saved_problem = apply_saved(baseline, saved)
            for note in (problem, saved_problem):
                if note:
                    print(f"diffu: warning: {note}", file=sys.stderr)
            return settings

        return run_once(config, apply_saved(chat_config.settings, saved)[0], prompt, for_model=for_model)
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise UsageError("diffu chat needs a terminal; use --once PROMPT for scripts and pipes")

    from tui.app import ChatApp
    from tui.backend import DaemonBackend
    from tui.store import ChatStore

    store = ChatStore()
    try:
        if args.conversation and store.conversation(args.conversation) is None:
            raise UsageError(f"--conversation: no saved conversation {args.conversation!r}")
        app = ChatApp(
            DaemonBackend(config),
            store,
            baseline=chat_config.settings,
            for_model=chat_config.for_model,
            keymap=chat_config.keymap,
            config_file=paths.config_file(),
            conversation_id=args.conversation,
        )
        app.run()
    finally:
        store.close()
    return app.return_code or 0
