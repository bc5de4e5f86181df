"""What the chat needs from a model server, and the implementation that talks to the diffu daemon.

The app only sees :class:`Backend`: connect (with progress while a daemon starts, loads and compiles),
stream one answer as ``Step`` events then one ``Done``, fill the holes of a text the same way, count a
text's tokens (the files in context), cancel a request, and ask the daemon to compile what the chat's
settings need before the first prompt does (``warm``). Tests drive the app with
scripted backends that yield the same event types; :class:`DaemonBackend` goes through
``assistant.client`` like every other client, so the TUI never imports JAX.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from assistant.client import (
    APIError,
    AsyncClient,
    DaemonUnavailable,
    Done,
    Endpoint,
    SamplingOptions,
    Step,
    Waiting,
    WarmShape,
    resolve_endpoint,
)
from assistant.config import Config
from assistant.daemon_status import DaemonStatus
from assistant.infill.holes import FillOptions
from assistant.wire import Stage, chat_prompts
from tui.settings import ChatSettings

Progress = Callable[[str, float, str], None]
"""``progress(stage, fraction, detail)``: ``starting`` or ``connecting``, then the daemon's stages
(``assistant.wire.Stage``) until ``/health`` says ``ok``."""


class Backend(Protocol):
    # The model's chat defaults (its generation_config.json) and context length (None: not said), known
    # once connect() has returned.
    chat_defaults: dict[str, Any]
    max_context: int | None

    async def connect(self, progress: Progress) -> str:
        """Reach (or start) the model server and wait until it is ready; returns the model's name."""
        ...

    def generate(
        self, messages: list[dict[str, str]], settings: ChatSettings, *, session: str | None = None
    ) -> AsyncIterator[Step | Waiting | Done]:
        """One answer to ``messages`` with ``settings``' knobs: a Waiting while its programs compile,
        denoising steps, then one Done."""
        ...

    def fill(self, prompt: str, options: FillOptions) -> AsyncIterator[Step | Waiting | Done]:
        """Every ``<|mask|>`` hole of ``prompt`` filled in one run: steps (the region from the first hole
        to the last), then one Done whose ``holes`` has a fill per hole."""
        ...

    async def count_tokens(self, text: str) -> int:
        """How many tokens ``text`` costs in a prompt (the daemon's tokenizer)."""
        ...

    async def warm(self, settings: ChatSettings) -> None:
        """Ask the daemon to compile what these settings' first turns need, ahead of its other warm-up
        (best effort: a refusal changes nothing)."""
        ...

    async def cancel(self, request_id: str) -> bool:
        """Ask the server to stop a request; False if it no longer runs."""
        ...

    async def aclose(self) -> None: ...


class DaemonBackend:
    """The diffu daemon through :class:`assistant.client.AsyncClient` (discovery, auto-start, retries)."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self._client = AsyncClient(config=config)
        # One connection attempt at a time: the startup connect and the first send must not both
        # auto-start a daemon.
        self._lock = asyncio.Lock()
        self.model = ""
        self.chat_defaults: dict[str, Any] = {}
        self.max_context: int | None = None
        self._lengths: tuple[int, ...] = ()  # the daemon's length buckets

    async def connect(self, progress: Progress) -> str:
        async with self._lock:
            existing = await asyncio.to_thread(resolve_endpoint, self.config)
            if existing is None and self._client.autostart and self.config.model:
                progress(Stage.STARTING, 0.0, f"starting a diffu daemon for {self.config.model}")
            else:
                progress("connecting", 0.0, existing.url if existing else "looking for a diffu daemon")
            self._client.progress = progress
            try:
                await self._client.endpoint()
            finally:
                self._client.progress = None
            status = await self._client.status()
            self.model = status.model or self.config.model or ""
            self.chat_defaults = status.chat_settings
            self.max_context = status.max_context
            self._lengths = tuple(sorted({n for _, n in status.buckets}))
            return self.model

    async def generate(
        self, messages: list[dict[str, str]], settings: ChatSettings, *, session: str | None = None
    ) -> AsyncIterator[Step | Waiting | Done]:
        events = self._client.stream_generate(
            messages=messages,
            max_new_tokens=settings.max_new_tokens,
            sampling=settings.request_sampling(),
            # A newer request of the same conversation supersedes this one on the daemon.
            session=session or None,
        )
        async for event in events:
            yield event

    async def fill(self, prompt: str, options: FillOptions) -> AsyncIterator[Step | Waiting | Done]:
        # max_new_tokens 0: the prompt's own masks are the canvas; steps default to one per mask.
        sampling = SamplingOptions(temperature=options.temperature)
        async for event in self._client.stream_generate(prompt=prompt, max_new_tokens=0, sampling=sampling):
            yield event

    async def count_tokens(self, text: str) -> int:
        return len(await self._client.tokenize(text))

    async def warm(self, settings: ChatSettings) -> None:
        canvas = settings.max_new_tokens
        sampling = settings.request_sampling()
        first, talk = chat_prompts(self._lengths, canvas)
        shapes = [WarmShape(prompt_tokens=p, max_new_tokens=canvas, sampling=sampling) for p in first + talk]
        if first:
            # Two chats at once, and the second decode of an answer whose code does not parse.
            shapes.append(
                WarmShape(prompt_tokens=first[0], max_new_tokens=canvas, batch=2, sampling=sampling)
            )
            again = settings.retry_settings()
            if again is not None:
                retry = again.request_sampling()
                shapes.append(
                    WarmShape(prompt_tokens=first[0], max_new_tokens=again.max_new_tokens, sampling=retry)
                )
        if not shapes:
            return
        with contextlib.suppress(APIError, DaemonUnavailable):  # the prompt will compile what it needs
            await self._client.warm(shapes)

    async def cancel(self, request_id: str) -> bool:
        return await self._client.cancel(request_id)

    async def status(self) -> DaemonStatus:
        """The daemon's ``/v1/diffu/status`` (its stage and what it compiles now among it)."""
        return await self._client.status()

    async def aclose(self) -> None:
        await self._client.aclose()

    @property
    def started_daemon(self) -> Endpoint | None:
        """The daemon this chat started itself (None: it found one running, or reached DIFFU_URL)."""
        return self._client.started_daemon
