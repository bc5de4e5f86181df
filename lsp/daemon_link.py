"""The language server's connection to the diffu daemon: find or start it, report progress, never block.

The link is made in the background as soon as the editor says ``initialized``, so the model loads and
warms up while the user types; requests wait on the same attempt rather than starting their own. A
failure is remembered for a few seconds so a burst of keystrokes does not start a burst of daemons.

The server has no tokenizer (it must not load the model), so prompts are sized with a characters-per-token
ratio learned from the daemon's answers; a prompt that still does not fit is refused by the daemon with
its token count and context length as data, and :meth:`DaemonLink.fitting` (the one retry helper) learns
from them and builds the prompt again.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from assistant.client import APIError, AsyncClient, DaemonUnavailable
from assistant.config import Config, ConfigError, load_config
from assistant.wire import ErrorCode, prompt_budget
from lsp.state import stage_message

if TYPE_CHECKING:
    from lsp.server import DiffuLanguageServer

log = logging.getLogger("diffu.lsp")
T = TypeVar("T")

RETRY_SECONDS = 5.0  # after a failed attempt, requests fail fast for this long instead of retrying
FIT_ATTEMPTS = 3  # prompt builds per request when the daemon says a prompt does not fit


class Progress:
    """``$/progress`` for the daemon's start and warm-up, fed by the client's sync progress callback.

    The callback runs on the event loop; creating a server-initiated token is a request to the editor,
    so the first update starts a task that creates the token and then forwards the latest update each
    time one arrives. Stage changes also go to the log.
    """

    def __init__(self, server: DiffuLanguageServer) -> None:
        self.server = server
        self._task: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()
        self.latest: tuple[str, float, str] = ("", 0.0, "")  # (stage, fraction, detail)
        self._stage = ""

    def __call__(self, stage: str, fraction: float, detail: str) -> None:
        self.latest = (stage, fraction, detail)
        self.server.status_changed()
        if stage != self._stage:
            self._stage = stage
            self.server.log(f"diffu daemon: {stage_message(stage, detail)}", level="info")
        if self._task is None or self._task.done():
            if stage == "ok":
                return  # already ready: nothing to show
            self._task = asyncio.ensure_future(self._run())
        self._changed.set()

    def finish(self, error: str) -> None:
        """The attempt failed: end the progress (the error itself is reported by the caller)."""
        self.latest = ("failed", 0.0, error)
        self._stage = ""
        self._changed.set()

    async def _run(self) -> None:
        from lsprotocol import types

        window = self.server.client_capabilities.window
        if not (window and window.work_done_progress):
            return
        token = f"diffu-daemon-{uuid.uuid4().hex[:8]}"
        progress = self.server.work_done_progress
        try:
            await progress.create_async(token)
        except Exception as exc:  # the editor refused the token: progress is a courtesy, not a need
            log.debug("work done progress refused: %s", exc)
            return
        stage, fraction, detail = self.latest
        progress.begin(
            token,
            types.WorkDoneProgressBegin(
                title="diffu", message=stage_message(stage, detail), percentage=_percent(stage, fraction)
            ),
        )
        while True:
            self._changed.clear()
            stage, fraction, detail = self.latest
            if stage in ("ok", "failed", "stopping"):
                progress.end(
                    token,
                    types.WorkDoneProgressEnd(
                        message="model ready" if stage == "ok" else stage_message(stage, detail)
                    ),
                )
                return
            progress.report(
                token,
                types.WorkDoneProgressReport(
                    message=stage_message(stage, detail), percentage=_percent(stage, fraction)
                ),
            )
            await self._changed.wait()


def _percent(stage: str, fraction: float) -> int:
    # The daemon serves once its weights are loaded (its programs compile in the background, between
    # requests): loading is all there is to getting ready.
    return int(min(max(100.0 * fraction, 0.0), 100.0)) if stage == "loading" else 0


class DaemonLink:
    """One :class:`AsyncClient` for the current settings, connected at most once at a time."""

    def __init__(self, server: DiffuLanguageServer) -> None:
        self.server = server
        self.client: AsyncClient | None = None
        self.config: Config | None = None
        self.max_context: int | None = None
        self.features: set[str] = set()
        self.model = ""
        self.url: str | None = None
        self.error = ""
        self.connected_at = 0.0  # monotonic time of the last successful connection
        self._key: tuple[Any, ...] | None = None
        self._connecting: asyncio.Task[AsyncClient] | None = None
        self._failed_at = 0.0
        self._warming: asyncio.Task[None] | None = None
        self.warmed: dict[str, int] | None = None  # the daemon's answer to the warm request, once it came
        self.progress = Progress(server)
        # Characters per prompt token, learned from the daemon's usage answers; 3 is a cautious start
        # for code (BPE vocabularies of code models average 3-4).
        self.chars_per_token = 3.0

    def configure(
        self, *, url: str | None, api_key: str | None, model: str | None, autostart: bool | None
    ) -> None:
        """Use these connection settings; a change drops the current client (the next request reconnects).

        Order of precedence, as for the other clients: the editor's settings, then ``DIFFU_URL`` /
        ``DIFFU_API_KEY`` and config.toml, then the discovery file, then auto-start.
        """
        key = (url, api_key, model, autostart)
        if key == self._key:
            return
        self._key = key
        old = self.client
        self.client = None
        self.config = None
        self._connecting = None
        self._failed_at = 0.0
        if old is not None:
            asyncio.ensure_future(old.aclose())

    def _build(self) -> AsyncClient:
        url, api_key, model, autostart = self._key or (None, None, None, None)
        flags = {"url": url, "api_key": api_key, "model": model, "autostart": autostart}
        try:
            config, _ = load_config(flags)
        except ConfigError as exc:
            raise DaemonUnavailable(f"diffu configuration error: {exc}") from None
        self.config = config
        # Reads wait for whole generations; connecting has its own 10 s limit inside the client.
        return AsyncClient(config=config, progress=self.progress, timeout=config.max_seconds + 60)

    def start(self) -> None:
        """Begin connecting in the background (the editor just finished initializing)."""
        task = self._attempt()
        if task is not None:
            task.add_done_callback(self._report_background)

    def _report_background(self, task: asyncio.Task[AsyncClient]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            self.server.log(f"diffu: {exc}", level="error", show=True)

    def _attempt(self) -> asyncio.Task[AsyncClient] | None:
        task = self._connecting
        if task is not None and (not task.done() or (not task.cancelled() and task.exception() is None)):
            return task  # connecting, or connected
        if time.monotonic() - self._failed_at < RETRY_SECONDS:
            return None
        self._connecting = asyncio.ensure_future(self._connect())
        self.server.status_changed()
        return self._connecting

    async def _connect(self) -> AsyncClient:
        try:
            if self.client is None:
                self.client = self._build()
            client = self.client
            endpoint = await client.connect()
            models = await client.request("GET", "/v1/models")
            status = await client.status()
        except (DaemonUnavailable, APIError) as exc:
            self._failed(describe(exc))
            self.progress.finish(self.error)
            raise DaemonUnavailable(self.error) from None
        entry = (models.get("data") or [{}])[0]
        self.model = str(entry.get("id", ""))
        self.max_context = entry.get("context_length") or entry.get("max_model_len")
        self.features = set(status.get("features") or [])
        self.error = ""
        self.url = endpoint.url
        self.connected_at = time.monotonic()
        self.server.log(
            f"diffu: connected to {endpoint.url} (model {self.model}, context {self.max_context} tokens)",
            level="info",
        )
        self.server.status_changed()
        self._warm(client)
        return client

    def _warm(self, client: AsyncClient) -> None:
        """Ask the daemon to compile the shapes typing will ask for (answered at once, compiled between
        requests), so the first suggestion does not wait for a compile. A daemon without the warm route
        (older versions answer 404) or a refusal costs nothing but a log line."""
        from lsp.suggest import warm_shapes

        shapes = warm_shapes(self.server.settings, self.max_context)

        async def send() -> None:
            try:
                answer = await client.warm(shapes)
            except (DaemonUnavailable, APIError) as exc:
                self.server.log(f"diffu: warm-up not requested: {describe(exc)}", level="info")
                return
            self.warmed = {"shapes": len(shapes), "queued": int(answer.get("queued", 0))}
            self.server.log(
                f"diffu: asked the daemon to warm {len(shapes)} editor shapes "
                f"({answer.get('queued', 0)} queued, {len(answer.get('compiled') or [])} already compiled)",
                level="info",
            )

        if shapes:  # held: the event loop keeps only a weak reference to a task
            self._warming = asyncio.ensure_future(send())

    async def ready(self) -> AsyncClient:
        """The connected client; raises DaemonUnavailable (at once while a recent failure is fresh)."""
        task = self._attempt()
        if task is None:
            # The same words as the failure itself: callers report it (rate-limited) and pass it to lost().
            raise DaemonUnavailable(self.error or "the diffu daemon is unavailable")
        # Shielded: one request being cancelled must not cancel the connection others wait for.
        return await asyncio.shield(task)

    @property
    def connected(self) -> bool:
        task = self._connecting
        return task is not None and task.done() and not task.cancelled() and task.exception() is None

    @property
    def state(self) -> str:
        """``ready``, ``connecting`` (finding, starting or waiting for the daemon) or ``unavailable``."""
        if self.connected:
            return "ready"
        task = self._connecting
        if task is not None and not task.done():
            return "connecting"
        return "unavailable" if self.error else "connecting"

    def lost(self, error: str) -> None:
        """A request found the daemon gone: later requests fail fast for a while, then reconnect."""
        self._failed(error)
        self._connecting = None

    def _failed(self, error: str) -> None:
        self.error = error
        self._failed_at = time.monotonic()
        self.server.status_changed()

    # -- fitting prompts to the context ----------------------------------------------------------------
    def learn_ratio(self, chars: int, prompt_tokens: int) -> None:
        if chars > 0 and prompt_tokens > 0:
            seen = chars / prompt_tokens
            self.chars_per_token = 0.5 * self.chars_per_token + 0.5 * seen

    def learn_from_overflow(self, chars: int, exc: APIError) -> None:
        """After a context-length refusal: take the prompt size and context length the daemon reported."""
        prompt_tokens, context = overflow_facts(exc)
        if context:
            self.max_context = context
        if prompt_tokens:
            self.chars_per_token = max(0.25, 0.9 * chars / prompt_tokens)

    def budget_chars(self, budget_tokens: int, reserve_tokens: int) -> int:
        """Characters of prompt for ``budget_tokens``, leaving ``reserve_tokens`` of the context free."""
        budget_tokens = prompt_budget(budget_tokens, reserve_tokens, self.max_context)
        return int(max(budget_tokens, 8) * self.chars_per_token)

    async def fitting(self, build: Callable[[], tuple[int, Awaitable[T]]]) -> T:
        """Await ``build()``'s request; when the daemon says the prompt does not fit, learn and build again.

        ``build`` makes the prompt from the current ratio and returns (its characters, the request).
        """
        for attempt in range(FIT_ATTEMPTS):
            chars, request = build()
            try:
                return await request
            except APIError as exc:
                if attempt == FIT_ATTEMPTS - 1 or not is_overflow(exc):
                    raise
                self.learn_from_overflow(chars, exc)
        raise AssertionError("unreachable")


def is_overflow(exc: APIError) -> bool:
    """Whether the daemon refused a prompt that, with its canvas, exceeds the model's context."""
    return exc.code == ErrorCode.CONTEXT_LENGTH_EXCEEDED and isinstance(exc.details.get("prompt_tokens"), int)


def overflow_facts(exc: APIError) -> tuple[int | None, int | None]:
    """(prompt tokens, context length) of a context-length refusal, as the daemon reported them."""
    prompt_tokens, context = exc.details.get("prompt_tokens"), exc.details.get("context_length")
    return (
        prompt_tokens if isinstance(prompt_tokens, int) and prompt_tokens > 0 else None,
        context if isinstance(context, int) and context > 0 else None,
    )


def describe(exc: BaseException) -> str:
    if isinstance(exc, APIError):
        return f"the daemon answered {exc.status}: {exc.message}"
    return str(exc) or type(exc).__name__
