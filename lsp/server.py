"""``diffu lsp``: infill completions and fill-holes over the Language Server Protocol (pygls 2).

Handlers stay thin: they read the document, hand the text to the pure helpers in ``context``,
``postprocess``, ``holes`` and ``cache``, and talk to the daemon through ``assistant.client`` (never
jax: an editor starts this on every file open, and ``initialize`` must be answered at once).

Capabilities follow the client: ``inlineCompletionProvider`` (LSP 3.18) when it declares
``textDocument.inlineCompletion``, otherwise ``completionProvider``; either is registered dynamically,
for the configured languages, when the client offers dynamic registration for it.

Requests are async handlers, so pygls answers a ``$/cancelRequest`` with RequestCancelled by cancelling
the task; the cancellation reaches the HTTP request, whose closed connection makes the daemon drop the
job at its next denoising step. A newer completion request for the same document supersedes the older
one the same way (the older is answered with an empty result), and the ``session`` field lets the daemon
supersede it even before it notices the closed connection.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import deque
from collections.abc import Awaitable, Callable
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import unquote, urlparse

from lsprotocol import types
from lsprotocol.converters import get_converter
from pygls.lsp.server import LanguageServer
from pygls.protocol import LanguageServerProtocol
from pygls.protocol.language_server import lsp_method
from pygls.workspace import TextDocument

from assistant import __version__
from lsp import context as ctx
from lsp.cache import SuggestionCache
from lsp.holes import MASK, Hole, clean_fill, find_holes, masked_prompt
from lsp.postprocess import postprocess
from lsp.settings import SECTION, Settings, parse_settings, settings_section

if TYPE_CHECKING:
    from assistant.client import AsyncClient
    from lsp.daemon_link import DaemonLink

# assistant.client (httpx) is imported after ``initialize`` is answered, in the handlers that need it:
# importing it up front would add a tenth of a second to every editor's start.

log = logging.getLogger("diffu.lsp")

FILL_HOLES = "diffu.fillHoles"
ACCEPTED = "diffu.accepted"
STATUS = "diffu.status"
MAX_OTHER_DOCUMENTS = 10
ERROR_REPEAT_SECONDS = 30.0  # the same error is logged again only after this long
T = TypeVar("T")
CONVERTER = get_converter()


class DiffuProtocol(LanguageServerProtocol):
    """pygls' protocol, with the capabilities adjusted to the client once pygls has built them."""

    _server: DiffuLanguageServer

    @lsp_method(types.INITIALIZE)
    def lsp_initialize(self, params: types.InitializeParams) -> Any:
        result = yield from super().lsp_initialize(params)
        self._server.choose_capabilities(result.capabilities)
        return result


