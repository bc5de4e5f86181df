"""Which completion provider the server offers, following the client's capabilities (pure functions).

``inlineCompletionProvider`` (LSP 3.18) when the client declares ``textDocument.inlineCompletion``,
otherwise ``completionProvider``: one source of suggestions, never both. Where the client offers dynamic
registration for the chosen one, nothing is advertised statically and the provider is registered after
``initialized`` for the configured languages (and registered again when they change).
"""

from __future__ import annotations

from dataclasses import dataclass

from lsprotocol import types

TRIGGER_CHARACTERS = [".", "(", "[", "{", ",", ":", "="]


@dataclass(frozen=True)
class Provider:
    """The chosen provider: ``inline`` (else the completion fallback), ``dynamic`` registration or not."""

    inline: bool = False
    dynamic: bool = False

    @property
    def method(self) -> str:
        return types.TEXT_DOCUMENT_INLINE_COMPLETION if self.inline else types.TEXT_DOCUMENT_COMPLETION

    @property
    def name(self) -> str:
        return "inlineCompletion" if self.inline else "completion"


def choose(client: types.ClientCapabilities, caps: types.ServerCapabilities) -> Provider:
    """Pick the provider for ``client`` and adjust the capabilities pygls built to advertise only it."""
    text = client.text_document
    inline = text.inline_completion if text else None
    completion = text.completion if text else None
    if inline is not None:
        dynamic = bool(inline.dynamic_registration)
        caps.completion_provider = None
        caps.inline_completion_provider = None if dynamic else types.InlineCompletionOptions()
        return Provider(inline=True, dynamic=dynamic)
    dynamic = bool(completion and completion.dynamic_registration)
    caps.inline_completion_provider = None
    if dynamic:
        caps.completion_provider = None
    return Provider(inline=False, dynamic=dynamic)


def selector(languages: tuple[str, ...]) -> list[types.TextDocumentFilter]:
    if languages:
        return [types.TextDocumentFilterLanguage(language=lang) for lang in languages]
    return [types.TextDocumentFilterScheme(scheme="file"), types.TextDocumentFilterScheme(scheme="untitled")]


def registration_options(
    provider: Provider, languages: tuple[str, ...]
) -> types.InlineCompletionRegistrationOptions | types.CompletionRegistrationOptions:
    if provider.inline:
        return types.InlineCompletionRegistrationOptions(document_selector=selector(languages))
    return types.CompletionRegistrationOptions(
        document_selector=selector(languages), trigger_characters=TRIGGER_CHARACTERS
    )


def can_resolve_edits(client: types.ClientCapabilities) -> bool:
    """Whether the client resolves a code action's edit lazily (``codeAction/resolve``)."""
    text = client.text_document
    resolve = text.code_action.resolve_support if text and text.code_action else None
    return bool(resolve and "edit" in resolve.properties)


def versioned_edits(client: types.ClientCapabilities) -> bool:
    """Whether the client takes versioned ``documentChanges`` (it then refuses a stale edit)."""
    workspace = client.workspace
    return bool(workspace and workspace.workspace_edit and workspace.workspace_edit.document_changes)
