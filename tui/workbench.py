"""The chat's commands that work on the user's files: ``/add``, ``/drop``, ``/files``, ``/apply``,
``/undo``, ``/fill`` (and ``/help``).

:class:`Workbench` is an object the app holds and runs each command of in a worker; what it needs of the
app is passed in (the log to write its lines in, the files in context, the backend, the prompt's limit,
and the review screen to ask with). The decisions are the workspace's (``assistant.workspace``: what a
block changes, the diff, the atomic write, staleness, undo) and the hole logic's
(``assistant.infill.holes``); this module shows them. A file changes only after its diff was shown and
``y`` pressed, and only if it still holds what the diff was made from (ARCHITECTURE.md rule 14).
"""

from __future__ import annotations

import ast
import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

from assistant.client import Done, Step, Waiting
from assistant.errors import UsageError
from assistant.infill.holes import FillOptions, HoleError, apply_fills, plan_fill, target_fills
from assistant.workspace.edits import Change, Snapshot, StaleChange, UndoStack, target, write
from assistant.workspace.files import (
    FileProblem,
    decode_text,
    display_path,
    language_of,
    line_span,
    parse_ref,
    read_text,
)
from assistant.workspace.merge import forced, merge_code
from tui.backend import Backend
from tui.chat_log import ChatLog
from tui.commands import Command, help_text
from tui.context import ChatContext, Limit
from tui.errors import describe_error
from tui.fill_view import FillView

log = logging.getLogger("diffu.chat")

Review = Callable[[str, str, str], Awaitable[bool]]
"""``review(title, summary, diff)``: show a change and answer whether to write it."""

PYTHON = (".py", ".pyi")


