"""Fill holes from the editor: the code action, its resolve, and the ``diffu.fillHoles`` command.

Listing actions must stay cheap (editors ask on every cursor move), so the model runs only when the user
picks the action: in ``codeAction/resolve``, which returns the fills as the action's workspace edit, or,
for clients that cannot resolve edits, through the ``diffu.fillHoles`` command. Both end in :func:`_fill`,
which asks ``lsp.fill`` for the fills and turns them into one workspace edit. :func:`register` adds the
handlers to the server (``lsp.server``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from lsprotocol import types
from lsprotocol.converters import get_converter
from pygls.exceptions import JsonRpcInvalidParams

from assistant.infill.holes import Hole, HoleError, find_holes, split_by_range
from lsp import capabilities
from lsp.core import DiffuLanguageServer, document_key

log = logging.getLogger("diffu.lsp")

FILL_HOLES = "diffu.fillHoles"
CONVERTER = get_converter()


def register(server: DiffuLanguageServer) -> None:
    """Offer the fill-holes code action (resolved lazily) and the ``diffu.fillHoles`` command."""
    kinds = [types.CodeActionKind.RefactorRewrite]
    options = types.CodeActionOptions(code_action_kinds=kinds, resolve_provider=True)
    server.feature(types.TEXT_DOCUMENT_CODE_ACTION, options)(code_action)
    server.feature(types.CODE_ACTION_RESOLVE)(resolve_code_action)
    server.command(FILL_HOLES)(fill_holes_command)


def _holes(ls: DiffuLanguageServer, uri: str, range_: types.Range | None) -> tuple[list[Hole], list[Hole]]:
    """(the holes to fill: the selection's, or all; the other holes of the document)."""
    doc = ls.document(uri)
    s = ls.settings
    holes = find_holes(doc.source, s.hole_marker, s.hole_tokens)
    if range_ is None:
        return holes, []
    return split_by_range(holes, ls.offset(doc, range_.start), ls.offset(doc, range_.end))


def code_action(ls: DiffuLanguageServer, params: types.CodeActionParams) -> list[types.CodeAction] | None:
    """Offer to fill the holes of the selection (or, with no selection, of the document); the model
    runs only when the action is picked."""
    only = params.context.only
    if only and not any(types.CodeActionKind.RefactorRewrite.value.startswith(str(k)) for k in only):
        return None
    uri = params.text_document.uri
    selection = params.range.start != params.range.end
    targets, _ = _holes(ls, uri, params.range)
    if not targets:
        return None
    where = "the selection" if selection else "this file"
    title = f"Fill {len(targets)} hole{'s' if len(targets) > 1 else ''} in {where} with diffu"
    target = {"uri": uri, "range": CONVERTER.unstructure(params.range) if selection else None}
    action = types.CodeAction(title=title, kind=types.CodeActionKind.RefactorRewrite)
    if capabilities.can_resolve_edits(ls.client_capabilities):
        action.data = target
    else:
        action.command = types.Command(title=title, command=FILL_HOLES, arguments=[target])
    return [action]


async def resolve_code_action(ls: DiffuLanguageServer, action: types.CodeAction) -> types.CodeAction:
    """Run the model for the picked fill-holes action and attach the fills as its edit."""
    uri, range_ = _fill_args(ls, (action.data,))
    action.edit = await _fill(ls, uri, range_)
    return action


async def _fill(ls: DiffuLanguageServer, uri: str, range_: types.Range | None) -> types.WorkspaceEdit | None:
    """Fill the holes; failures are shown to the user and give None (the server keeps serving)."""
    # Imported here, not above: assistant.client brings httpx, which an editor's start must not wait for
    # (see lsp.core).
    from assistant.client import DaemonUnavailable
    from lsp.daemon_link import describe
    from lsp.fill import Filler, HoleDocument

    doc = ls.document(uri)
    targets, others = _holes(ls, uri, range_)
    if not targets:
        return None
    version, text = doc.version, doc.source

    async def work() -> list[str]:
        hole_doc = HoleDocument(text, ls.relative_path(uri), doc.language_id or "")
        client = await ls.link.ready()
        filler = Filler(ls.link, client, hole_doc, ls.settings, f"{ls.session}:holes")
        return await filler.fill(targets, others)

    try:
        nothing: list[str] = []
        key = document_key(uri)
        fills = await ls.supersede.run(f"holes:{key}", key, work, nothing)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        if isinstance(exc, DaemonUnavailable):
            ls.link.lost(str(exc))
        elif not isinstance(exc, HoleError):
            log.exception("fill holes failed")
        ls.log(f"diffu: fill holes failed: {describe(exc)}", level="error", show=True)
        return None
    if not fills:
        return None  # superseded by a newer fill of this document
    if ls.open_document(uri) is not doc or doc.version != version:
        ls.log("diffu: the document changed while its holes were filled; run fill holes again", show=True)
        return None
    edits = [
        types.TextEdit(
            range=types.Range(doc.client_position_at_offset(h.start), doc.client_position_at_offset(h.end)),
            new_text=fill,
        )
        for h, fill in zip(targets, fills, strict=True)
        if fill  # an empty fill leaves the marker: the user sees which hole the model skipped
    ]
    ls.counters["holes_filled"] += len(edits)
    if len(edits) < len(targets):
        missing = len(targets) - len(edits)
        ls.log(f"diffu: {missing} of {len(targets)} holes got no text", level="warning", show=not edits)
    if not edits:
        return None
    if capabilities.versioned_edits(ls.client_capabilities):
        # With a version the editor refuses the edit if the document changed since.
        ident = types.OptionalVersionedTextDocumentIdentifier(uri=doc.uri, version=version)
        return types.WorkspaceEdit(
            document_changes=[types.TextDocumentEdit(text_document=ident, edits=edits)]
        )
    return types.WorkspaceEdit(changes={doc.uri: edits})


async def fill_holes_command(ls: DiffuLanguageServer, *args: Any) -> Any:
    """``diffu.fillHoles(uri, range?)``: fill the holes in one run, apply the edit, and return it."""
    uri, range_ = _fill_args(ls, args)
    if not _holes(ls, uri, range_)[0]:
        marker = ls.settings.hole_marker or "<|mask|>"
        ls.log(f"diffu: no holes to fill (mark them with <|mask|> or {marker})", level="info", show=True)
        return None
    edit = await _fill(ls, uri, range_)
    if edit is None:
        return None  # why was already shown: an error, or no hole got text
    result = await ls.workspace_apply_edit_async(
        types.ApplyWorkspaceEditParams(edit=edit, label="diffu: fill holes")
    )
    if not result.applied:
        reason = result.failure_reason or "no reason given"
        ls.log(f"diffu: the editor did not apply the fills ({reason})", level="warning")
    return edit


def _fill_args(ls: DiffuLanguageServer, args: tuple[Any, ...]) -> tuple[str, types.Range | None]:
    """(uri, range) from the command's arguments: ``[uri]``, ``[uri, range]`` or ``[{uri, range}]``."""
    if len(args) == 1 and isinstance(args[0], dict):
        args = (args[0].get("uri"), args[0].get("range"))
    if not args or not isinstance(args[0], str):
        raise JsonRpcInvalidParams(
            f"{FILL_HOLES}: expected a document uri as the first argument, got {args!r}"
        )
    uri = args[0]
    if ls.open_document(uri) is None:
        raise JsonRpcInvalidParams(f"{FILL_HOLES}: {uri} is not an open document")
    range_ = None
    if len(args) > 1 and args[1] is not None:
        try:
            range_ = CONVERTER.structure(args[1], types.Range)
        except Exception:
            raise JsonRpcInvalidParams(
                f"{FILL_HOLES}: the second argument must be a range, got {args[1]!r}"
            ) from None
    return uri, range_
