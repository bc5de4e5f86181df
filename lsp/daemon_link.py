"""The language server's connection to the diffu daemon: find or start it, report progress, never block.

The link is made in the background as soon as the editor says ``initialized``, so the model loads and
warms up while the user types; requests wait on the same attempt rather than starting their own. A
failure is remembered for a few seconds so a burst of keystrokes does not start a burst of daemons; the
next request after that window tries again, and so does a timer that looks for a daemon (through its
discovery file, never starting one) while nobody types.

The link knows the language server only through the callbacks of :class:`LinkHooks` (log, state changed,
the editor's warm-up shapes, its ``$/progress``), so it imports nothing of the server.

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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from lsprotocol import types

from assistant.client import APIError, AsyncClient, DaemonUnavailable, WarmShape, resolve_endpoint
from assistant.config import Config, ConfigError, load_config
from assistant.daemon_status import DaemonStatus, ModelEntry, ModelList
from assistant.wire import ENDED, HEALTH_OK, ErrorCode, Stage, prompt_budget
from lsp.state import stage_message

if TYPE_CHECKING:
    from pygls.progress import Progress as WorkDoneProgress

log = logging.getLogger("diffu.lsp")
T = TypeVar("T")

RETRY_SECONDS = 5.0  # after a failure, requests fail fast for this long; then the next one tries again
FIT_ATTEMPTS = 3  # prompt builds per request when the daemon says a prompt does not fit
# The link's states, as the status item shows them.
CONNECTING, READY, UNAVAILABLE = "connecting", "ready", "unavailable"


class LogFn(Protocol):
    def __call__(self, message: str, *, level: str = "info", show: bool = False) -> None: ...


@dataclass(frozen=True)
class LinkHooks:
    """What the link needs of the language server, as callbacks: it never holds the server."""

    log: LogFn  # a line in the editor's log (``show``: also a message the user sees)
    changed: Callable[[], None]  # the connection state or the daemon's start-up stage changed
    warm_shapes: Callable[[int | None, int | None], list[WarmShape]]  # typing's, for context and row
    work_done: Callable[[], WorkDoneProgress | None]  # the editor's ``$/progress``; None if it has none


class Progress:
    """``$/progress`` for the daemon's start and warm-up, fed by the client's sync progress callback.

    The callback runs on the event loop; creating a server-initiated token is a request to the editor,
    so the first update starts a task that creates the token and then forwards the latest update each
    time one arrives. Stage changes also go to the log.
    """

    def __init__(self, hooks: LinkHooks) -> None:
        self.hooks = hooks
        self._task: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()
        self.latest: tuple[str, float, str] = ("", 0.0, "")  # (stage, fraction, detail)
        self._stage = ""

    def __call__(self, stage: str, fraction: float, detail: str) -> None:
        self.latest = (stage, fraction, detail)
        self.hooks.changed()
        if stage != self._stage:
            self._stage = stage
            self.hooks.log(f"diffu: {stage_message(stage, detail)}", level="info")
        if self._task is None or self._task.done():
            if stage == "ok":
                return  # already ready: nothing to show
            self._task = asyncio.ensure_future(self._run())
        self._changed.set()

    def restart(self) -> None:
        """A new attempt: what the last one reported (its failure) is no longer the news."""
        self.latest = ("", 0.0, "")
        self._stage = ""

    def finish(self, error: str) -> None:
        """The attempt failed: end the progress (the error itself is reported by the caller)."""
        self.latest = ("failed", 0.0, error)
        self._stage = ""
        self._changed.set()

    async def _run(self) -> None:
        progress = self.hooks.work_done()
        if progress is None:
            return
        token = f"diffu-daemon-{uuid.uuid4().hex[:8]}"
        try:
            await progress.create_async(token)
        except Exception as exc:  # the editor refused the token: progress is a courtesy, not a need
            log.debug("work done progress refused: %s", exc)
            return
        stage, fraction, detail = self.latest
        sent = (stage_message(stage, detail), _percent(stage, fraction))
        progress.begin(token, types.WorkDoneProgressBegin(title="diffu", message=sent[0], percentage=sent[1]))
        while True:
            self._changed.clear()
            stage, fraction, detail = self.latest
            if stage == HEALTH_OK or stage in ENDED:
                message = "model ready" if stage == HEALTH_OK else stage_message(stage, detail)
                progress.end(token, types.WorkDoneProgressEnd(message=message))
                return
            # The loader reports every tensor: most updates change neither the words nor the whole
            # percentage the editor shows, and are not worth a message.
            report = (stage_message(stage, detail), _percent(stage, fraction))
            if report != sent:
                sent = report
                progress.report(token, types.WorkDoneProgressReport(message=report[0], percentage=report[1]))
            await self._changed.wait()


# Getting the daemon ready: its weights load, then it compiles every client's first programs (the editors'
# default shapes among them; the rest of its warm-up compiles in the background once it is ready).
_SHARES: dict[str, tuple[float, float]] = {Stage.LOADING: (0.0, 80.0), Stage.COMPILING: (80.0, 100.0)}


def _percent(stage: str, fraction: float) -> int:
    low, high = _SHARES.get(stage, (0.0, 0.0))
    return int(low + (high - low) * min(max(fraction, 0.0), 1.0))


class DaemonLink:
    """One :class:`AsyncClient` for the current settings, connected at most once at a time.

    ``state`` is ``connecting`` (finding, starting or waiting for the daemon), ``ready`` or
    ``unavailable``; every change of it is reported through ``hooks.changed`` as it happens.
    """

    def __init__(self, hooks: LinkHooks) -> None:
        self.hooks = hooks
        self.client: AsyncClient | None = None
        self.config: Config | None = None
        self.max_context: int | None = None
        self.editor_context: int | None = None  # the row the daemon's model recommends for editors
        self.features: set[str] = set()
        self.model = ""
        self.url: str | None = None
        self.error = ""
        self.state = CONNECTING
        self.connected_at = 0.0  # monotonic time of the last successful connection
        self._key: tuple[Any, ...] | None = None
        self._connecting: asyncio.Task[AsyncClient] | None = None
        self._failed_at = 0.0
        self._warming: asyncio.Task[None] | None = None
        self._retry: asyncio.TimerHandle | None = None
        self._looking: asyncio.Task[None] | None = None
        self._following: asyncio.Task[None] | None = None
        self.warmed: dict[str, int] | None = None  # the daemon's answer to the warm request, once it came
        self.progress = Progress(hooks)
        # Characters per prompt token, learned from the daemon's usage answers; the start is below code's
        # (3-4 for code BPEs, the bundled model's 2.96): at 3.0 a first request overflowed and was resent.
        self.chars_per_token = 2.7

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
        self._connecting = None  # an attempt still running for the old settings no longer counts
        self._failed_at = 0.0
        self._cancel_retry()
        self._set_state(CONNECTING, "")
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
        # The editor's shapes are not the chat's: it connects once the daemon takes requests, and asks for
        # its own programs (``_warm``) instead of waiting for the chat's to compile.
        return AsyncClient(
            config=config, progress=self.progress, timeout=config.max_seconds + 60, wait_compiled=False
        )

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
            self.hooks.log(f"diffu: {exc}", level="error", show=True)

    def _attempt(self) -> asyncio.Task[AsyncClient] | None:
        task = self._connecting
        if task is not None and (not task.done() or self.state == READY):
            return task  # connecting, or connected
        if time.monotonic() - self._failed_at < RETRY_SECONDS:
            return None
        self._cancel_retry()
        self.progress.restart()
        self._connecting = asyncio.ensure_future(self._connect())
        self._set_state(CONNECTING, self.error)
        return self._connecting

    async def _connect(self) -> AsyncClient:
        me = asyncio.current_task()
        try:
            if self.client is None:
                self.client = self._build()
            client = self.client
            endpoint = await client.connect()
            # It takes requests now (the chat's programs may still compile: not the editor's business),
            # so the start-up progress ends here rather than at the daemon's "ok".
            self.progress("ok", 1.0, "")
            facts = await _facts(client)
        except (DaemonUnavailable, APIError) as exc:
            error = describe(exc)
            if self._connecting is me:
                self._failed(error)
                self.progress.finish(error)
            raise DaemonUnavailable(error) from None
        if self._connecting is not me:
            return client  # the settings changed meanwhile: this attempt's daemon is not the link's
        self._adopt(client, endpoint.url, *facts, verb="connected to")
        return client

    def _adopt(
        self, client: AsyncClient, url: str, models: ModelList, status: DaemonStatus, *, verb: str
    ) -> None:
        """Take the daemon at ``url`` as the link's: its model, context and features, the status item's
        ready, and the editor's shapes to warm."""
        entry = models.data[0] if models.data else ModelEntry()
        self.model = entry.id
        self.max_context = entry.context_length or entry.max_model_len
        self.editor_context = entry.editor_context
        self.features = set(status.features)
        self.url = url
        self.connected_at = time.monotonic()
        self.warmed = None
        self.hooks.log(f"diffu: {verb} {url} (model {self.model}, context {self.max_context} tokens)")
        self._set_state(READY, "")  # now, not when the task ends: the status item follows at once
        self.hooks.changed()  # the model may differ while the state does not
        self._warm(client)

    def _follow(self) -> None:
        """After an answer: the client reconnects on its own when its daemon went away and another took
        its place (a restart found through the discovery file), and the request succeeds; the link then
        takes the new daemon as it took the first (its URL in the status, the editor's shapes warmed)."""
        client = self.client
        if client is None or self.state != READY or (self._following and not self._following.done()):
            return

        async def follow() -> None:
            endpoint = await client.endpoint()  # the one it just answered through: no connection made
            if endpoint.url == self.url or self.client is not client:
                return
            try:
                facts = await _facts(client)
            except (DaemonUnavailable, APIError) as exc:  # gone again: the next request says so
                log.debug("the new daemon's facts: %s", describe(exc))
                return
            if self.client is client:
                self._adopt(client, endpoint.url, *facts, verb="reconnected to")

        self._following = asyncio.ensure_future(follow())

    def _warm(self, client: AsyncClient) -> None:
        """Ask the daemon to compile the shapes typing will ask for (answered at once, compiled between
        requests), so the first suggestion waits for no compile. No warm route (404) or a refusal: a log."""
        shapes = self.hooks.warm_shapes(self.max_context, self.editor_context)

        async def send() -> None:
            try:
                answer = await client.warm(shapes)
            except (DaemonUnavailable, APIError) as exc:
                self.hooks.log(f"diffu: warm-up not requested: {describe(exc)}", level="info")
                return
            self.warmed = {"shapes": len(shapes), "queued": int(answer.get("queued", 0))}
            self.hooks.log(
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
        return self.state == READY

    def lost(self, error: str) -> None:
        """A request found the daemon gone: later requests fail fast for a while, then reconnect.

        Only the loss of a live connection counts. The failures the fail-fast window answers, and a
        failed attempt (already recorded), must not start the window again: with a request every few
        seconds it would never end, and the server would never look for the daemon again.
        """
        if self.state != READY:
            return
        self._connecting = None
        self._failed(error)

    def _failed(self, error: str) -> None:
        self._failed_at = time.monotonic()
        self._set_state(UNAVAILABLE, error)
        self._look_later()

    def _look_later(self) -> None:
        self._cancel_retry()
        self._retry = asyncio.get_running_loop().call_later(RETRY_SECONDS, self._look_again)

    def _set_state(self, state: str, error: str) -> None:
        if (state, error) != (self.state, self.error):
            self.state, self.error = state, error
            self.hooks.changed()

    def _cancel_retry(self) -> None:
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None

    def _look_again(self) -> None:
        self._retry = None
        if self.state == UNAVAILABLE:
            self._looking = asyncio.ensure_future(self._look())

    async def _look(self) -> None:
        """While nobody types: reconnect when a daemon is there (a configured URL, or one that published
        its discovery file since), else look again later. Never starts a daemon: that is a request's
        decision (``autostart``), not a timer's."""
        config = self.config
        if config is None or self.state != UNAVAILABLE:
            return
        try:
            found = await asyncio.to_thread(resolve_endpoint, config)
        except Exception as exc:  # an unreadable discovery directory: try again later
            log.debug("looking for the daemon failed: %s", exc)
            found = None
        if self.state != UNAVAILABLE or self.config is not config:
            return  # a request reconnected, or the settings changed, meanwhile
        if found is None:
            self._look_later()  # requests keep their own window: a look that found nothing is no failure
            return
        self._failed_at = 0.0
        task = self._attempt()
        if task is not None:
            try:
                await asyncio.shield(task)
            except DaemonUnavailable as exc:  # recorded by the attempt, which looks again later
                log.debug("reconnecting failed: %s", exc)

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
                answer = await request
            except APIError as exc:
                if attempt == FIT_ATTEMPTS - 1 or not is_overflow(exc):
                    raise
                self.learn_from_overflow(chars, exc)
                continue
            self._follow()
            return answer
        raise AssertionError("unreachable")


async def _facts(client: AsyncClient) -> tuple[ModelList, DaemonStatus]:
    """What the link keeps of a daemon it connects to: its models and its status."""
    return await client.models(), await client.status()


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
