"""``diffu lsp``: infill suggestions and fill-holes over the Language Server Protocol (pygls 2).

The handlers are thin, in the jedi-language-server manner: each reads its request, calls the plain
functions of ``suggest`` (suggestions), ``fill`` (fill holes) or ``capabilities``, and turns the result
into LSP types. State lives on the server object (``lsp.core``).

Every suggestion request is answered with a list, empty when there is nothing to show (``null`` would
leave an editor showing the previous suggestion), and an answer computed for a document version that
changed meanwhile is answered empty too. Requests are async handlers, so pygls answers a
``$/cancelRequest`` with RequestCancelled by cancelling the task; the cancellation reaches the HTTP
request, whose closed connection makes the daemon drop the job at its next denoising step. A newer
suggestion request of the same editor supersedes the older one the same way (``lsp.supersede``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from lsprotocol import types
from lsprotocol.converters import get_converter
from pygls.exceptions import JsonRpcInvalidParams

from lsp import capabilities
from lsp.core import DiffuLanguageServer, document_key
from lsp.holes import Hole, HoleError, find_holes
from lsp.settings import SECTION, settings_section
from lsp.suggest import Cursor

log = logging.getLogger("diffu.lsp")

FILL_HOLES = "diffu.fillHoles"
ACCEPTED = "diffu.accepted"
STATUS = "diffu.status"
TOGGLE = "diffu.toggle"
SNOOZE = "diffu.snooze"
CONVERTER = get_converter()
SERVER = DiffuLanguageServer()


# -- lifecycle and settings ---------------------------------------------------------------------------
@SERVER.feature(types.INITIALIZE)
def initialize(ls: DiffuLanguageServer, params: types.InitializeParams) -> None:
    """Read ``initializationOptions``; nothing here waits on the daemon."""
    ls.apply_settings(params.initialization_options, source="initializationOptions")


@SERVER.feature(types.INITIALIZED)
async def initialized(ls: DiffuLanguageServer, params: types.InitializedParams) -> None:
    """Start connecting to the daemon in the background and register providers where dynamic."""
    del params
    ls.link.start()
    try:
        await sync_registrations(ls)
        workspace = ls.client_capabilities.workspace
        change = workspace.did_change_configuration if workspace else None
        if change and change.dynamic_registration:
            # Pull-model clients (VS Code) then send didChangeConfiguration when our section changes.
            registration = types.Registration(
                id="diffu-configuration",
                method=types.WORKSPACE_DID_CHANGE_CONFIGURATION,
                register_options={"section": SECTION},
            )
            await ls.client_register_capability_async(types.RegistrationParams(registrations=[registration]))
        if workspace and workspace.configuration:
            await _pull_configuration(ls)
    except Exception as exc:  # an editor that refuses a registration still gets static features
        ls.log(f"diffu: could not register with the editor: {exc}", level="warning")


async def sync_registrations(ls: DiffuLanguageServer) -> None:
    """(Re-)register the suggestion provider for the current languages, or drop it when disabled.

    One change at a time, the id stored before the editor answers: a settings change arriving while a
    registration is on its way must find it to unregister.
    """
    provider = ls.provider
    if not provider.dynamic:
        return
    async with ls.registration_lock:
        old = ls.registrations.pop(provider.method, None)
        if old is not None:
            gone = types.Unregistration(id=old, method=provider.method)
            await ls.client_unregister_capability_async(types.UnregistrationParams(unregisterations=[gone]))
        if not ls.settings.enable:
            return
        reg_id = f"diffu-{provider.method}-{time.monotonic_ns()}"
        ls.registrations[provider.method] = reg_id
        options = capabilities.registration_options(provider, ls.settings.languages)
        registration = types.Registration(id=reg_id, method=provider.method, register_options=options)
        await ls.client_register_capability_async(types.RegistrationParams(registrations=[registration]))


async def _pull_configuration(ls: DiffuLanguageServer) -> None:
    result = await ls.workspace_configuration_async(
        types.ConfigurationParams(items=[types.ConfigurationItem(section=SECTION)])
    )
    if result and isinstance(result[0], dict) and result[0]:
        await _reconfigure(ls, result[0], source="workspace/configuration")


async def _reconfigure(ls: DiffuLanguageServer, data: Any, *, source: str) -> None:
    before = ls.settings
    ls.apply_settings(data, source=source)
    s = ls.settings
    if (before.enable, before.languages) != (s.enable, s.languages):
        await sync_registrations(ls)
    if (before.url, before.api_key, before.model, before.autostart) != (
        s.url,
        s.api_key,
        s.model,
        s.autostart,
    ):
        ls.link.start()


@SERVER.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)
async def did_change_configuration(
    ls: DiffuLanguageServer, params: types.DidChangeConfigurationParams
) -> None:
    """Settings pushed by the editor, or (an empty push) a hint to pull them."""
    section = settings_section(params.settings)
    if section is not None:
        await _reconfigure(ls, section, source="didChangeConfiguration")
        return
    workspace = ls.client_capabilities.workspace
    if workspace and workspace.configuration:
        await _pull_configuration(ls)


# -- documents ----------------------------------------------------------------------------------------
@SERVER.feature(types.TEXT_DOCUMENT_DID_OPEN)
def did_open(ls: DiffuLanguageServer, params: types.DidOpenTextDocumentParams) -> None:
    ls.touch(params.text_document.uri)


@SERVER.feature(types.TEXT_DOCUMENT_DID_CHANGE)
def did_change(ls: DiffuLanguageServer, params: types.DidChangeTextDocumentParams) -> None:
    """The edited place is recent context (a whole-document replacement says nothing about where)."""
    change = params.content_changes[-1] if params.content_changes else None
    line = change.range.start.line if isinstance(change, types.TextDocumentContentChangePartial) else None
    ls.touch(params.text_document.uri, line)


@SERVER.feature(types.TEXT_DOCUMENT_DID_CLOSE)
def did_close(ls: DiffuLanguageServer, params: types.DidCloseTextDocumentParams) -> None:
    ls.forget(params.text_document.uri)


# -- suggestions --------------------------------------------------------------------------------------
async def _suggestions(
    ls: DiffuLanguageServer, uri: str, before: str, after: str, invoked: bool
) -> list[str]:
    """The suggestions for a cursor, or [] (daemon trouble is logged, never raised to the editor)."""
    from assistant.client import APIError, DaemonUnavailable
    from lsp.daemon_link import describe
    from lsp.suggest import suggest

    ls.counters["requests"] += 1
    doc = ls.document(uri)
    if not ls.enabled_for(doc) or (ls.paused is not None and not invoked):
        ls.counters["skipped"] += 1
        return []
    version = doc.version
    cursor = Cursor(ls.relative_path(uri), doc.language_id or "", before, after, invoked)
    ls.recent.note(document_key(uri), cursor.path, doc.source, before.count("\n"))  # where the user looks
    ls.busy += 1
    ls.status_changed()
    try:
        texts = await suggest(
            cursor,
            settings=ls.settings,
            link=ls.link,
            cache=ls.cache,
            counters=ls.counters,
            timings=ls.timings,
            others=ls.context_documents(uri),
            session=ls.session,
        )
    except DaemonUnavailable as exc:
        ls.counters["errors"] += 1
        ls.link.lost(str(exc))
        ls.log(f"diffu: {exc}", level="error")
        return []
    except APIError as exc:
        ls.counters["errors"] += 1
        ls.log(f"diffu: suggestion failed: {describe(exc)}", level="error")
        return []
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # a bug here must cost one suggestion, not the server
        ls.counters["errors"] += 1
        log.exception("suggestion failed")
        ls.log(f"diffu: suggestion failed: {type(exc).__name__}: {exc}", level="error")
        return []
    finally:
        ls.busy -= 1
        ls.status_changed()
    current = ls.open_document(uri)
    if texts and (current is None or current.version != version):
        ls.counters["stale"] += 1  # made for text the user has since changed
        return []
    return texts


def _accepted(uri: str, text: str) -> types.Command:
    return types.Command(title="diffu: accepted", command=ACCEPTED, arguments=[uri, len(text)])


@SERVER.feature(types.TEXT_DOCUMENT_INLINE_COMPLETION, types.InlineCompletionOptions())
async def inline_completion(
    ls: DiffuLanguageServer, params: types.InlineCompletionParams
) -> types.InlineCompletionList:
    """Ghost text at the cursor (LSP 3.18): several candidates when invoked, to cycle through."""
    uri, pos = params.text_document.uri, params.position
    doc = ls.document(uri)
    offset = ls.offset(doc, pos)
    invoked = params.context.trigger_kind == types.InlineCompletionTriggerKind.Invoked
    selected = params.context.selected_completion_info
    # VS Code's selected completion item: the suggestion must extend it, so the model sees it inserted.
    start = selected.range.start if selected is not None else pos
    typed = selected.text if selected is not None else ""
    before = doc.source[: ls.offset(doc, start)] + typed if selected is not None else doc.source[:offset]

    async def work() -> types.InlineCompletionList:
        texts = await _suggestions(ls, uri, before, doc.source[offset:], invoked)
        items = [
            types.InlineCompletionItem(
                insert_text=typed + text,
                range=types.Range(start=start, end=pos),
                command=_accepted(uri, text),
            )
            for text in texts
        ]
        return types.InlineCompletionList(items=items)

    return await ls.supersede.run("suggest", document_key(uri), work, types.InlineCompletionList(items=[]))


def _word_start(line: str) -> int:
    i = len(line)
    while i > 0 and (line[i - 1].isalnum() or line[i - 1] == "_"):
        i -= 1
    return i


@SERVER.feature(
    types.TEXT_DOCUMENT_COMPLETION,
    types.CompletionOptions(trigger_characters=capabilities.TRIGGER_CHARACTERS),
)
async def completion(ls: DiffuLanguageServer, params: types.CompletionParams) -> types.CompletionList:
    """The fallback for clients without inline completion: items whose edit inserts the infill.

    The edit replaces the word before the cursor with that word plus the infill, so clients that filter
    items by the typed word keep it; ``isIncomplete`` makes them ask again as the user types.
    """
    uri, pos = params.text_document.uri, params.position
    doc = ls.document(uri)
    offset = ls.offset(doc, pos)
    invoked = (
        params.context is not None and params.context.trigger_kind == types.CompletionTriggerKind.Invoked
    )
    line = doc.source[doc.source.rfind("\n", 0, offset) + 1 : offset]
    word = line[_word_start(line) :]
    start = doc.client_position_at_offset(offset - len(word))

    async def work() -> types.CompletionList:
        texts = await _suggestions(ls, uri, doc.source[:offset], doc.source[offset:], invoked)
        items = []
        for rank, text in enumerate(texts):
            new_text = word + text
            first = new_text.strip().split("\n", 1)[0]
            label = first if len(first) <= 60 else first[:57] + "..."
            item = types.CompletionItem(
                label=label or new_text.strip()[:60],
                kind=types.CompletionItemKind.Text,
                detail="diffu",
                documentation=types.MarkupContent(kind=types.MarkupKind.PlainText, value=new_text),
                filter_text=new_text,
                sort_text=str(rank),
                insert_text_format=types.InsertTextFormat.PlainText,
                text_edit=types.TextEdit(range=types.Range(start=start, end=pos), new_text=new_text),
                command=_accepted(uri, new_text),
            )
            items.append(item)
        return types.CompletionList(is_incomplete=True, items=items)

    empty = types.CompletionList(is_incomplete=True, items=[])
    return await ls.supersede.run("suggest", document_key(uri), work, empty)


# -- fill holes ---------------------------------------------------------------------------------------
def _holes(ls: DiffuLanguageServer, uri: str, range_: types.Range | None) -> tuple[list[Hole], list[Hole]]:
    """(the holes to fill: the selection's, or all; the other holes of the document)."""
    doc = ls.document(uri)
    s = ls.settings
    holes = find_holes(doc.source, s.hole_marker, s.hole_tokens)
    if range_ is None or range_.start == range_.end:
        return holes, []
    start, end = ls.offset(doc, range_.start), ls.offset(doc, range_.end)
    inside = [h for h in holes if h.start >= start and h.end <= end]
    return inside, [h for h in holes if h not in inside]


@SERVER.feature(
    types.TEXT_DOCUMENT_CODE_ACTION,
    types.CodeActionOptions(code_action_kinds=[types.CodeActionKind.RefactorRewrite], resolve_provider=True),
)
def code_action(ls: DiffuLanguageServer, params: types.CodeActionParams) -> list[types.CodeAction] | None:
    """Offer to fill the holes of the selection (or, with no selection, of the document).

    Listing actions must stay cheap (editors ask on every cursor move), so the model runs only when the
    user picks the action: in ``codeAction/resolve``, which returns the fills as the action's workspace
    edit, or, for clients that cannot resolve edits, through the ``diffu.fillHoles`` command.
    """
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


@SERVER.feature(types.CODE_ACTION_RESOLVE)
async def resolve_code_action(ls: DiffuLanguageServer, action: types.CodeAction) -> types.CodeAction:
    """Run the model for the picked fill-holes action and attach the fills as its edit."""
    uri, range_ = _fill_args(ls, (action.data,))
    action.edit = await _fill(ls, uri, range_)
    return action


async def _fill(ls: DiffuLanguageServer, uri: str, range_: types.Range | None) -> types.WorkspaceEdit | None:
    """Fill the holes; failures are shown to the user and give None (the server keeps serving)."""
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


@SERVER.command(FILL_HOLES)
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


@SERVER.command(ACCEPTED)
def accepted(ls: DiffuLanguageServer, *args: Any) -> None:
    """Runs after the user accepts a suggestion; counted and logged locally, never sent anywhere."""
    ls.counters["accepted"] += 1
    log.debug("suggestion accepted: %s", args)


@SERVER.command(TOGGLE)
def toggle(ls: DiffuLanguageServer, *args: Any) -> dict[str, Any]:
    """``diffu.toggle``: pause suggestions while typing until toggled again, or resume them (a snooze
    included). Explicit requests still ask while paused. Returns the new status item."""
    del args
    if ls.paused is None:
        ls.pause(None)
    else:
        ls.resume()
    return ls.status_item()


@SERVER.command(SNOOZE)
def snooze(ls: DiffuLanguageServer, *args: Any) -> dict[str, Any]:
    """``diffu.snooze(minutes?)``: pause suggestions while typing for a while (the ``snoozeMinutes``
    setting when no duration is given). Returns the new status item."""
    minutes = args[0] if args else None
    if minutes is None:
        minutes = ls.settings.snooze_minutes
    if isinstance(minutes, bool) or not isinstance(minutes, int | float) or not 0 < minutes <= 1440:
        raise JsonRpcInvalidParams(
            f"{SNOOZE}: expected minutes, more than 0 and at most 1440 (or none), got {minutes!r}"
        )
    ls.pause(float(minutes))
    return ls.status_item()


@SERVER.command(STATUS)
def status(ls: DiffuLanguageServer, *args: Any) -> dict[str, Any]:
    """Where the server stands: the status item, daemon, model, settings, counters, latency and cache."""
    del args
    link = ls.link
    return {
        "status": ls.status_item(),
        "paused": ls.paused is not None,
        "connected": link.connected,
        "model": link.model,
        "max_context": link.max_context,
        "daemon_features": sorted(link.features),
        "warm_request": link.warmed,
        "url": link.url,
        "provider": ls.provider.name,
        "dynamic": ls.provider.dynamic,
        "chars_per_token": round(link.chars_per_token, 3),
        "settings": ls.settings.to_json(),
        "counters": dict(ls.counters),
        "latency": ls.timings.summary(),
        "timings": [t.to_json() for t in ls.timings.recent],
        "cache": {"entries": len(ls.cache), "hits": ls.cache.hits, "forward_hits": ls.cache.forward_hits},
        "recent_chunks": len(ls.recent),
    }


def main() -> None:
    """Serve over stdio until the editor says exit; the process ends with the specification's code."""
    code = SERVER.start_io()
    if code:
        raise SystemExit(code)
