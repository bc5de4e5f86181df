"""``diffu lsp``: infill suggestions and fill-holes over the Language Server Protocol (pygls 2).

The handlers are thin, in the jedi-language-server manner: each reads its request, calls the plain
functions of ``suggest`` (suggestions), ``fill`` (fill holes) or ``capabilities``, and turns the result
into LSP types. State lives on the server object (``lsp.core``). This module makes the server and holds
its lifecycle, settings, document and suggestion handlers; the fill-holes code action and command are in
``lsp.code_actions``, the commands about the server (toggle, snooze, status) in ``lsp.commands``.

Every suggestion request is answered with a list, empty when there is nothing to show (``null`` would
leave an editor showing the previous suggestion), and an answer computed for a document version that
changed meanwhile is answered empty too. Requests are async handlers, so pygls answers a
``$/cancelRequest`` with RequestCancelled by cancelling the task; the cancellation reaches the HTTP
request, whose closed connection makes the daemon drop the job at its next denoising step. A newer
suggestion request of the same editor supersedes the older one the same way (``lsp.supersede``), except
that typing on the cursor's line waits for the running automatic suggestion instead (``lsp.flight``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from lsprotocol import types

from lsp import capabilities, code_actions, commands
from lsp.core import DiffuLanguageServer, document_key
from lsp.settings import SECTION, settings_section
from lsp.suggest import Cursor

log = logging.getLogger("diffu.lsp")

ACCEPTED = "diffu.accepted"
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
            flights=ls.flights,
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


# -- fill holes, accepted suggestions, the commands about the server ---------------------------------
# Registered in this order so that the editor sees the commands listed as before they had modules of
# their own.
code_actions.register(SERVER)


@SERVER.command(ACCEPTED)
def accepted(ls: DiffuLanguageServer, *args: Any) -> None:
    """Runs after the user accepts a suggestion; counted and logged locally, never sent anywhere."""
    ls.counters["accepted"] += 1
    log.debug("suggestion accepted: %s", args)


commands.register(SERVER)


def main() -> None:
    """Serve over stdio until the editor says exit; the process ends with the specification's code."""
    code = SERVER.start_io()
    if code:
        raise SystemExit(code)
