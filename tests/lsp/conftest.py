"""Fixtures for language-server tests: real ``diffu lsp`` processes over stdio, real daemons.

The daemons are the shared session fixtures of tests/conftest.py (the JAX-free fake backend and the
tiny checkpoint). Each test starts its own ``diffu lsp`` (under a second) with a pytest-lsp
client that also records the editor-side requests a server makes: capability registrations and
workspace edits.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest_asyncio
from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities

from tests.assistant.helpers import REPO, DaemonProcess, isolated_env
from tests.lsp.rawclient import LSP_COMMAND

DATA = Path(__file__).parent / "data"


def capabilities(profile: str) -> types.ClientCapabilities:
    """Client capabilities by profile: pytest-lsp's captures, plus Neovim 0.12 and VS Code + proposed.

    ``neovim`` is pytest-lsp's Neovim 0.11 capture (no inline completion, no dynamic registration);
    ``neovim-0.12`` is ``vim.lsp.protocol.make_client_capabilities()`` of Neovim 0.12 (inline completion,
    static); ``vscode`` is VS Code 1.65 (completion with dynamic registration) and ``vscode-proposed``
    adds what vscode-languageclient's ``registerProposedFeatures()`` declares for inline completion.
    """
    if profile == "neovim":
        return client_capabilities("neovim")
    if profile == "vscode":
        return client_capabilities("visual-studio-code")
    from lsprotocol.converters import get_converter

    converter = get_converter()
    if profile == "neovim-0.12":
        return converter.structure(
            json.loads((DATA / "neovim_v0.12.0.json").read_text()), types.ClientCapabilities
        )
    if profile == "vscode-proposed":
        raw = converter.unstructure(client_capabilities("visual-studio-code"))
        raw["textDocument"]["inlineCompletion"] = {"dynamicRegistration": True}
        return converter.structure(raw, types.ClientCapabilities)
    raise ValueError(profile)


class Session:
    """A started ``diffu lsp`` and its client, with helpers for the requests tests make."""

    def __init__(self, client: LanguageClient, root: Path) -> None:
        self.client = client
        self.root = root
        self.registrations: dict[str, types.Registration] = {}
        self.unregistered: list[str] = []
        self.applied_edits: list[types.WorkspaceEdit] = []
        self.result: types.InitializeResult | None = None
        self.versions: dict[str, int] = {}
        self.status_items: list[dict[str, Any]] = []  # diffu/status notifications, oldest first
        self.status_times: list[float] = []  # when each arrived (time.monotonic)

    def open(self, name: str, text: str, language: str = "python", *, uri: str | None = None) -> str:
        """Open ``ws/name`` (as ``Path.as_uri`` escapes it), or the document at ``uri`` as given."""
        uri = uri or (self.root / "ws" / name).as_uri()
        self.versions[uri] = 1
        self.client.text_document_did_open(
            types.DidOpenTextDocumentParams(
                text_document=types.TextDocumentItem(uri=uri, language_id=language, version=1, text=text)
            )
        )
        return uri

    def replace_all(self, uri: str, text: str) -> None:
        self.versions[uri] += 1
        self.client.text_document_did_change(
            types.DidChangeTextDocumentParams(
                text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=self.versions[uri]),
                content_changes=[types.TextDocumentContentChangeWholeDocument(text=text)],
            )
        )

    def insert(self, uri: str, line: int, character: int, text: str) -> None:
        """An incremental edit, as editors send while typing."""
        self.versions[uri] += 1
        at = types.Position(line, character)
        self.client.text_document_did_change(
            types.DidChangeTextDocumentParams(
                text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=self.versions[uri]),
                content_changes=[
                    types.TextDocumentContentChangePartial(range=types.Range(at, at), text=text)
                ],
            )
        )

    async def inline(
        self, uri: str, line: int, character: int, *, invoked: bool = False, msg_id: str | None = None
    ) -> Any:
        kind = (
            types.InlineCompletionTriggerKind.Invoked
            if invoked
            else types.InlineCompletionTriggerKind.Automatic
        )
        params = types.InlineCompletionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            position=types.Position(line, character),
            context=types.InlineCompletionContext(trigger_kind=kind),
        )
        if msg_id is None:
            return await self.client.text_document_inline_completion_async(params)
        return await self.client.protocol.send_request_async(
            types.TEXT_DOCUMENT_INLINE_COMPLETION, params, msg_id=msg_id
        )

    async def complete(self, uri: str, line: int, character: int) -> types.CompletionList:
        result = await self.client.text_document_completion_async(
            types.CompletionParams(
                text_document=types.TextDocumentIdentifier(uri=uri),
                position=types.Position(line, character),
                context=types.CompletionContext(trigger_kind=types.CompletionTriggerKind.Invoked),
            )
        )
        assert isinstance(result, types.CompletionList), result  # the server always answers a list
        return result

    async def command(self, name: str, *args: Any) -> Any:
        return await self.client.workspace_execute_command_async(
            types.ExecuteCommandParams(command=name, arguments=list(args))
        )

    async def status(self) -> dict[str, Any]:
        return await self.command("diffu.status")

    def configure(self, settings: dict[str, Any]) -> None:
        self.client.workspace_did_change_configuration(
            types.DidChangeConfigurationParams(settings={"diffu": settings})
        )

    def logs(self, kind: types.MessageType | None = None) -> list[str]:
        return [m.message for m in self.client.log_messages if kind is None or m.type == kind]


async def wait_for(predicate: Callable[[], Any], timeout: float = 15.0, what: str = "condition") -> Any:
    """Wait for state outside this process (a daemon, the server's messages) to change."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def daemon_status(daemon: DaemonProcess) -> dict[str, Any]:
    with daemon.client() as http:
        return http.get("/v1/diffu/status").json()


def daemon_counter(daemon: DaemonProcess, name: str) -> int:
    return int(daemon_status(daemon)["counters"][name])


def daemon_running(daemon: DaemonProcess) -> int:
    try:
        return int(daemon_status(daemon)["queue"]["running"])
    except httpx.HTTPError:
        return 0


@pytest_asyncio.fixture
async def lsp(tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    """``await lsp(profile, daemon=..., settings=...)``: a ``diffu lsp`` initialized as that client.

    The server runs with isolated diffu directories and auto-start off, so it can only reach the daemon
    it is given (``initializationOptions.url``/``apiKey``, the editor's way) and never starts one.
    """
    sessions: list[Session] = []

    async def start(
        profile: str = "neovim-0.12",
        *,
        daemon: DaemonProcess | None = None,
        settings: dict[str, Any] | None = None,
        url: str | None = None,
        env: dict[str, str] | None = None,
    ) -> Session:
        root = tmp_path / f"lsp{len(sessions)}"
        (root / "ws").mkdir(parents=True)
        server_env = isolated_env(root, **{"DIFFU_AUTOSTART": "0", **(env or {})})
        client = await ClientServerConfig(server_command=LSP_COMMAND, server_env=server_env).start()
        assert isinstance(client, LanguageClient)  # the config's default client_factory makes one
        session = Session(client, root)
        sessions.append(session)
        _record_editor_requests(session)
        options: dict[str, Any] = {"debounceMs": 0, **(settings or {})}
        if daemon is not None:
            options.setdefault("url", daemon.url)
            options.setdefault("apiKey", daemon.token)
        elif url is not None:
            options.setdefault("url", url)
        session.result = await client.initialize_session(
            types.InitializeParams(
                capabilities=capabilities(profile),
                root_uri=(root / "ws").as_uri(),
                initialization_options=options,
            )
        )
        return session

    yield start
    for session in sessions:
        try:
            await asyncio.wait_for(session.client.shutdown_session(), 10)
        except Exception:  # a test that killed the server on purpose has nothing to shut down
            pass
        await session.client.stop()


def _record_editor_requests(session: Session) -> None:
    client = session.client

    @client.feature(types.CLIENT_REGISTER_CAPABILITY)
    def register(params: types.RegistrationParams) -> None:
        for reg in params.registrations:
            session.registrations[reg.method] = reg

    @client.feature(types.CLIENT_UNREGISTER_CAPABILITY)
    def unregister(params: types.UnregistrationParams) -> None:
        for unreg in params.unregisterations:
            session.unregistered.append(unreg.method)
            session.registrations.pop(unreg.method, None)

    @client.feature("diffu/status")
    def status_item(params: Any) -> None:
        session.status_items.append(params if isinstance(params, dict) else params._asdict())
        session.status_times.append(time.monotonic())

    @client.feature(types.WORKSPACE_APPLY_EDIT)
    def apply_edit(params: types.ApplyWorkspaceEditParams) -> types.ApplyWorkspaceEditResult:
        session.applied_edits.append(params.edit)
        return types.ApplyWorkspaceEditResult(applied=True)


__all__ = ["REPO", "Session", "capabilities", "daemon_counter", "daemon_running", "wait_for"]
