"""The language server's connection to the diffu daemon: find or start it, report progress, never block.

The link is made in the background as soon as the editor says ``initialized``, so the model loads and
warms up while the user types; requests wait on the same attempt rather than starting their own. A
failure is remembered for a few seconds so a burst of keystrokes does not start a burst of daemons.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid
from typing import TYPE_CHECKING, Any

from assistant.client import APIError, AsyncClient, DaemonUnavailable
from assistant.config import Config, ConfigError, load_config

if TYPE_CHECKING:
    from lsp.server import DiffuLanguageServer

log = logging.getLogger("diffu.lsp")

RETRY_SECONDS = 5.0  # after a failed attempt, requests fail fast for this long instead of retrying
_PROMPT_TOKENS = re.compile(r"the prompt \((\d+) tokens\)")


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
        self._latest: tuple[str, float, str] = ("", 0.0, "")
        self._stage = ""

    def __call__(self, stage: str, fraction: float, detail: str) -> None:
        self._latest = (stage, fraction, detail)
        if stage != self._stage:
            self._stage = stage
            self.server.log(f"diffu daemon: {_message(stage, detail)}", level="info")
        if self._task is None or self._task.done():
            if stage == "ok":
                return  # already ready: nothing to show
            self._task = asyncio.ensure_future(self._run())
        self._changed.set()

    def finish(self, error: str) -> None:
        """The attempt failed: end the progress (the error itself is reported by the caller)."""
        self._latest = ("failed", 0.0, error)
        self._stage = ""
        self._changed.set()

    async def _run(self) -> None:
        from lsprotocol import types

        if not self.server.supports_work_done_progress:
            return
        token = f"diffu-daemon-{uuid.uuid4().hex[:8]}"
        progress = self.server.work_done_progress
        try:
            await progress.create_async(token)
        except Exception as exc:  # the editor refused the token: progress is a courtesy, not a need
            log.debug("work done progress refused: %s", exc)
            return
        stage, fraction, detail = self._latest
        progress.begin(
            token,
            types.WorkDoneProgressBegin(
                title="diffu", message=_message(stage, detail), percentage=_percent(stage, fraction)
            ),
        )
        while True:
            self._changed.clear()
            stage, fraction, detail = self._latest
            if stage in ("ok", "failed", "stopping"):
                progress.end(
                    token,
                    types.WorkDoneProgressEnd(
                        message="model ready" if stage == "ok" else _message(stage, detail)
                    ),
                )
                return
            progress.report(
                token,
                types.WorkDoneProgressReport(
                    message=_message(stage, detail), percentage=_percent(stage, fraction)
                ),
            )
            await self._changed.wait()


def _message(stage: str, detail: str) -> str:
    names = {
        "ok": "ready",
        "starting": "starting the daemon",
        "loading": "loading the model",
        "compiling": "warming up",
        "failed": "the daemon failed",
        "stopping": "the daemon is stopping",
    }
    return f"{names.get(stage, stage)}{': ' + detail if detail else ''}"


def _percent(stage: str, fraction: float) -> int:
    # Loading and compiling are the two halves of getting ready.
    base = {"loading": 0.0, "compiling": 50.0}.get(stage, 0.0)
    span = 50.0 if stage in ("loading", "compiling") else 0.0
    return int(min(max(base + span * fraction, 0.0), 100.0))


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
        self._key: tuple[Any, ...] | None = None
        self._connecting: asyncio.Task[AsyncClient] | None = None
        self._failed_at = 0.0
        self._error = ""
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
            self._failed_at = time.monotonic()
            self._error = describe(exc)
            self.progress.finish(self._error)
            raise DaemonUnavailable(self._error) from None
        entry = (models.get("data") or [{}])[0]
        self.model = str(entry.get("id", ""))
        self.max_context = entry.get("context_length") or entry.get("max_model_len")
        self.features = set(status.get("features") or [])
        self._error = ""
        self.url = endpoint.url
        self.server.log(
            f"diffu: connected to {endpoint.url} (model {self.model}, context {self.max_context} tokens)",
            level="info",
        )
        return client

    async def ready(self) -> AsyncClient:
        """The connected client; raises DaemonUnavailable (at once while a recent failure is fresh)."""
        task = self._attempt()
        if task is None:
            raise DaemonUnavailable(
                f"{self._error or 'the diffu daemon is unavailable'} (retrying in a few seconds)"
            )
        # Shielded: one request being cancelled must not cancel the connection others wait for.
        return await asyncio.shield(task)

    @property
    def connected(self) -> bool:
        task = self._connecting
        return task is not None and task.done() and not task.cancelled() and task.exception() is None

    def lost(self, error: str) -> None:
        """A request found the daemon gone: later requests fail fast for a while, then reconnect."""
        self._error = error
        self._failed_at = time.monotonic()
        self._connecting = None

    def learn_ratio(self, chars: int, prompt_tokens: int) -> None:
        if chars > 0 and prompt_tokens > 0:
            seen = chars / prompt_tokens
            self.chars_per_token = 0.5 * self.chars_per_token + 0.5 * seen

    def learn_from_overflow(self, chars: int, message: str) -> None:
        """After a context-length error: set the ratio from the prompt size the daemon reported."""
        m = _PROMPT_TOKENS.search(message)
        if m and int(m.group(1)) > 0:
            self.chars_per_token = max(0.25, 0.9 * chars / int(m.group(1)))
        else:
            self.chars_per_token = max(0.25, self.chars_per_token / 2)


def describe(exc: BaseException) -> str:
    if isinstance(exc, APIError):
        return f"the daemon answered {exc.status}: {exc.message}"
    return str(exc) or type(exc).__name__