class Workbench:
    """Runs the file commands; ``undo`` is the session's stack of applied changes."""

    def __init__(
        self,
        *,
        log: ChatLog,
        context: ChatContext,
        backend: Backend,
        limit: Callable[[], Limit],
        review: Review,
        changed: Callable[[], None],
    ) -> None:
        self.log = log
        self.context = context
        self.backend = backend
        self.limit = limit
        self.review = review
        self.changed = changed  # the files in context changed: the app updates its header
        self.undo = UndoStack()
        self.fills = FillOptions()

    @property
    def root(self) -> Path:
        return self.context.root

    async def run(self, command: Command) -> None:
        """Run ``command``; every outcome, refusals included, is a line in the log."""
        try:
            await getattr(self, f"_{command.name}")(command)
        except (UsageError, HoleError) as exc:  # FileProblem, StaleChange, MergeError are UsageErrors
            await self.log.say(str(exc), error=True)
        except asyncio.CancelledError:
            raise  # escape (a fill's stream closed: the daemon cancels its job), or the app closing
        except Exception as exc:  # the daemon's refusal or absence: one line, never a traceback
            log.debug("/%s failed", command.name, exc_info=exc)
            await self.log.say(f"/{command.name}: {describe_error(exc)}", error=True)

    async def _say_all(self, lines: list[tuple[str, bool]]) -> None:
        for text, error in lines:
            await self.log.say(text, error=error)

    async def _help(self, command: Command) -> None:
        await self.log.say(help_text())

    async def _add(self, command: Command) -> None:
        await self._say_all(await self.context.add(list(command.args), self.limit()))
        self.changed()

    async def _drop(self, command: Command) -> None:
        await self._say_all(self.context.drop(list(command.args)))
        self.changed()

    async def _files(self, command: Command) -> None:
        await self.log.say(self.context.listing(self.limit()))

    # -- /apply and /undo ------------------------------------------------------------------------------
    async def _apply(self, command: Command) -> None:
        fence = self.log.code_block()
        if fence is None:
            raise FileProblem("no code block to apply: ask for code first (ctrl+up/down selects a block)")
        code = fence.code
        where = command.args[0] if command.args else self._target(code)
        path = self.root / where
        name = display_path(path, self.root)
        before = Snapshot.take(target(path, name))  # first: the diff is made from these bytes
        original = None if before.data is None else decode_text(before.data, name)
        python = path.suffix in PYTHON or (original is None and not path.suffix)
        if command.force:
            merged = forced(original, code)
        elif not python and original is not None:
            raise FileProblem(
                f"{name} is not a Python file, so the block has no definitions to place in it; "
                f"/apply {where} --force puts the block at its end as it is"
            )
        else:
            try:
                merged = merge_code(original, code) if python else forced(original, code)
            except UsageError as exc:
                raise FileProblem(
                    f"{exc}; /apply --force puts the block at the end of {name} as it is"
                ) from None
        change = Change(name, before, merged.text.encode("utf-8"))
        summary = f"creates {name}" if change.creates else merged.summary()
        await self._offer(change, f"Apply the code block to {name}", summary)

    def _target(self, code: str) -> str:
        """The file a block applies to when none is named: the only file in context, or the one file in
        context that defines what the block defines."""
        files = [f for f in self.context.files if f.ref.start is None]
        if len(self.context.files) == 1 and files:
            return files[0].ref.path
        names = _defined(code)
        owners = [f.ref.path for f in files if names and names & _defined(_text(self.root / f.ref.path))]
        if len(owners) == 1:
            return owners[0]
        which = "several files in context define" if owners else "no file in context defines"
        raise FileProblem(f"name the file: /apply PATH ({which} what the block defines)")

    async def _offer(self, change: Change, title: str, summary: str) -> bool:
        """Show ``change`` and write it on ``y``; True when written."""
        if change.empty:
            await self.log.say(f"{change.name} already holds this; nothing to write")
            return False
        if not await self.review(title, summary, change.diff()):
            await self.log.say(f"dropped the change to {change.name}; the file is as it was")
            return False
        try:
            write(change)
        except StaleChange as exc:
            await self.log.say(str(exc), error=True)
            return False
        self.undo.push(change)
        added, removed = change.counts()
        verb = "created" if change.creates else "wrote"
        await self.log.say(f"{verb} {change.name} (+{added} -{removed}); /undo puts it back")
        return True

    async def _undo(self, command: Command) -> None:
        undone = self.undo.undo(force=command.force)
        what = (
            f"removed {undone.name}, which diffu had created"
            if undone.before is None
            else (f"put back {undone.name} as it was")
        )
        left = len(self.undo)
        await self.log.say(f"{what} ({left} more change{'s' if left != 1 else ''} to undo)")

    # -- /fill -----------------------------------------------------------------------------------------
    async def _fill(self, command: Command) -> None:
        ref = parse_ref(command.args[0])
        path = self.root / ref.path
        name = display_path(path, self.root)
        before = Snapshot.take(target(path, name))  # first: the fills are put into these bytes
        if before.data is None:
            raise FileProblem(f"{ref.path}: no such file")
        text = decode_text(before.data, name)
        start, end = line_span(text, ref)
        plan = plan_fill(
            text, path=name, language=language_of(name), options=self.fills, start=start, end=end
        )
        view = FillView(name, plan)
        await self.log.add(view)
        try:
            done = await self._run_fill(view, plan.prompt.text)
        except asyncio.CancelledError:
            raise
        except Exception:
            await view.finish("not filled (the line below says why)")
            raise
        fills = target_fills(text, plan.prompt, plan.targets, done.holes)
        got = sum(1 for f in fills if f)
        await view.finish(f"{got} of {len(fills)} holes filled · {done.stats.steps} steps")
        if not got:
            raise HoleError(f"{name}: the model gave no text for any hole; nothing to write")
        change = Change(name, before, apply_fills(text, plan.targets, fills).encode("utf-8"))
        await self._offer(change, f"Fill the holes of {name}", f"{got} of {len(fills)} holes filled")

    async def _run_fill(self, view: FillView, prompt: str) -> Done:
        async for event in self.backend.fill(prompt, self.fills):
            if isinstance(event, Step):
                view.push(event)
            elif isinstance(event, Waiting):
                view.wait(event)
            else:
                return event
        raise HoleError("the daemon ended the stream without the fills")


def _defined(code: str) -> set[str]:
    """Names of the functions and classes ``code`` defines, methods included (empty if it does not
    parse)."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return set()
    kinds = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef
    return {n.name for n in ast.walk(tree) if isinstance(n, kinds)}


def _text(path: Path) -> str:
    try:
        return read_text(path)
    except FileProblem:
        return ""
