"""The language server object: what ``diffu lsp`` keeps between requests, and how it reports itself.

It holds state only (settings, the daemon link, the cache, recent chunks, counters and timings, all public
and read by ``diffu.status``) and the small helpers the handlers in ``lsp.server`` share: documents by
URI, logging to the editor, the ``diffu/status`` notification behind the editors' status items. The
protocol is ``jsonrpc``'s conformant one, so malformed traffic gets the answers the specification asks
for before pygls sees it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import sys
import time
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlparse

from lsprotocol import types
from pygls.exceptions import JsonRpcInvalidParams
from pygls.lsp.server import LanguageServer
from pygls.protocol.language_server import lsp_method
from pygls.workspace import TextDocument

from assistant import __version__
from assistant.wire import HEALTH_OK
from lsp import capabilities
from lsp.cache import SuggestionCache
from lsp.flight import Flights
from lsp.jsonrpc import ConformantProtocol, serve
from lsp.recent import RecentChunks
from lsp.settings import Settings, parse_settings
from lsp.state import Pause, Timings, new_counters, stage_message, status_item
from lsp.suggest import warm_shapes
from lsp.supersede import Supersede

if TYPE_CHECKING:
    from pygls.progress import Progress

    from assistant.client import WarmShape
    from lsp.daemon_link import DaemonLink

# assistant.client (httpx) is imported after ``initialize`` is answered, where it is needed: importing it
# up front would add a tenth of a second to every editor's start.

log = logging.getLogger("diffu.lsp")

STATUS_NOTIFICATION = "diffu/status"
MAX_OTHER_DOCUMENTS = 10
ERROR_REPEAT_SECONDS = 30.0  # the same error is logged again only after this long
_LEVELS = {
    "error": types.MessageType.Error,
    "warning": types.MessageType.Warning,
    "info": types.MessageType.Info,
    "debug": types.MessageType.Log,
}


def document_key(uri: str) -> str:
    """The one form of a document URI that every lookup and every per-document map uses.

    Editors escape URIs differently (VS Code sends ``file:///c%3A/proj/a.py`` and ``my%20file.py``, others
    the raw characters) and pygls keeps open documents under the unquoted form, so that form is the key;
    the URI the editor sent (``TextDocument.uri``) is kept for what goes back to it (edit keys, paths).
    """
    return unquote(uri)


class DiffuProtocol(ConformantProtocol):
    """The conformant protocol, choosing the completion provider once pygls has built the capabilities."""

    _server: DiffuLanguageServer

    @lsp_method(types.INITIALIZE)
    def lsp_initialize(self, params: types.InitializeParams) -> Any:
        result = yield from super().lsp_initialize(params)
        self._server.provider = capabilities.choose(params.capabilities, result.capabilities)
        return result


class DiffuLanguageServer(LanguageServer):
    """The server's state: settings, the daemon link, the suggestion cache, recent chunks and counters."""

    protocol: DiffuProtocol

    def __init__(self) -> None:
        super().__init__(
            "diffu",
            __version__,
            protocol_cls=DiffuProtocol,
            text_document_sync_kind=types.TextDocumentSyncKind.Incremental,
        )
        self.settings = Settings()
        self.cache = SuggestionCache()
        self.recent = RecentChunks()
        self.counters = new_counters()
        self.timings = Timings()
        self.touched: dict[str, float] = {}  # document key -> when it was last opened or edited
        self.supersede = Supersede(lambda key: self.touched.get(key, 0.0), self.counters)
        self.flights = Flights()  # the automatic model call that typing on its line waits for
        self.provider = capabilities.Provider()
        self.registrations: dict[str, str] = {}  # method -> registration id
        self.registration_lock = asyncio.Lock()
        self.busy = 0  # suggestions being made
        self.session = f"lsp-{os.getpid()}"  # the daemon supersedes older jobs of the same session
        self._link: DaemonLink | None = None
        self._logged: dict[str, float] = {}
        self._status_sent: dict[str, Any] | None = None
        self._pause: Pause | None = None
        self._resume: asyncio.TimerHandle | None = None

    @property
    def link(self) -> DaemonLink:
        if self._link is None:
            from lsp.daemon_link import DaemonLink, LinkHooks

            hooks = LinkHooks(
                log=self.log,
                changed=self.status_changed,
                warm_shapes=self._warm_shapes,
                work_done=self._progress,
            )
            self._link = DaemonLink(hooks)
            self._configure_link()
        return self._link

    def _warm_shapes(self, max_context: int | None, recommended: int | None) -> list[WarmShape]:
        return warm_shapes(self.settings, max_context, recommended)

    def _progress(self) -> Progress | None:
        window = self.client_capabilities.window
        return self.work_done_progress if window and window.work_done_progress else None

    def _configure_link(self) -> None:
        s = self.settings
        if self._link is not None:
            self._link.configure(url=s.url, api_key=s.api_key, model=s.model, autostart=s.autostart)

    # -- the editor's view of us ----------------------------------------------------------------------
    def log(self, message: str, *, level: str = "info", show: bool = False) -> None:
        """``window/logMessage`` (and ``showMessage`` with ``show``); repeats of an error are rate-limited."""
        getattr(log, "debug" if level == "debug" else level)(message)
        if level in ("error", "warning"):
            now = time.monotonic()
            if now - self._logged.get(message, -ERROR_REPEAT_SECONDS) < ERROR_REPEAT_SECONDS:
                return
            if len(self._logged) > 1000:  # forget what can no longer be a repeat
                self._logged = {m: t for m, t in self._logged.items() if now - t < ERROR_REPEAT_SECONDS}
            self._logged[message] = now
        try:
            self.window_log_message(types.LogMessageParams(type=_LEVELS[level], message=message))
            if show:
                self.window_show_message(types.ShowMessageParams(type=_LEVELS[level], message=message))
        except Exception:  # no transport (shutting down): the stderr log above still has it
            log.debug("could not send a log message", exc_info=True)

    def report_server_error(self, error: Exception, source: Any) -> None:
        """A failed notification handler: one line in the editor's log, never a popup or a traceback."""
        del source
        self.log(f"diffu: {type(error).__name__}: {error}", level="error")

    def status_item(self) -> dict[str, Any]:
        link = self._link
        stage, _, detail = link.progress.latest if link is not None else ("", 0.0, "")
        item = status_item(
            enabled=self.settings.enable,
            paused=self.paused,
            link_state=link.state if link is not None else "connecting",
            busy=self.busy > 0,
            error=link.error if link is not None else "",
            detail=stage_message(stage, detail) if stage and stage != HEALTH_OK else "",
            latency_ms=self.timings.last_ms,
            model=link.model if link is not None else "",
        )
        return item.to_json()

    def status_changed(self) -> None:
        """Send ``diffu/status`` (the editors' status item) when what it shows changed."""
        item = self.status_item()
        if item == self._status_sent or not self.protocol.initialize_received:
            return
        self._status_sent = item
        try:
            self.protocol.notify(STATUS_NOTIFICATION, item)
        except Exception:  # no transport (shutting down)
            log.debug("could not send the status", exc_info=True)

    # -- pausing: the toggle and snooze commands -------------------------------------------------------
    @property
    def paused(self) -> Pause | None:
        """The user's pause of suggestions while typing, while it lasts."""
        pause = self._pause
        return pause if pause is not None and pause.active(time.monotonic()) else None

    def pause(self, minutes: float | None) -> None:
        """Pause suggestions while typing for ``minutes`` (None: until resumed); explicit requests still
        ask. The status item says so, and says it again when a snooze ends."""
        self._cancel_resume()
        if minutes is None:
            self._pause = Pause(until=math.inf)
        else:
            seconds = minutes * 60.0
            self._pause = Pause(until=time.monotonic() + seconds, wall=time.time() + seconds)
            self._resume = asyncio.get_running_loop().call_later(seconds, self.status_changed)
        self.status_changed()

    def resume(self) -> None:
        self._cancel_resume()
        self._pause = None
        self.status_changed()

    def _cancel_resume(self) -> None:
        if self._resume is not None:
            self._resume.cancel()
            self._resume = None

    # -- settings --------------------------------------------------------------------------------------
    def apply_settings(self, data: Any, *, source: str) -> list[str]:
        """Apply a (partial) settings object; bad keys are reported and the rest applied."""
        before = self.settings
        self.settings, problems = parse_settings(data, before)
        for problem in problems:
            self.log(f"diffu settings ({source}): {problem}", level="warning", show=True)
        self._configure_link()
        if before.fingerprint() != self.settings.fingerprint():
            self.cache.clear()  # cached suggestions were made under other settings
        self.status_changed()
        return problems

    # -- documents -------------------------------------------------------------------------------------
    def open_document(self, uri: str) -> TextDocument | None:
        """The open document ``uri`` names, however the client escaped it; None when it is not open."""
        return self.workspace.text_documents.get(document_key(uri))

    def document(self, uri: str) -> TextDocument:
        """An open document; an unopened one is the request's error (-32602), never a read from disk."""
        doc = self.open_document(uri)
        if doc is None:
            raise JsonRpcInvalidParams(f"{uri} is not an open document (send textDocument/didOpen first)")
        return doc

    def offset(self, doc: TextDocument, position: types.Position) -> int:
        if position.line > len(doc.lines):
            raise JsonRpcInvalidParams(
                f"position line {position.line} is beyond the end of {doc.uri} ({len(doc.lines)} lines)"
            )
        return doc.offset_at_position(position)

    def relative_path(self, uri: str) -> str:
        parsed = urlparse(uri)
        path = unquote(parsed.path) if parsed.scheme == "file" else uri
        root = self.workspace.root_path
        for folder in [root, *[unquote(urlparse(f.uri).path) for f in self.workspace.folders.values()]]:
            if folder and path.startswith(folder.rstrip("/") + "/"):
                return path[len(folder.rstrip("/")) + 1 :]
        return PurePosixPath(path).name or path

    def enabled_for(self, doc: TextDocument) -> bool:
        s = self.settings
        return s.enable and (not s.languages or (doc.language_id or "") in s.languages)

    def touch(self, uri: str, line: int | None = None) -> None:
        """The user opened or edited ``uri`` (at ``line``): it is recent, and so is the chunk around it."""
        key = document_key(uri)
        self.touched[key] = time.monotonic()
        if line is not None and not self.settings.current_file_only:
            doc = self.open_document(uri)
            if doc is not None:
                self.recent.note(key, self.relative_path(doc.uri), doc.source, line)

    def forget(self, uri: str) -> None:
        key = document_key(uri)
        self.touched.pop(key, None)
        self.supersede.cancel(key)

    def context_documents(self, uri: str) -> list[tuple[str, str]]:
        """Text beyond the file for the prompt: recent chunks, then other open documents, newest first."""
        if self.settings.current_file_only:
            return []
        key = document_key(uri)
        out = [(c.name, c.text) for c in self.recent.chunks(exclude=key)]
        others = sorted(
            (doc for doc in self.workspace.text_documents.values() if document_key(doc.uri) != key),
            key=lambda doc: self.touched.get(document_key(doc.uri), 0.0),
            reverse=True,
        )
        for doc in others[:MAX_OTHER_DOCUMENTS]:
            if doc.source.strip():
                out.append((self.relative_path(doc.uri), doc.source))
        return out

    def start_io(self, stdin: Any = None, stdout: Any = None) -> int:
        """Serve over stdio until ``exit``; returns the exit code (0 only after ``shutdown``)."""
        return serve(self.protocol, stdin or sys.stdin.buffer, stdout or sys.stdout.buffer)
