"""``diffu fill PATH[:FIRST-LAST]``: fill every hole of a file (``???`` or a run of ``<|mask|>``) in one
diffusion run, watching the file itself denoise, then review the diff and write it.

While it runs, the lines around the holes are drawn in place on stderr (when it is a terminal), the holes'
masks resolving step by step in the file's own text with the chat's glyphs. Then the unified diff is
printed and, on a terminal, ``Write PATH? [y/N]`` asked; ``--write`` writes without asking, ``--json``
prints ``{"path", "holes", "fills", "written"}`` instead of the diff. The file is written atomically
(``assistant.workspace.edits``) and only if it still holds what the fills were made from. The hole logic is
the language server's (``assistant.infill.holes``), and the daemon is reached as every client reaches it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from assistant.cli.flags import add_flag, flag_error
from assistant.errors import UsageError
from assistant.infill.holes import FillOptions
from model_runtime.options import OptionError, options

if TYPE_CHECKING:
    from rich.console import Console

    from assistant.client import Client, Done
    from assistant.infill.holes import FillPlan, Hole

FILL = options(FillOptions)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "fill",
        help="fill the holes (??? or <|mask|>) of a file in one diffusion run, live, then write the diff",
        description="Fill every hole of PATH (or of its lines FIRST-LAST) in one run of the daemon's model, "
        "drawn live in the file's own text; then show the diff and, on y, write it (atomically, and only if "
        "the file did not change meanwhile).",
    )
    parser.add_argument("path", metavar="PATH[:FIRST-LAST]", help="the file, optionally a range of its lines")
    parser.add_argument("--write", action="store_true", help="write the filled file without asking")
    parser.add_argument(
        "--json",
        action="store_true",
        help='print {"path", "holes", "fills", "written"} instead of the diff (never asks; --write writes)',
    )
    for name in FILL:
        add_flag(parser, FILL[name])
    parser.add_argument(
        "--model",
        default=None,
        help="model for an auto-started daemon (default: $DIFFU_MODEL or config.toml)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from assistant.client import APIError, Client, DaemonUnavailable
    from assistant.config import load_config
    from assistant.infill.holes import HoleError, apply_fills, plan_fill, target_fills
    from assistant.workspace.edits import Change, Snapshot, target, write
    from assistant.workspace.files import decode_text, display_path, language_of, line_span, parse_ref
    from tui.once import loading_progress

    try:
        fill = FillOptions(**{name: getattr(args, name) for name in FILL})
    except OptionError as exc:
        raise UsageError(flag_error(exc)) from None
    ref = parse_ref(args.path)
    name = display_path(Path(ref.path), Path.cwd())
    before = Snapshot.take(target(Path(ref.path), name))  # first: the fills go into these bytes
    if before.data is None:
        raise UsageError(f"{ref.path}: no such file")
    text = decode_text(before.data, name)
    start, end = line_span(text, ref)
    console = Console(stderr=True, soft_wrap=True)
    config, _ = load_config({"model": args.model} if args.model else None)
    try:
        plan = plan_fill(text, path=name, language=language_of(name), options=fill, start=start, end=end)
        with Client(config=config, progress=loading_progress(), wait_compiled=False) as client:
            done = _run(client, plan, fill, console if console.is_terminal and not args.json else None)
        fills = target_fills(text, plan.prompt, plan.targets, done.holes)
    except HoleError as exc:
        raise UsageError(str(exc)) from None
    except (DaemonUnavailable, APIError) as exc:
        raise UsageError(str(exc)) from None
    change = Change(name, before, apply_fills(text, plan.targets, fills).encode("utf-8"))
    got = sum(1 for f in fills if f)
    written = False
    if not args.json:
        _show(change.diff())
    if got and (args.write or (not args.json and _ask(console, change.name))):
        write(change)  # a StaleChange (the file changed meanwhile) is a UsageError: nothing written
        written = True
    if args.json:
        holes = [_hole(text, h, fill_text) for h, fill_text in zip(plan.targets, fills, strict=True)]
        print(json.dumps({"path": name, "holes": holes, "fills": fills, "written": written}))
        return 0
    skipped = f"; {len(fills) - got} got no text (their markers stay)" if got < len(fills) else ""
    if written:
        state = f"wrote {name}"
    elif not got:
        state = f"{name} not written: the model gave no text for any hole"
    else:
        state = f"{name} not written" + (
            "" if sys.stdin.isatty() else " (no terminal to ask; --write writes it)"
        )
    print(f"diffu: {got} of {len(fills)} holes filled{skipped}; {state}", file=sys.stderr)
    return 0


def _run(client: Client, plan: FillPlan, fill: FillOptions, console: Console | None) -> Done:
    """The fill run: streamed and drawn live on ``console`` when someone watches, else asked for whole."""
    from rich.console import Group
    from rich.live import Live

    from assistant.client import SamplingOptions, Step, Waiting
    from tui.render import Trace, file_canvas, header_text

    sampling = SamplingOptions(temperature=fill.temperature)
    if console is None:
        return client.generate(prompt=plan.prompt.text, max_new_tokens=0, sampling=sampling)
    trace = Trace(plan.masks)
    done: Done | None = None
    with Live(console=console, transient=True, refresh_per_second=30, vertical_overflow="crop") as live:
        live.update(file_canvas(plan.before, plan.region, plan.after))
        for event in client.stream_generate(prompt=plan.prompt.text, max_new_tokens=0, sampling=sampling):
            if isinstance(event, Step):
                trace.add(event)
                live.update(
                    Group(header_text(trace), file_canvas(plan.before, event, plan.after)), refresh=False
                )
            elif isinstance(event, Waiting):
                trace.waiting = event
                live.update(Group(header_text(trace), file_canvas(plan.before, plan.region, plan.after)))
            else:
                done = event
    if done is None:
        raise UsageError("the daemon ended the stream without the fills")
    return done


def _show(diff: str) -> None:
    """The diff on stdout, coloured on a terminal."""
    from rich.console import Console
    from rich.syntax import Syntax

    if sys.stdout.isatty():
        Console().print(Syntax(diff, "diff", theme="ansi_dark", background_color="default"))
    else:
        sys.stdout.write(diff)
        sys.stdout.flush()


def _ask(console: Console, name: str) -> bool:
    """On a terminal, whether to write (anything but y keeps the file); with nobody to ask, no."""
    if not sys.stdin.isatty():
        return False
    try:
        from rich.text import Text

        answer = console.input(Text(f"Write {name}? [y/N] "))  # a Text: [y/N] is not markup
    except EOFError:
        return False
    return answer.strip().lower() in ("y", "yes")


def _hole(text: str, hole: Hole, fill: str) -> dict[str, Any]:
    """Where a hole was (1-based line and column) and what marked it."""
    line_start = text.rfind("\n", 0, hole.start) + 1
    return {
        "line": text.count("\n", 0, hole.start) + 1,
        "column": hole.start - line_start + 1,
        "marker": text[hole.start : hole.end],
        "tokens": hole.tokens,
        "filled": bool(fill),
    }
