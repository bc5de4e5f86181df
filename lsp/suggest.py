"""Suggestions at a cursor: the plain functions behind inline completion and the completion fallback.

From the text around the cursor to cleaned suggestions: whether to ask at all, the canvas (mode, size,
steps), the prompt (``context.build_prompt``), the daemon request through the link's one retry helper,
and the post-processing. An explicit (invoked) request asks for several candidates at once: the greedy
one and others sampled at :data:`CANDIDATE_TEMPERATURE` with their own seeds, which the daemon batches
into one run.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import Counter
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from assistant.infill import context as ctx
from assistant.infill.context import Mode
from assistant.infill.postprocess import align_indent, line_suffix_chars, postprocess, scope_of
from assistant.wire import SamplingOptions, prompt_budget
from lsp.cache import SuggestionCache
from lsp.settings import Settings, context_budget, row_limit
from lsp.state import Timing, Timings

if TYPE_CHECKING:
    from assistant.client import AsyncClient, Done, WarmShape
    from lsp.daemon_link import DaemonLink
    from lsp.flight import Flights

CANDIDATE_TEMPERATURE = 0.8  # Tabby's manual-trigger candidates use the same


@dataclass(frozen=True)
class Cursor:
    """Where a suggestion is asked for: the document's text on each side of the cursor, and why."""

    path: str  # workspace-relative, for the prompt's header line
    language: str
    before: str
    after: str
    invoked: bool  # the user asked (a key), rather than typing


@dataclass(frozen=True)
class Plan:
    """How the model is asked: the canvas and the text the prompt ends with."""

    mode: Mode
    canvas: int
    steps: int
    prompt_before: str  # ``before``, less a blank cursor line's indentation (see postprocess.align_indent)
    cursor_line: str  # the cursor's line up to the cursor
    line_above: str


def plan(cursor: Cursor, settings: Settings) -> Plan:
    """The canvas for this cursor: its mode decides the size (a DLM needs it before it starts)."""
    before = cursor.before
    line_before = before[before.rfind("\n") + 1 :]
    line_after = cursor.after.split("\n", 1)[0]
    above = before[: len(before) - len(line_before)].rstrip("\r\n")
    line_above = above[above.rfind("\n") + 1 :]
    mode = ctx.classify(line_before, line_after, line_above)
    canvas = ctx.canvas_tokens(mode, settings.max_tokens)
    steps = plan_steps(settings, canvas, cursor.invoked)
    blank = not line_before.strip() and not line_after.strip()
    prompt_before = before[: len(before) - len(line_before)] if blank else before
    return Plan(mode, canvas, steps, prompt_before, line_before, line_above)