class DiffuLanguageServer(LanguageServer):
    """The server's state: settings, the daemon link, the suggestion cache and in-flight requests."""

    def __init__(self) -> None:
        super().__init__(
            "diffu",
            __version__,
            protocol_cls=DiffuProtocol,
            text_document_sync_kind=types.TextDocumentSyncKind.Incremental,
        )
        self.settings = Settings()
        self._daemon: DaemonLink | None = None
        self.cache = SuggestionCache()
        self._inflight: dict[str, asyncio.Task[Any]] = {}
        self._touched: dict[str, float] = {}
        self._registrations: dict[str, str] = {}
        self._inline = False  # inline completion (else the completion fallback)
        self._dynamic = False  # the chosen provider is registered dynamically
        self._logged: dict[str, float] = {}
        # Per answered request: (handler ms, daemon round trip ms, engine ms, daemon queue ms), newest last;
        # ``diffu.status`` reports them so the LSP and HTTP overhead can be told from the model's time.
        self.timings: deque[tuple[float, float, float, float]] = deque(maxlen=100)
        self.counters = {
            "requests": 0,
            "answered": 0,
            "cached": 0,
            "superseded": 0,
            "cancelled": 0,
            "errors": 0,
            "accepted": 0,
            "holes_filled": 0,
        }

    @property
    def daemon(self) -> DaemonLink:
        if self._daemon is None:
            from lsp.daemon_link import DaemonLink

            self._daemon = DaemonLink(self)
            self._configure_daemon()
        return self._daemon

    def _configure_daemon(self) -> None:
        s = self.settings
        if self._daemon is not None:
            self._daemon.configure(url=s.url, api_key=s.api_key, model=s.model, autostart=s.autostart)

    # -- capabilities ----------------------------------------------------------------------------------
    def choose_capabilities(self, caps: types.ServerCapabilities) -> None:
        """Keep one completion provider, static or (where offered) dynamically registered later."""
        text = self.client_capabilities.text_document
        inline = text.inline_completion if text else None
        completion = text.completion if text else None
        self._inline = inline is not None
        if self._inline:
            caps.completion_provider = None  # one source of suggestions, not two
            self._dynamic = bool(inline.dynamic_registration) if inline else False
            caps.inline_completion_provider = None if self._dynamic else types.InlineCompletionOptions()
        else:
            caps.inline_completion_provider = None
            self._dynamic = bool(completion and completion.dynamic_registration)
            if self._dynamic:
                caps.completion_provider = None

    @property
    def can_resolve_edits(self) -> bool:
        text = self.client_capabilities.text_document
        resolve = text.code_action.resolve_support if text and text.code_action else None
        return bool(resolve and "edit" in resolve.properties)

    @property
    def supports_work_done_progress(self) -> bool:
        window = self.client_capabilities.window
        return bool(window and window.work_done_progress)

    def _selector(self) -> list[types.TextDocumentFilter]:
        if self.settings.languages:
            return [types.TextDocumentFilterLanguage(language=lang) for lang in self.settings.languages]
        return [
            types.TextDocumentFilterScheme(scheme="file"),
            types.TextDocumentFilterScheme(scheme="untitled"),
        ]

    async def sync_registrations(self) -> None:
        """(Re-)register the completion provider for the current languages, or drop it when disabled."""
        if not self._dynamic:
            return
        method = types.TEXT_DOCUMENT_INLINE_COMPLETION if self._inline else types.TEXT_DOCUMENT_COMPLETION
        old = self._registrations.pop(method, None)
        if old is not None:
            await self.client_unregister_capability_async(
                types.UnregistrationParams(unregisterations=[types.Unregistration(id=old, method=method)])
            )
        if not self.settings.enable:
            return
        reg_id = f"diffu-{method}-{time.monotonic_ns()}"
        options: Any
        if self._inline:
            options = types.InlineCompletionRegistrationOptions(document_selector=self._selector())
        else:
            options = types.CompletionRegistrationOptions(
                document_selector=self._selector(), trigger_characters=TRIGGER_CHARACTERS
            )
        await self.client_register_capability_async(
            types.RegistrationParams(
                registrations=[types.Registration(id=reg_id, method=method, register_options=options)]
            )
        )
        self._registrations[method] = reg_id

    # -- logging ---------------------------------------------------------------------------------------
    def log(self, message: str, *, level: str = "info", show: bool = False) -> None:
        """``window/logMessage`` (and ``showMessage`` with ``show``); repeats of an error are rate-limited."""
        kind = {
            "error": types.MessageType.Error,
            "warning": types.MessageType.Warning,
            "info": types.MessageType.Info,
            "debug": types.MessageType.Log,
        }[level]
        getattr(log, "debug" if level == "debug" else level)(message)
        if level in ("error", "warning"):
            now = time.monotonic()
            if now - self._logged.get(message, -ERROR_REPEAT_SECONDS) < ERROR_REPEAT_SECONDS:
                return
            self._logged[message] = now
        try:
            self.window_log_message(types.LogMessageParams(type=kind, message=message))
            if show:
                self.window_show_message(types.ShowMessageParams(type=kind, message=message))
        except Exception:  # no transport (shutting down): the stderr log above still has it
            log.debug("could not send a log message", exc_info=True)

    # -- settings --------------------------------------------------------------------------------------
    def apply_settings(self, data: Any, *, source: str) -> list[str]:
        """Apply a (partial) settings object; bad keys are reported and the rest applied."""
        before = self.settings
        self.settings, problems = parse_settings(data, before)
        for problem in problems:
            self.log(f"diffu settings ({source}): {problem}", level="warning", show=True)
        s = self.settings
        self._configure_daemon()
        shaping = (
            "max_tokens",
            "steps",
            "temperature",
            "context_tokens",
            "prefix_fraction",
            "snippet_tokens",
            "current_file_only",
            "min_chars",
            "url",
            "model",
        )
        if any(getattr(before, k) != getattr(s, k) for k in shaping):
            self.cache.clear()  # cached suggestions were made under other settings
        return problems

    # -- documents -------------------------------------------------------------------------------------
    def touch(self, uri: str) -> None:
        self._touched[uri] = time.monotonic()

    def forget(self, uri: str) -> None:
        self._touched.pop(uri, None)
        task = self._inflight.pop(uri, None)
        if task is not None:
            task.cancel()

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

    def other_documents(self, uri: str) -> list[tuple[str, str]]:
        """Other open documents, most recently used first, as (relative path, text)."""
        if self.settings.current_file_only:
            return []
        uris = sorted(
            (u for u in self.workspace.text_documents if u != uri),
            key=lambda u: self._touched.get(u, 0.0),
            reverse=True,
        )
        out = []
        for other in uris[:MAX_OTHER_DOCUMENTS]:
            doc = self.workspace.get_text_document(other)
            if doc.source.strip():
                out.append((self.relative_path(other), doc.source))
        return out

    # -- supersede -------------------------------------------------------------------------------------
    async def latest_only(self, key: str, work: Callable[[], Awaitable[T]], empty: T) -> T:
        """Run ``work`` as the only request for ``key``: a newer one cancels it (then ``empty`` is returned).

        The request's own cancellation (``$/cancelRequest``) propagates to ``work`` and re-raises, so
        pygls answers RequestCancelled; a supersede is an internal matter, answered normally and empty.
        """
        older = self._inflight.get(key)
        if older is not None and not older.done():
            older.cancel()
        task = asyncio.ensure_future(work())
        self._inflight[key] = task
        try:
            return await task
        except asyncio.CancelledError:
            me = asyncio.current_task()
            if me is not None and me.cancelling():
                self.counters["cancelled"] += 1
                raise
            self.counters["superseded"] += 1
            return empty
        finally:
            if self._inflight.get(key) is task:
                del self._inflight[key]

    # -- completion ------------------------------------------------------------------------------------
    async def suggest(
        self,
        uri: str,
        position: types.Position,
        *,
        invoked: bool,
        replace: tuple[types.Range, str] | None = None,
    ) -> str | None:
        """The text to insert at a cursor, or None. Never raises for daemon trouble: it is logged instead.

        ``replace`` is VS Code's selected completion item (range, text): the suggestion must extend it,
        so the model sees the document as if the item were already inserted.
        """
        from assistant.client import APIError, DaemonUnavailable
        from lsp.daemon_link import describe

        self.counters["requests"] += 1
        received = time.perf_counter()
        doc = self.workspace.get_text_document(uri)
        if not self.enabled_for(doc):
            return None
        text = doc.source
        offset = doc.offset_at_position(position)
        before, after = text[:offset], text[offset:]
        if replace is not None:
            before = text[: doc.offset_at_position(replace[0].start)] + replace[1]
        s = self.settings
        if not invoked and s.debounce_ms:
            # Typing goes on: a newer request for this document cancels us here, before any model work.
            await asyncio.sleep(s.debounce_ms / 1000)
        fingerprint = f"{s.max_tokens}|{s.steps}|{s.temperature}|{s.context_tokens}"
        if not invoked:
            hit = self.cache.get(before, after, fingerprint)
            if hit is not None:
                self.counters["cached"] += 1
                return hit
        try:
            client = await self.daemon.ready()
            result, timing = await self._infill(client, uri, doc, before, after, invoked=invoked)
        except DaemonUnavailable as exc:
            self.counters["errors"] += 1
            self.daemon.lost(str(exc))
            self.log(f"diffu: {exc}", level="error")
            return None
        except APIError as exc:
            self.counters["errors"] += 1
            self.log(f"diffu: completion failed: {describe(exc)}", level="error")
            return None
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug here must cost one suggestion, not the server
            self.counters["errors"] += 1
            log.exception("completion failed")
            self.log(f"diffu: completion failed: {type(exc).__name__}: {exc}", level="error")
            return None
        if result is None:
            return None
        self.cache.put(before, after, fingerprint, result)
        self.counters["answered"] += 1
        waited = s.debounce_ms if not invoked else 0
        handler_ms = (time.perf_counter() - received) * 1000 - waited
        self.timings.append((handler_ms, *timing))
        return result

    async def _infill(
        self, client: AsyncClient, uri: str, doc: TextDocument, before: str, after: str, *, invoked: bool
    ) -> tuple[str | None, tuple[float, float, float]]:
        """The post-processed infill and (daemon round trip ms, engine ms, queue ms)."""
        from assistant.client import APIError, SamplingOptions

        s = self.settings
        others = self.other_documents(uri)
        line_before = before[before.rfind("\n") + 1 :]
        above = before[: len(before) - len(line_before)].rstrip("\n")
        line_above = above[above.rfind("\n") + 1 :]
        mode = ctx.classify(line_before, after.split("\n", 1)[0], line_above)
        canvas = ctx.canvas_tokens(mode, s.max_tokens)
        steps = min(s.steps, canvas) if s.steps else (canvas if invoked else max(1, canvas // 2))
        for attempt in range(3):
            budget = s.context_tokens
            if self.daemon.max_context:
                # The daemon refuses a prompt that does not fit its context together with the canvas.
                budget = min(budget, int(self.daemon.max_context) - canvas - 2)
            prompt = ctx.build_prompt(
                before=before,
                after=after,
                path=self.relative_path(uri),
                language=doc.language_id or "",
                budget_tokens=max(budget, 8),
                prefix_fraction=s.prefix_fraction,
                chars_per_token=self.daemon.chars_per_token,
                snippet_tokens=s.snippet_tokens,
                other_documents=others,
            )
            chars = len(prompt.prefix) + len(prompt.suffix)
            sent = time.perf_counter()
            try:
                done = await client.infill(
                    prompt.prefix,
                    prompt.suffix,
                    canvas_tokens=canvas,
                    sampling=SamplingOptions(steps=steps, temperature=s.temperature),
                    session=f"lsp-{os.getpid()}:{uri}",
                    max_seconds=s.max_seconds or None,
                )
            except APIError as exc:
                if exc.status == 400 and exc.param == "prompt" and attempt < 2:
                    # Our characters-per-token guess was too generous for this tokenizer: learn and retry.
                    self.daemon.learn_from_overflow(chars, exc.message)
                    continue
                raise
            self.daemon.learn_ratio(chars, int(done.usage.get("prompt_tokens", 0)))
            timing = (
                (time.perf_counter() - sent) * 1000,
                float(done.stats.get("generate_seconds", 0.0)) * 1000,
                float(done.stats.get("queue_seconds", 0.0)) * 1000,
            )
            if done.finish_reason == "cancelled":
                return None, timing
            text = postprocess(
                done.text,
                suffix=prompt.suffix,
                mode=mode,
                cursor_line=line_before,
                line_above=line_above,
                min_chars=s.min_chars,
            )
            return text, timing
        return None, (0.0, 0.0, 0.0)

    # -- fill holes ------------------------------------------------------------------------------------
    def holes_in(self, doc: TextDocument, range_: types.Range | None) -> list[Hole]:
        """The holes of the document, or of ``range_`` when it is not empty."""
        start, end = 0, len(doc.source)
        if range_ is not None and range_.start != range_.end:
            start, end = doc.offset_at_position(range_.start), doc.offset_at_position(range_.end)
        return find_holes(doc.source, self.settings.hole_marker, self.settings.hole_tokens, start, end)

    async def fill_holes(self, uri: str, range_: types.Range | None) -> types.WorkspaceEdit | None:
        """Fill every hole in ``range_`` (or the document) and return the edit; None when nothing got text."""
        doc = self.workspace.get_text_document(uri)
        text = doc.source
        holes = self.holes_in(doc, range_)
        if not holes:
            return None
        client = await self.daemon.ready()
        if "holes" in self.daemon.features:
            fills = await self._fill_one_run(client, uri, doc, holes)
        else:
            self.log(
                f"diffu: this daemon fills one hole per run; filling {len(holes)} holes in turn",
                level="debug",
            )
            fills = await self._fill_in_turn(client, uri, doc, holes)
        edits = []
        for hole, fill in zip(holes, fills, strict=True):
            fill = clean_fill(fill, text, hole)
            if not fill:
                continue  # an empty fill leaves the marker: the user sees which hole the model skipped
            edits.append(
                types.TextEdit(
                    range=types.Range(
                        start=doc.client_position_at_offset(hole.start),
                        end=doc.client_position_at_offset(hole.end),
                    ),
                    new_text=fill,
                )
            )
        self.counters["holes_filled"] += len(edits)
        if len(edits) < len(holes):
            self.log(
                f"diffu: {len(holes) - len(edits)} of {len(holes)} holes got no text",
                level="warning",
                show=not edits,
            )
        if not edits:
            return None
        return self._workspace_edit(doc, edits)

    def _workspace_edit(self, doc: TextDocument, edits: list[types.TextEdit]) -> types.WorkspaceEdit:
        workspace = self.client_capabilities.workspace
        versioned = bool(workspace and workspace.workspace_edit and workspace.workspace_edit.document_changes)
        if versioned:
            # With a version the editor refuses the edit if the document changed while the model ran.
            ident = types.OptionalVersionedTextDocumentIdentifier(uri=doc.uri, version=doc.version)
            return types.WorkspaceEdit(
                document_changes=[types.TextDocumentEdit(text_document=ident, edits=list(edits))]
            )
        return types.WorkspaceEdit(changes={doc.uri: list(edits)})

    def _hole_params(self, tokens: int, uri: str) -> dict[str, Any]:
        s = self.settings
        params: dict[str, Any] = {
            "steps": s.steps or tokens,
            "temperature": s.temperature,
            "session": f"lsp-{os.getpid()}:holes:{uri}",
        }
        if s.max_seconds:
            params["max_seconds"] = s.max_seconds
        return params

    async def _fitting(self, chars: int, request: Awaitable[T]) -> T:
        """Await a daemon request; a context overflow teaches the characters-per-token ratio and re-raises."""
        from assistant.client import APIError

        try:
            return await request
        except APIError as exc:
            if exc.status == 400 and exc.param == "prompt":
                self.daemon.learn_from_overflow(chars, exc.message)
            raise

    async def _retry_on_overflow(self, attempt: Callable[[], Awaitable[T]]) -> T:
        """Run ``attempt`` (which builds its prompt from the current ratio) up to three times on overflow."""
        from assistant.client import APIError

        for tries in range(3):
            try:
                return await attempt()
            except APIError as exc:
                if tries == 2 or exc.status != 400 or exc.param != "prompt":
                    raise
        raise AssertionError("unreachable")

    def _budget_chars(self, reserve_tokens: int) -> int:
        budget = self.settings.context_tokens
        if self.daemon.max_context:
            budget = min(budget, int(self.daemon.max_context) - reserve_tokens - 2)
        return int(max(budget, 8) * self.daemon.chars_per_token)

    async def _fill_one_run(
        self, client: AsyncClient, uri: str, doc: TextDocument, holes: list[Hole]
    ) -> list[str]:
        """Every hole in one diffusion run: ``/v1/diffu/generate`` with the masks inside the prompt."""
        from assistant.client import APIError

        total = sum(h.tokens for h in holes)

        async def attempt() -> dict[str, Any]:
            prompt = masked_prompt(
                doc.source,
                holes,
                path=self.relative_path(uri),
                language=doc.language_id or "",
                budget_chars=self._budget_chars(0),
            )
            body = {
                "prompt": prompt.text,
                "max_new_tokens": 0,
                **self._hole_params(total, uri),
                "stream": False,
            }
            return await self._fitting(len(prompt.text), client.request("POST", "/v1/diffu/generate", body))

        done = await self._retry_on_overflow(attempt)
        fills = done.get("holes")
        if not isinstance(fills, list) or len(fills) != len(holes):
            raise APIError(500, f"expected {len(holes)} hole fills from the daemon, got {fills!r}")
        return [str(f) for f in fills]

    async def _fill_in_turn(
        self, client: AsyncClient, uri: str, doc: TextDocument, holes: list[Hole]
    ) -> list[str]:
        """One infill run per hole, left to right, each seeing the fills before it and the masks after it."""
        header = ctx.header_line(self.relative_path(uri), doc.language_id or "")
        current = doc.source
        fills: list[str] = []
        shift = 0  # how far earlier fills moved the text
        for i, hole in enumerate(holes):
            start, end = hole.start + shift, hole.end + shift
            after = current[end:]
            for other in reversed(holes[i + 1 :]):  # later holes stay holes, as masks the model also sees
                o_start, o_end = other.start + shift - end, other.end + shift - end
                after = after[:o_start] + MASK * other.tokens + after[o_end:]
            before, tokens = current[:start], hole.tokens
            text = await self._retry_on_overflow(
                lambda before=before, after=after, tokens=tokens: self._fill_hole(
                    client, uri, header, before, after, tokens
                )
            )
            fill = clean_fill(text, current, Hole(start, end, hole.tokens))
            fills.append(fill)
            if fill:
                current = current[:start] + fill + current[end:]
                shift += len(fill) - (hole.end - hole.start)
        return fills

    async def _fill_hole(
        self, client: AsyncClient, uri: str, header: str, before: str, after: str, tokens: int
    ) -> str:
        from assistant.client import SamplingOptions

        budget = self._budget_chars(tokens) - len(header)
        before, after, _ = ctx.window(before, after, budget, 0.7)
        params = self._hole_params(tokens, uri)
        request = client.infill(
            header + before,
            after,
            canvas_tokens=tokens,
            sampling=SamplingOptions(steps=params["steps"], temperature=params["temperature"]),
            session=params["session"],
            max_seconds=params.get("max_seconds"),
        )
        return (await self._fitting(len(header) + len(before) + len(after), request)).text


TRIGGER_CHARACTERS = [".", "(", "[", "{", ",", ":", "="]
SERVER = DiffuLanguageServer()


# -- lifecycle ----------------------------------------------------------------------------------------
@SERVER.feature(types.INITIALIZE)
def initialize(ls: DiffuLanguageServer, params: types.InitializeParams) -> None:
    """Read ``initializationOptions``; nothing here waits on the daemon."""
    ls.apply_settings(params.initialization_options, source="initializationOptions")


@SERVER.feature(types.INITIALIZED)
async def initialized(ls: DiffuLanguageServer, params: types.InitializedParams) -> None:
    """Start connecting to the daemon in the background and register providers where dynamic."""
    del params
    ls.daemon.start()
    try:
        await ls.sync_registrations()
        workspace = ls.client_capabilities.workspace
        change = workspace.did_change_configuration if workspace else None
        if change and change.dynamic_registration:
            # Pull-model clients (VS Code) then send didChangeConfiguration when our section changes.
            await ls.client_register_capability_async(
                types.RegistrationParams(
                    registrations=[
                        types.Registration(
                            id="diffu-configuration",
                            method=types.WORKSPACE_DID_CHANGE_CONFIGURATION,
                            register_options={"section": SECTION},
                        )
                    ]
                )
            )
        if workspace and workspace.configuration:
            await _pull_configuration(ls)
    except Exception as exc:  # an editor that refuses a registration still gets static features
        ls.log(f"diffu: could not register with the editor: {exc}", level="warning")


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
        await ls.sync_registrations()
    if (before.url, before.api_key, before.model, before.autostart) != (
        s.url,
        s.api_key,
        s.model,
        s.autostart,
    ):
        ls.daemon.start()


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


@SERVER.feature(types.TEXT_DOCUMENT_DID_OPEN)
def did_open(ls: DiffuLanguageServer, params: types.DidOpenTextDocumentParams) -> None:
    ls.touch(params.text_document.uri)


@SERVER.feature(types.TEXT_DOCUMENT_DID_CHANGE)
def did_change(ls: DiffuLanguageServer, params: types.DidChangeTextDocumentParams) -> None:
    ls.touch(params.text_document.uri)


@SERVER.feature(types.TEXT_DOCUMENT_DID_CLOSE)
def did_close(ls: DiffuLanguageServer, params: types.DidCloseTextDocumentParams) -> None:
    ls.forget(params.text_document.uri)


# -- completion ---------------------------------------------------------------------------------------
@SERVER.feature(types.TEXT_DOCUMENT_INLINE_COMPLETION, types.InlineCompletionOptions())
async def inline_completion(
    ls: DiffuLanguageServer, params: types.InlineCompletionParams
) -> types.InlineCompletionList | None:
    """Ghost text at the cursor (LSP 3.18)."""
    uri, pos = params.text_document.uri, params.position
    invoked = params.context.trigger_kind == types.InlineCompletionTriggerKind.Invoked
    selected = params.context.selected_completion_info
    replace = (selected.range, selected.text) if selected is not None else None

    async def work() -> types.InlineCompletionList | None:
        suggestion = await ls.suggest(uri, pos, invoked=invoked, replace=replace)
        if suggestion is None:
            return None
        if replace is not None:
            insert, start = replace[1] + suggestion, replace[0].start
        else:
            insert, start = suggestion, pos
        item = types.InlineCompletionItem(
            insert_text=insert,
            range=types.Range(start=start, end=pos),
            command=types.Command(title="diffu: accepted", command=ACCEPTED, arguments=[uri, len(insert)]),
        )
        return types.InlineCompletionList(items=[item])

    return await ls.latest_only(uri, work, None)


def _word_start(line: str) -> int:
    i = len(line)
    while i > 0 and (line[i - 1].isalnum() or line[i - 1] == "_"):
        i -= 1
    return i


@SERVER.feature(
    types.TEXT_DOCUMENT_COMPLETION, types.CompletionOptions(trigger_characters=TRIGGER_CHARACTERS)
)
async def completion(ls: DiffuLanguageServer, params: types.CompletionParams) -> types.CompletionList:
    """The fallback for clients without inline completion: one item whose edit inserts the infill.

    The edit replaces the word before the cursor with that word plus the infill, so clients that filter
    items by the typed word keep it; ``isIncomplete`` makes them ask again as the user types.
    """
    uri, pos = params.text_document.uri, params.position
    invoked = (
        params.context is not None and params.context.trigger_kind == types.CompletionTriggerKind.Invoked
    )
    empty = types.CompletionList(is_incomplete=True, items=[])

    async def work() -> types.CompletionList:
        suggestion = await ls.suggest(uri, pos, invoked=invoked)
        if suggestion is None:
            return empty
        doc = ls.workspace.get_text_document(uri)
        offset = doc.offset_at_position(pos)
        line = doc.source[doc.source.rfind("\n", 0, offset) + 1 : offset]
        word = line[_word_start(line) :]
        start = doc.client_position_at_offset(offset - len(word))
        new_text = word + suggestion
        first = new_text.strip().split("\n", 1)[0]
        label = first if len(first) <= 60 else first[:57] + "..."
        item = types.CompletionItem(
            label=label or new_text.strip()[:60],
            kind=types.CompletionItemKind.Text,
            detail="diffu",
            documentation=types.MarkupContent(kind=types.MarkupKind.PlainText, value=new_text),
            filter_text=new_text,
            sort_text="0",
            insert_text_format=types.InsertTextFormat.PlainText,
            text_edit=types.TextEdit(range=types.Range(start=start, end=pos), new_text=new_text),
            command=types.Command(title="diffu: accepted", command=ACCEPTED, arguments=[uri, len(new_text)]),
        )
        return types.CompletionList(is_incomplete=True, items=[item])

    return await ls.latest_only(uri, work, empty)


# -- fill holes ---------------------------------------------------------------------------------------
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
    doc = ls.workspace.get_text_document(params.text_document.uri)
    selection = params.range.start != params.range.end
    holes = ls.holes_in(doc, params.range)
    if not holes:
        return None
    where = "the selection" if selection else "this file"
    title = f"Fill {len(holes)} hole{'s' if len(holes) > 1 else ''} in {where} with diffu"
    target = {"uri": doc.uri, "range": CONVERTER.unstructure(params.range) if selection else None}
    action = types.CodeAction(title=title, kind=types.CodeActionKind.RefactorRewrite)
    if ls.can_resolve_edits:
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

    try:
        return await ls.latest_only(f"holes:{uri}", lambda: ls.fill_holes(uri, range_), None)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        if isinstance(exc, DaemonUnavailable):
            ls.daemon.lost(str(exc))
        else:
            log.exception("fill holes failed")
        ls.log(f"diffu: fill holes failed: {describe(exc)}", level="error", show=True)
        return None


@SERVER.command(FILL_HOLES)
async def fill_holes_command(ls: DiffuLanguageServer, *args: Any) -> Any:
    """``diffu.fillHoles(uri, range?)``: fill the holes in one run, apply the edit, and return it."""
    uri, range_ = _fill_args(ls, args)
    if not ls.holes_in(ls.workspace.get_text_document(uri), range_):
        ls.log(
            f"diffu: no holes to fill (mark them with <|mask|> or {ls.settings.hole_marker or '<|mask|>'})",
            level="info",
            show=True,
        )
        return None
    edit = await _fill(ls, uri, range_)
    if edit is None:
        return None  # why was already shown: an error, or no hole got text
    result = await ls.workspace_apply_edit_async(
        types.ApplyWorkspaceEditParams(edit=edit, label="diffu: fill holes")
    )
    if not result.applied:
        ls.log(
            f"diffu: the editor did not apply the fills ({result.failure_reason or 'no reason given'})",
            level="warning",
        )
    return edit


def _fill_args(ls: DiffuLanguageServer, args: tuple[Any, ...]) -> tuple[str, types.Range | None]:
    """(uri, range) from the command's arguments: ``[uri]``, ``[uri, range]`` or ``[{uri, range}]``."""
    from pygls.exceptions import JsonRpcInvalidParams

    if len(args) == 1 and isinstance(args[0], dict):
        args = (args[0].get("uri"), args[0].get("range"))
    if not args or not isinstance(args[0], str):
        raise JsonRpcInvalidParams(
            f"{FILL_HOLES}: expected a document uri as the first argument, got {args!r}"
        )
    uri = args[0]
    if ls.workspace.text_documents.get(uri) is None:
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


@SERVER.command(STATUS)
def status(ls: DiffuLanguageServer, *args: Any) -> dict[str, Any]:
    """Where the server stands: daemon, model, settings, counters and cache."""
    del args
    return {
        "connected": ls.daemon.connected,
        "model": ls.daemon.model,
        "max_context": ls.daemon.max_context,
        "daemon_features": sorted(ls.daemon.features),
        "url": ls.daemon.url,
        "provider": "inlineCompletion" if ls._inline else "completion",
        "dynamic": ls._dynamic,
        "chars_per_token": round(ls.daemon.chars_per_token, 3),
        "settings": ls.settings.to_json(),
        "counters": dict(ls.counters),
        "timings": [
            {
                "handler_ms": round(h, 3),
                "daemon_ms": round(d, 3),
                "engine_ms": round(e, 3),
                "queue_ms": round(q, 3),
            }
            for h, d, e, q in ls.timings
        ],
        "cache": {"entries": len(ls.cache), "hits": ls.cache.hits, "forward_hits": ls.cache.forward_hits},
    }


def main() -> None:
    """Serve over stdio until the editor says exit."""
    SERVER.start_io()