def plan_steps(settings: Settings, canvas: int, invoked: bool) -> int:
    """Denoising steps for a ``canvas``: the user's (at most one a token), else every token's own step when
    the user asked and half as many while typing."""
    if settings.steps:
        return min(settings.steps, canvas)
    return canvas if invoked else max(1, canvas // 2)


def mode_sampling(
    settings: Settings,
    mode: Mode,
    steps: int,
    *,
    scope: int = 0,
    temperature: float | None = None,
    seed: int | None = None,
) -> SamplingOptions:
    """What a suggestion in ``mode`` sends: the user's knobs (``Settings.request_sampling``), and with
    text on the cursor's line one line (``max_lines`` 1): the suggestion is the rest of that line, so the
    decoders stop once it is written and the daemon takes its model's one-line decoder. A block or an
    empty line ends where its code leaves the cursor's ``scope`` (``postprocess.scope_of``): the decoders
    stop there (``block_scope``), as the post-processing would cut it."""
    sampling = settings.request_sampling(steps, temperature=temperature, seed=seed)
    if mode is Mode.SINGLE_LINE:
        return dataclasses.replace(sampling, max_lines=1)
    return dataclasses.replace(sampling, block_scope=scope)


def warm_shapes(settings: Settings, max_context: int | None, recommended: int | None) -> list[WarmShape]:
    """The shapes typing and an explicit request ask for, per mode (canvas and steps as :func:`plan` makes
    them, the candidates as :func:`ask` sends them: the greedy one, and the sampled ones together or,
    reaching the daemon apart, one by one), with a prompt of the whole context budget (files longer than
    it are the common case) within the row the model recommends (:func:`row_limit`), for the daemon to
    compile when the server connects instead of on the first suggestion."""
    from assistant.client import WarmShape

    shapes: list[WarmShape] = []
    for mode in ctx.Mode:
        canvas = ctx.canvas_tokens(mode, settings.max_tokens)
        limit = row_limit(settings, max_context, recommended)
        budget = prompt_budget(context_budget(settings), canvas, limit)
        if budget <= 0:
            continue
        asked: list[tuple[int, int, float | None, int | None]] = [
            (plan_steps(settings, canvas, invoked), 1, None, None) for invoked in (False, True)
        ]
        if settings.candidates > 1:
            steps = plan_steps(settings, canvas, True)
            asked += [
                (steps, rows, CANDIDATE_TEMPERATURE, 1) for rows in sorted({1, settings.candidates - 1})
            ]
        for steps, rows, temperature, seed in asked:
            sampling = mode_sampling(settings, mode, steps, temperature=temperature, seed=seed)
            shape = WarmShape(
                prompt_tokens=budget, max_new_tokens=canvas, infill=True, batch=rows, sampling=sampling
            )
            shapes.append(shape)
    return list(dict.fromkeys(shapes))  # two modes with the same canvas are one shape


def clean(text: str, p: Plan, suffix: str, min_chars: int) -> str | None:
    """The model's text as a suggestion at the plan's cursor: post-processed, its indentation aligned."""
    out = postprocess(
        text,
        suffix=suffix,
        mode=p.mode,
        cursor_line=p.cursor_line,
        line_above=p.line_above,
        min_chars=min_chars,
    )
    return None if out is None else align_indent(out, p.cursor_line)


def skip_reason(cursor: Cursor, settings: Settings) -> str | None:
    """Why an automatic request is not worth a model call (None: ask)."""
    if cursor.invoked:
        return None
    line_after = cursor.after.split("\n", 1)[0]
    if line_suffix_chars(line_after) > settings.max_line_suffix:
        return "the cursor is inside a line"
    return None


async def _all(requests: Sequence[Awaitable[Done]]) -> list[Done]:
    """Await every request together; the first failure cancels the others and is raised."""
    tasks = [asyncio.ensure_future(r) for r in requests]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()


@dataclass(frozen=True)
class Asked:
    """What the model was asked and what it answered, cleaned: suggestions best first, distinct."""

    texts: list[str]
    plan: Plan
    prompt: ctx.Prompt
    daemon_ms: float
    engine_ms: float
    queue_ms: float


async def ask(
    link: DaemonLink,
    client: AsyncClient,
    cursor: Cursor,
    settings: Settings,
    others: Sequence[tuple[str, str]],
    session: str,
) -> Asked:
    """Ask the daemon (several candidates when invoked) and clean what comes back."""
    p = plan(cursor, settings)
    n = settings.candidates if cursor.invoked else 1
    scope = scope_of(p.cursor_line, p.line_above, p.mode)
    prompts: list[ctx.Prompt] = []

    def request(prompt: ctx.Prompt, k: int) -> Awaitable[Done]:
        """Candidate ``k``: 0 is the greedy one (the user's temperature), others sampled with seed k."""
        temperature = None if k == 0 else CANDIDATE_TEMPERATURE
        sampling = mode_sampling(
            settings, p.mode, p.steps, scope=scope, temperature=temperature, seed=k or None
        )
        return client.infill(
            prompt.prefix,
            prompt.suffix,
            canvas_tokens=p.canvas,
            sampling=sampling,
            session=f"{session}#{k}",
            max_seconds=settings.max_seconds,
        )

    def build() -> tuple[int, Awaitable[list[Done]]]:
        limit = row_limit(settings, link.max_context, link.editor_context)
        budget = prompt_budget(context_budget(settings), p.canvas, limit)
        prompt = ctx.build_prompt(
            before=p.prompt_before,
            after=cursor.after,
            path=cursor.path,
            language=cursor.language,
            budget_tokens=max(budget, 8),
            prefix_fraction=settings.prefix_fraction,
            chars_per_token=link.chars_per_token,
            snippet_tokens=settings.snippet_tokens,
            other_documents=others,
        )
        prompts.append(prompt)
        requests = [request(prompt, k) for k in range(n)]
        return len(prompt.prefix) + len(prompt.suffix), _all(requests)

    sent = time.perf_counter()
    dones = await link.fitting(build)
    prompt = prompts[-1]
    link.learn_ratio(len(prompt.prefix) + len(prompt.suffix), int(dones[0].usage.get("prompt_tokens", 0)))
    daemon_ms = (time.perf_counter() - sent) * 1000
    engine_ms = dones[0].stats.generate_seconds * 1000
    queue_ms = dones[0].stats.queue_seconds * 1000
    texts: list[str] = []
    for done in dones:
        if done.finish_reason == "cancelled":
            continue
        text = clean(done.text, p, prompt.suffix, settings.min_chars)
        if text is not None and text not in texts:
            texts.append(text)
    return Asked(texts, p, prompt, daemon_ms, engine_ms, queue_ms)


async def suggest(
    cursor: Cursor,
    *,
    settings: Settings,
    link: DaemonLink,
    cache: SuggestionCache,
    counters: Counter[str],
    timings: Timings,
    others: Sequence[tuple[str, str]],
    session: str,
    flights: Flights,
) -> list[str]:
    """Suggestions to show at ``cursor``, best first; [] when there is nothing worth showing.

    An automatic request whose text continues the running automatic call's (typing on the same line)
    waits for that call rather than cancelling it, and offers its answer trimmed by what was typed since
    (``lsp.flight``); when that leaves nothing, it asks for itself. Raises DaemonUnavailable or APIError
    for daemon trouble (the caller logs it and answers empty).
    """
    received = time.perf_counter()
    key = settings.fingerprint()
    flight = None
    if cursor.invoked:
        flights.cancel()  # an explicit request takes over
    else:
        flight = flights.joinable(cursor.path, cursor.before, cursor.after, key)
    if skip_reason(cursor, settings) is not None:
        counters["skipped"] += 1
        return []
    waited = 0.0
    if flight is not None:
        if await flights.wait(flight) is not None:
            hit = cache.get(cursor.before, cursor.after, key)
            if hit is not None:
                counters["joined"] += 1
                return [hit]
    elif not cursor.invoked and settings.debounce_ms:
        # Typing goes on: a newer request of this editor cancels us here, before any model work.
        waited = settings.debounce_ms
        await asyncio.sleep(settings.debounce_ms / 1000)
    if not cursor.invoked:
        hit = cache.get(cursor.before, cursor.after, key)
        if hit is not None:
            counters["cached"] += 1
            return [hit]

    def call() -> Awaitable[list[str]]:
        return _from_model(
            cursor, settings, link, cache, counters, timings, others, session, received + waited / 1000
        )

    if cursor.invoked:
        return await call()  # cancelled with its request, as any request that nothing joins
    return await flights.run(cursor.path, cursor.before, cursor.after, key, call) or []


async def _from_model(
    cursor: Cursor,
    settings: Settings,
    link: DaemonLink,
    cache: SuggestionCache,
    counters: Counter[str],
    timings: Timings,
    others: Sequence[tuple[str, str]],
    session: str,
    since: float,
) -> list[str]:
    """Ask the model, note where the time went (``since``: when the request was received, less the
    debounce) and keep the best answer in the cache, where requests that typing continues find it."""
    client = await link.ready()
    first = timings.claim_first(link.connected_at)
    asked = await ask(link, client, cursor, settings, others, session)
    p, prompt = asked.plan, asked.prompt
    timing = Timing(
        mode=p.mode.value,
        wall_ms=(time.perf_counter() - since) * 1000,
        daemon_ms=asked.daemon_ms,
        engine_ms=asked.engine_ms,
        queue_ms=asked.queue_ms,
        first=first,
        canvas=p.canvas,
        steps=p.steps,
        prompt_chars=len(prompt.prefix) + len(prompt.suffix),
        context=tuple(dict.fromkeys(s.name for s in prompt.snippets)),
    )
    timings.add(timing)
    if not asked.texts:
        return []
    cache.put(cursor.before, cursor.after, settings.fingerprint(), asked.texts[0])
    counters["answered"] += 1
    return asked.texts
