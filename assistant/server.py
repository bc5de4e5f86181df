"""The daemon's HTTP app (Starlette): native SSE, OpenAI-compatible and llama.cpp ``/infill`` routes.

All generation routes share one path: parse the body into a :class:`~assistant.protocol.GenSpec`
(4xx on bad input), tokenize and build the canvas row off the event loop, submit a job to the
:class:`~assistant.engine.Engine`, then turn the job's events into the route's response shape. While a job
runs, a watcher waits for the client's ``http.disconnect`` and cancels the job, so an abandoned request
frees the device at the next denoising step.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from assistant import __version__, protocol, sse
from assistant.config import Config
from assistant.engine import (
    READY,
    Engine,
    EngineError,
    EngineStatus,
    Job,
    JobDone,
    JobError,
    JobStep,
    NotReady,
)
from assistant.protocol import GenSpec, RequestError
from assistant.security import GuardMiddleware, is_loopback
from model_runtime.bundled import BUNDLED_MODEL_NAME, bundled_model_dir
from model_runtime.errors import InputError
from model_runtime.params import ParamError, SamplingParams

log = logging.getLogger("diffu.server")

MASK_MARK = "░"  # how a still-masked token shows in a step's canvas text (one character per token)
_FINISH_OPENAI = {"stop": "stop", "length": "length", "time": "length", "cancelled": "cancelled"}


def make_loader(config: Config) -> Callable[[Callable[[str, float], None]], Any]:
    """The function the engine thread calls to load the runtime (JAX is imported there, not here)."""
    from assistant.fake_engine import is_fake_spec, load_fake

    model = config.model
    if model is None:
        raise ValueError("no model configured")

    def load(progress: Callable[[str, float], None]) -> Any:
        buckets = {
            "max_context": config.max_context,
            "length_buckets": config.length_buckets,
            "batch_buckets": config.batch_buckets,
        }
        if is_fake_spec(model):
            return load_fake(model, progress=progress, **buckets)
        import model_runtime

        return model_runtime.load(
            model,
            dtype=config.dtype,
            quantize=config.quantize,
            progress=progress,
            tp=config.tp,
            dp=config.dp,
            **buckets,
        )

    return load


def row_length(row: Any) -> int:
    """Total tokens of a canvas row (prompt + generated region + suffix) as the runtime will run it."""
    return len(row.ids)


class Pieces:
    """Printable text per token id, cached: step events render whole canvases many times."""

    def __init__(self, tokenizer: Any) -> None:
        self._tok = tokenizer
        self._cache: dict[int, str] = {tokenizer.mask_id: MASK_MARK}

    def render(self, ids: list[int], unmasked: list[int]) -> dict[str, Any]:
        missing = [i for i in set(ids) if i not in self._cache]
        if missing:
            self._cache.update(zip(missing, self._tok.token_strings(missing), strict=True))
        starts, parts, pos = [], [], 0
        for t in ids:
            starts.append(pos)
            piece = self._cache[t]
            parts.append(piece)
            pos += len(piece)
        starts.append(pos)
        return {
            "canvas": "".join(parts),
            "unmasked": _spans(sorted(unmasked), starts),
            "masked": _spans([k for k, t in enumerate(ids) if t == self._tok.mask_id], starts),
        }


def _spans(positions: list[int], starts: list[int]) -> list[list[int]]:
    """Character [start, end) spans of token positions, adjacent positions merged."""
    spans: list[list[int]] = []
    for p in positions:
        if not 0 <= p < len(starts) - 1:
            continue
        if spans and spans[-1][1] == starts[p]:
            spans[-1][1] = starts[p + 1]
        else:
            spans.append([starts[p], starts[p + 1]])
    return spans


class HealthFeed:
    """Pushes engine status changes to /health?stream=1 listeners without polling."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._changed = asyncio.Event()

    def notify(self, status: EngineStatus) -> None:  # engine thread
        del status
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._fire)

    def _fire(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait(self) -> None:
        await self._changed.wait()


class EventStream(StreamingResponse):
    """An SSE response that also listens for the client going away and then calls ``on_disconnect``.

    Starlette's StreamingResponse only notices a disconnect on its next write under ASGI 2.4; a
    generation waiting for its next denoising step would not write for a while, so we watch ``receive``.
    """

    def __init__(
        self,
        events: AsyncIterator[bytes],
        *,
        on_disconnect: Callable[[], None] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(
            events,
            media_type="text/event-stream",
            headers={"cache-control": "no-cache", "x-accel-buffering": "no", **(headers or {})},
        )
        self.events = events
        self.on_disconnect = on_disconnect

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        async def pump() -> None:
            await send(
                {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
            )
            async for chunk in self.events:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})

        pump_task = asyncio.ensure_future(pump())
        watch_task = asyncio.ensure_future(_wait_disconnect(receive))
        try:
            await asyncio.wait({pump_task, watch_task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone = not pump_task.done() or pump_task.cancelled() or pump_task.exception() is not None
            if gone and self.on_disconnect:
                # The client left (or the write failed): stop its generation. A no-op once it finished.
                self.on_disconnect()
            pump_task.cancel()
            watch_task.cancel()
            await asyncio.gather(pump_task, watch_task, return_exceptions=True)
            await self.events.aclose()  # type: ignore[attr-defined]
        exc = pump_task.exception() if not pump_task.cancelled() else None
        if exc is not None and not isinstance(exc, OSError):
            raise exc


async def _wait_disconnect(receive: Any) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


class Daemon:
    """The app's state: config, engine, and the handlers."""

    def __init__(
        self,
        config: Config,
        *,
        loader: Callable[[Callable[[str, float], None]], Any],
        on_fatal: Callable[[str], None] | None = None,
        warmup: bool | None = None,
    ) -> None:
        self.config = config
        self.loader = loader
        self.on_fatal = on_fatal
        self.warmup = config.warmup if warmup is None else warmup
        self.engine: Engine | None = None
        self.health_feed: HealthFeed | None = None
        self.pieces: Pieces | None = None
        self.started = time.time()

    # -- lifecycle -------------------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        del app
        loop = asyncio.get_running_loop()
        self.health_feed = HealthFeed(loop)
        self.engine = Engine(
            self.loader,
            queue_size=self.config.queue_size,
            max_batch=self.config.max_batch,
            warmup_params=SamplingParams() if self.warmup else None,
        )
        self.engine.add_listener(self.health_feed.notify)
        self.engine.add_listener(self._on_status)
        self.engine.start()
        try:
            yield
        finally:
            await run_in_threadpool(self.engine.stop, self.config.shutdown_grace + 5)

    def _on_status(self, status: EngineStatus) -> None:  # engine thread
        if status.stage == "failed":
            log.error("cannot serve: %s", status.error)
            if self.on_fatal:
                self.on_fatal(status.error or "model load failed")
        elif status.stage == READY:
            log.info("ready to serve")

    @property
    def runtime(self) -> Any:
        assert self.engine is not None
        if not self.engine.ready:
            st = self.engine.status
            raise NotReady(
                f"the model is not ready ({st.stage} {st.progress:.0%}: {st.detail})", retry_after=2
            )
        return self.engine.runtime

    def model_name(self) -> str:
        """The id clients see: a local checkpoint by its directory name, a hub id as it is."""
        rt = self.engine.runtime if self.engine else None
        name = str(getattr(rt, "model_name", None) or self.config.model)
        if os.path.isdir(name) and Path(name).resolve() == bundled_model_dir():
            return BUNDLED_MODEL_NAME
        if os.path.isabs(name) or os.path.isdir(name):
            return os.path.basename(name.rstrip("/")) or name
        return name

    # -- jobs ------------------------------------------------------------------------------------------
    def build_job(self, rt: Any, spec: GenSpec, loop: asyncio.AbstractEventLoop) -> tuple[Job, bool]:
        """Tokenize, check the context and build the row (in a worker thread); returns (job, truncated)."""
        try:
            return self._build_job(rt, spec, loop)
        except InputError as exc:  # the runtime's own checks, e.g. a chat it cannot template
            raise RequestError(str(exc)) from None

    def _build_job(self, rt: Any, spec: GenSpec, loop: asyncio.AbstractEventLoop) -> tuple[Job, bool]:
        # Sizes first: a row is built as a list of ids, so an absurd length must never get that far.
        if spec.canvas_tokens >= rt.max_context:
            raise RequestError(
                f"{spec.canvas_tokens} tokens to generate do not fit the model's context of "
                f"{rt.max_context} tokens",
                param="max_tokens",
                code="context_length_exceeded",
            )
        sampling = dict(spec.sampling)
        if "decoder" not in sampling and spec.canvas_tokens:
            # A request that names no decoder gets the one its model recommends (holes inside a prompt,
            # canvas_tokens 0, always take the reference decoder: the fast one cannot fill them).
            sampling["decoder"] = getattr(rt, "default_decoder", "reference")
        steps = sampling.setdefault("steps", max(spec.canvas_tokens, 1))
        if steps > self.config.max_steps:
            raise RequestError(
                f"steps: must be <= {self.config.max_steps} (the daemon's max_steps), got {steps}",
                param="steps",
            )
        vocab = int(getattr(rt.config, "vocab_size", 0))
        if vocab and sampling.get("top_k", 0) >= vocab:
            sampling["top_k"] = 0  # keeping every token is no filtering, and lax.top_k needs k <= vocab
        try:
            params = SamplingParams(max_new_tokens=max(spec.canvas_tokens, 1), **sampling)
        except ParamError as exc:
            raise RequestError(str(exc), param=exc.field) from None
        truncated = False
        if spec.mode == "chat":
            prompt_ids = rt.encode_chat(spec.messages)
            row = rt.make_row(prompt_ids, spec.canvas_tokens, chat=True)
        elif spec.mode == "prompt":
            if spec.prompt_ids is not None:
                bad = next((t for t in spec.prompt_ids if t < 0 or (vocab and t >= vocab)), None)
                if bad is not None:
                    raise RequestError(
                        f"prompt: token id {bad} is outside the vocabulary (0..{vocab})", param="prompt"
                    )
                prompt_ids = list(spec.prompt_ids)
            else:
                prompt_ids = rt.tokenizer.encode(spec.prompt or "")
            if not prompt_ids:
                raise RequestError("prompt: must not be empty", param="prompt")
            if spec.canvas_tokens == 0:
                row, masks = _holes_row(rt, prompt_ids)
                if params.decoder != "reference":
                    raise RequestError(
                        "decoder: holes inside the prompt need the reference decoder (the fast decoder "
                        "only unmasks the canvas after the prompt)",
                        param="decoder",
                    )
                # Every mask is denoised together; steps default to one per mask, as for a canvas.
                changes: dict[str, Any] = {"max_new_tokens": row.region[1] - row.region[0]}
                if "steps" not in spec.sampling:
                    changes["steps"] = min(masks, self.config.max_steps)
                params = dataclasses.replace(params, **changes)
            else:
                row = rt.make_row(prompt_ids, spec.canvas_tokens, chat=False)
        else:
            row, truncated = self._infill_row(rt, spec)
        length = row_length(row)
        if length > rt.max_context:
            prompt_tokens = length - spec.canvas_tokens
            raise RequestError(
                f"the prompt ({prompt_tokens} tokens) plus the {spec.canvas_tokens} tokens to generate make "
                f"{length}, beyond the model's context of {rt.max_context} tokens; shorten the prompt or ask "
                "for fewer tokens",
                param="messages" if spec.mode == "chat" else "prompt",
                code="context_length_exceeded",
            )
        job = Job(
            row=row,
            params=params,
            chat=spec.mode == "chat",
            prompt_tokens=length - spec.canvas_tokens,
            canvas_tokens=spec.canvas_tokens,
            row_length=length,
            max_seconds=min(spec.max_seconds or self.config.max_seconds, self.config.max_seconds),
            session=spec.session,
            kind="infill" if spec.mode == "infill" else "holes" if spec.canvas_tokens == 0 else "generate",
            want_steps=spec.stream,
            id=uuid.uuid4().hex[:20],
            loop=loop,
        )
        return job, truncated

    def _infill_row(self, rt: Any, spec: GenSpec) -> tuple[Any, bool]:
        """An infill row with the extra context chunks in front; returns (row, whether chunks were dropped).

        Chunks use Qwen2.5-Coder's repository layout, which DiffuCoder's tokenizer still carries
        (``<|file_sep|>name\ntext`` per other file, then the edited file). When they do not all fit the
        context, the newest are kept: llama.vim appends to its ring buffer, so the last chunk is the latest.
        """
        row = rt.make_infill_row(spec.prefix, spec.suffix, spec.canvas_tokens)
        if not spec.extra:
            return row, False
        chunks = [f"<|file_sep|>{name}\n{text}" for name, text in spec.extra]
        budget = rt.max_context - row_length(row) - len(rt.tokenizer.encode("<|file_sep|>\n"))
        kept: list[str] = []
        for chunk in reversed(chunks):  # each chunk is tokenized once, newest first
            budget -= len(rt.tokenizer.encode(chunk))
            if budget < 0:
                break
            kept.insert(0, chunk)
        while kept:
            # Tokens can merge across chunk borders, so check the real row and drop more if needed.
            with_context = rt.make_infill_row(
                "".join(kept) + "<|file_sep|>\n" + spec.prefix, spec.suffix, spec.canvas_tokens
            )
            if row_length(with_context) <= rt.max_context:
                return with_context, len(kept) < len(chunks)
            kept.pop(0)
        return row, True

    async def start_job(self, spec: GenSpec) -> tuple[Job, bool]:
        rt = self.runtime
        loop = asyncio.get_running_loop()
        assert self.engine is not None
        with self.engine.preparing():
            job, truncated = await run_in_threadpool(self.build_job, rt, spec, loop)
            self.engine.submit(job)
        return job, truncated

    async def wait_result(self, request: Request, job: Job) -> JobDone | JobError | None:
        """The job's final event, or None if the client went away first (the job is then cancelled)."""

        async def consume() -> JobDone | JobError:
            async for event in job.events():
                if isinstance(event, JobDone | JobError):
                    return event
            raise AssertionError("job events ended without a final event")

        result = asyncio.ensure_future(consume())
        watch = asyncio.ensure_future(_wait_disconnect(request.receive))
        try:
            await asyncio.wait({result, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not result.done():
                self.cancel_job(job, "client disconnected")
                result.cancel()
            watch.cancel()
            await asyncio.gather(result, watch, return_exceptions=True)
        return None if result.cancelled() else result.result()

    def cancel_job(self, job: Job, reason: str) -> None:
        if self.engine is not None and not job.finished:
            log.info("cancelling %s: %s", job.id, reason)
            self.engine.cancel(job, reason)

    # -- routes: health and status ---------------------------------------------------------------------
    def _health_body(self) -> tuple[int, dict[str, Any]]:
        assert self.engine is not None
        st = self.engine.status
        if st.stage == READY:
            return 200, {"status": "ok", "stage": st.stage, "progress": 1.0, "model": self.model_name()}
        message = st.error if st.stage == "failed" else f"Loading model ({st.stage}: {st.detail})"
        return 503, {
            "status": st.stage,
            **st.to_dict(),
            "model": self.model_name(),
            "error": {"code": 503, "message": message, "type": "unavailable_error"},
        }

    async def health(self, request: Request) -> Response:
        """503 with stage and progress while loading or compiling, 200 when ready. No token needed."""
        if request.query_params.get("stream") in ("1", "true"):
            return EventStream(self._health_events())
        status, body = self._health_body()
        headers = {"retry-after": "1"} if status == 503 else None
        return JSONResponse(body, status_code=status, headers=headers)

    async def _health_events(self) -> AsyncIterator[bytes]:
        """``event: status`` on every stage/progress change until ready or failed."""
        assert self.health_feed is not None
        while True:
            waiter = asyncio.ensure_future(self.health_feed.wait())
            status, body = self._health_body()
            yield sse.encode(body, event="status")
            if status == 200 or body["status"] in ("failed", "stopping"):
                waiter.cancel()
                return
            await waiter

    async def status(self, request: Request) -> Response:
        del request
        assert self.engine is not None
        rt = self.engine.runtime if self.engine.ready else None
        return JSONResponse(
            {
                "model": self.model_name(),
                "model_path": self.config.model,
                "version": __version__,
                "pid": os.getpid(),
                "device": getattr(rt, "device", None),
                "dtype": getattr(rt, "dtype", None),
                "quantize": getattr(getattr(rt, "quantize", None), "mode", None),
                "max_context": getattr(rt, "max_context", None),
                "default_decoder": getattr(rt, "default_decoder", None),
                "mesh": getattr(rt, "mesh_info", None),
                "buckets": [list(b) for b in rt.buckets] if rt is not None else [],
                "engine": self.engine.status.to_dict(),
                "queue": self.engine.queue_info(),
                "counters": dict(self.engine.counters),
                "uptime_seconds": round(time.time() - self.started, 3),
                "limits": {
                    "max_steps": self.config.max_steps,
                    "max_seconds": self.config.max_seconds,
                    "max_body_bytes": self.config.max_body_bytes,
                    "queue_size": self.config.queue_size,
                },
                "auth": self.config.auth,
                # What clients may rely on beyond the basic routes (``diffu lsp`` checks "holes").
                "features": ["holes"] if rt is not None and getattr(rt, "supports_holes", True) else [],
            }
        )

    async def cancel(self, request: Request) -> Response:
        data = protocol.parse_json(await request.body())
        protocol.reject_unknown(data, {"id"}, "/v1/diffu/cancel")
        job_id = protocol.get_str(data, "id", required=True, max_len=200) or ""
        for prefix in ("chatcmpl-", "cmpl-"):
            job_id = job_id.removeprefix(prefix)
        assert self.engine is not None
        if not self.engine.cancel(job_id, "cancelled by the client"):
            raise RequestError(
                f"id: no queued or running request {job_id!r}", status=404, param="id", kind="not_found_error"
            )
        return JSONResponse({"id": job_id, "cancelled": True})

    # -- routes: native --------------------------------------------------------------------------------
    async def native_generate(self, request: Request) -> Response:
        data = protocol.parse_json(await request.body())
        spec = protocol.parse_native_generate(data, default_tokens=self.config.default_max_tokens)
        return await self._native(request, spec)

    async def native_infill(self, request: Request) -> Response:
        data = protocol.parse_json(await request.body())
        spec = protocol.parse_native_infill(data, default_tokens=self.config.infill_tokens)
        return await self._native(request, spec)

    async def _native(self, request: Request, spec: GenSpec) -> Response:
        job, _ = await self.start_job(spec)
        return await self._respond(
            request,
            job,
            spec.stream,
            lambda: self._native_events(job),
            lambda done: self._native_done(job, done),
        )

    async def _respond(
        self,
        request: Request,
        job: Job,
        stream: bool,
        events: Callable[[], AsyncIterator[bytes]],
        body: Callable[[JobDone], Any],
    ) -> Response:
        """What every generation route does with its job: an SSE stream of ``events()`` (a client that
        disconnects cancels the job), or else the finished job as the route's JSON ``body``; 499 when the
        client left first, and the job's error as a RequestError."""
        headers = {"x-request-id": job.id}
        if stream:
            return EventStream(
                events(), headers=headers, on_disconnect=lambda: self.cancel_job(job, "client disconnected")
            )
        result = await self.wait_result(request, job)
        if result is None:
            return Response(status_code=499)
        if isinstance(result, JobError):
            raise RequestError(result.message, status=result.status, kind=result.kind)
        return JSONResponse(body(result), headers=headers)

    def _native_done(self, job: Job, done: JobDone) -> dict[str, Any]:
        body = {
            "id": job.id,
            "text": done.text,
            "finish_reason": done.finish_reason,
            "stats": done.stats,
            "usage": _usage(job, done),
        }
        if job.kind == "holes":
            assert self.engine is not None
            body["holes"] = _hole_fills(self.engine.runtime.tokenizer, job.row, done.ids)
        return body

    async def _native_events(self, job: Job) -> AsyncIterator[bytes]:
        assert self.engine is not None
        if self.pieces is None:
            self.pieces = Pieces(self.engine.runtime.tokenizer)
        yield sse.comment(f"queued {job.id}")  # flushes the headers so the client sees the request accepted
        async for event in job.events():
            if isinstance(event, JobStep):
                body = {
                    "id": job.id,
                    "step": event.step,
                    "steps": event.steps,
                    "masks": event.masks_left,
                    **self.pieces.render(event.ids, event.unmasked),
                    "seconds": round(event.seconds, 4),
                }
                yield sse.encode(body, event="step")
            elif isinstance(event, JobDone):
                yield sse.encode(self._native_done(job, event), event="done")
            else:
                yield sse.encode(_error_body(event.message, event.kind, event.status), event="error")

    # -- routes: OpenAI --------------------------------------------------------------------------------
    async def models(self, request: Request) -> Response:
        del request
        rt = self.runtime
        return JSONResponse({"object": "list", "data": [self._model_entry(rt)]})

    async def model(self, request: Request) -> Response:
        rt = self.runtime
        model_id = request.path_params["model_id"]
        if model_id not in (self.model_name(), rt.model_name):
            raise RequestError(
                f"model {model_id!r} not found; this daemon serves {self.model_name()!r}",
                status=404,
                param="model",
                kind="not_found_error",
                code="model_not_found",
            )
        return JSONResponse(self._model_entry(rt))

    def _model_entry(self, rt: Any) -> dict[str, Any]:
        return {
            "id": self.model_name(),
            "object": "model",
            "created": int(self.started),
            "owned_by": "diffu",
            "max_model_len": rt.max_context,
            "context_length": rt.max_context,
        }

    async def chat_completions(self, request: Request) -> Response:
        data = protocol.parse_json(await request.body())
        spec = protocol.parse_chat_completions(data, default_tokens=self.config.default_max_tokens)
        return await self._openai(request, spec, chat=True)

    async def completions(self, request: Request) -> Response:
        data = protocol.parse_json(await request.body())
        spec = protocol.parse_completions(
            data, default_tokens=self.config.default_max_tokens, infill_tokens=self.config.infill_tokens
        )
        return await self._openai(request, spec, chat=False)

    async def _openai(self, request: Request, spec: GenSpec, *, chat: bool) -> Response:
        job, _ = await self.start_job(spec)
        response_id = ("chatcmpl-" if chat else "cmpl-") + job.id

        def body(done: JobDone) -> dict[str, Any]:
            text, reason = _openai_text(done, spec)
            choice: dict[str, Any] = {"index": 0, "finish_reason": reason}
            if chat:
                choice["message"] = {"role": "assistant", "content": text}
            else:
                choice.update(text=text, logprobs=None)
            return {
                "id": response_id,
                "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()),
                "model": self.model_name(),
                "choices": [choice],
                "usage": _usage(job, done),
            }

        return await self._respond(
            request, job, spec.stream, lambda: self._openai_events(job, spec, response_id, chat=chat), body
        )

    async def _openai_events(
        self, job: Job, spec: GenSpec, response_id: str, *, chat: bool
    ) -> AsyncIterator[bytes]:
        created, model = int(time.time()), self.model_name()
        obj = "chat.completion.chunk" if chat else "text_completion"

        def chunk(content: str | None, reason: str | None, *, role: bool = False) -> bytes:
            if chat:
                delta: dict[str, Any] = {"role": "assistant"} if role else {}
                if content is not None:
                    delta["content"] = content
                choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": reason}
            else:
                choice = {"index": 0, "text": content or "", "logprobs": None, "finish_reason": reason}
            body: dict[str, Any] = {
                "id": response_id,
                "object": obj,
                "created": created,
                "model": model,
                "choices": [choice],
            }
            if spec.include_usage:
                body["usage"] = None
            return sse.encode(body)

        # Content is append-only for standard clients: the role first, the text once it is final.
        # Denoising steps only show as SSE comments here (keep-alives); the native stream has them.
        yield chunk("", None, role=True)
        async for event in job.events():
            if isinstance(event, JobStep):
                yield sse.comment(f"step {event.step + 1}/{event.steps}")
            elif isinstance(event, JobError):
                yield sse.encode(_error_body(event.message, event.kind, event.status))
                yield sse.encode("[DONE]")
            else:
                text, reason = _openai_text(event, spec)
                if text:
                    yield chunk(text, None)
                yield chunk(None, reason)
                if spec.include_usage:
                    yield sse.encode(
                        {
                            "id": response_id,
                            "object": obj,
                            "created": created,
                            "model": model,
                            "choices": [],
                            "usage": _usage(job, event),
                        }
                    )
                yield sse.encode("[DONE]")

    # -- routes: llama.cpp -----------------------------------------------------------------------------
    async def llama_infill(self, request: Request) -> Response:
        data = protocol.parse_json(await request.body())
        spec = protocol.parse_llama_infill(data, default_tokens=self.config.infill_tokens)
        fields = data.get("response_fields")
        if fields is not None and not (isinstance(fields, list) and all(isinstance(f, str) for f in fields)):
            raise RequestError("response_fields: expected an array of strings", param="response_fields")
        if spec.canvas_tokens == 0:
            # llama.vim's n_predict=0 requests warm llama.cpp's prompt cache; there is nothing to warm here.
            self.runtime  # noqa: B018 - still answers 503 while loading, as llama-server does
            body = {
                "content": "",
                "stop": True,
                "stop_type": "limit",
                "tokens_predicted": 0,
                "tokens_cached": 0,
                "truncated": False,
                "model": self.model_name(),
            }
            return JSONResponse(_select_fields(body, fields))
        job, truncated = await self.start_job(spec)
        return await self._respond(
            request,
            job,
            spec.stream,
            lambda: self._llama_events(job, spec, truncated),
            lambda done: _select_fields(self._llama_body(job, done, spec, truncated), fields),
        )

    def _llama_body(self, job: Job, done: JobDone, spec: GenSpec, truncated: bool) -> dict[str, Any]:
        text, cut_stop = protocol.apply_stop(done.text, spec.stop)
        text, cut_indent = protocol.apply_n_indent(text, spec.n_indent)
        stop_type = "word" if cut_stop else "limit" if cut_indent or done.finish_reason != "stop" else "eos"
        gen_ms = float(done.stats.get("generate_seconds", 0.0)) * 1000
        return {
            "index": 0,
            "content": text,
            "id_slot": 0,
            "stop": True,
            "model": self.model_name(),
            "tokens_predicted": done.new_tokens,
            "tokens_evaluated": job.prompt_tokens,
            "tokens_cached": 0,
            "truncated": truncated,
            "stop_type": stop_type,
            "stopping_word": "",
            "has_new_line": "\n" in text,
            "timings": {
                # A diffusion model re-reads the prompt at every step; there is no separate prompt phase.
                "prompt_n": job.prompt_tokens,
                "prompt_ms": 0.0,
                "prompt_per_token_ms": 0.0,
                "prompt_per_second": 0.0,
                "predicted_n": done.new_tokens,
                "predicted_ms": round(gen_ms, 3),
                "predicted_per_token_ms": round(gen_ms / done.new_tokens, 3) if done.new_tokens else 0.0,
                "predicted_per_second": round(done.new_tokens / (gen_ms / 1000), 3) if gen_ms > 0 else 0.0,
                "steps": done.steps_run,
            },
        }

    async def _llama_events(self, job: Job, spec: GenSpec, truncated: bool) -> AsyncIterator[bytes]:
        async for event in job.events():
            if isinstance(event, JobStep):
                yield sse.comment(f"step {event.step + 1}/{event.steps}")
            elif isinstance(event, JobError):
                yield sse.encode(_error_body(event.message, event.kind, event.status))
            else:
                body = self._llama_body(job, event, spec, truncated)
                if body["content"]:
                    yield sse.encode({"index": 0, "content": body["content"], "stop": False, "id_slot": 0})
                body["content"] = ""
                yield sse.encode(body)

    # -- the app ---------------------------------------------------------------------------------------
    def app(self, *, api_key: str | None) -> Any:
        routes = [
            Route("/health", self.health, methods=["GET"]),
            Route("/v1/diffu/status", self.status, methods=["GET"]),
            Route("/v1/diffu/generate", self.native_generate, methods=["POST"]),
            Route("/v1/diffu/infill", self.native_infill, methods=["POST"]),
            Route("/v1/diffu/cancel", self.cancel, methods=["POST"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/v1/models/{model_id:path}", self.model, methods=["GET"]),
            Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/infill", self.llama_infill, methods=["POST"]),
        ]
        app = Starlette(
            routes=routes,
            lifespan=self.lifespan,
            exception_handlers={
                RequestError: _request_error,
                EngineError: _engine_error,
                HTTPException: _http_error,
                Exception: _internal_error,
            },
        )
        return GuardMiddleware(
            app,
            api_key=api_key,
            check_host=is_loopback(self.config.host),
            allowed_hosts=self.config.allowed_hosts,
            cors_origins=self.config.cors_origins,
            max_body_bytes=self.config.max_body_bytes,
        )


# -- helpers ------------------------------------------------------------------------------------------
def _mask_runs(ids: Any, mask_id: int) -> list[tuple[int, int]]:
    """[start, end) of each maximal run of ``mask_id`` in ``ids``."""
    runs: list[tuple[int, int]] = []
    for i, t in enumerate(ids):
        if t == mask_id:
            if runs and runs[-1][1] == i:
                runs[-1] = (runs[-1][0], i + 1)
            else:
                runs.append((i, i + 1))
    return runs


def _holes_row(rt: Any, prompt_ids: list[int]) -> tuple[Any, int]:
    """A row whose reported region spans the prompt's holes, first mask to last, with no canvas after it.

    Only masked positions are ever committed, so the text between holes stays as it is. Returns the row
    and its number of masks.
    """
    runs = _mask_runs(prompt_ids, rt.tokenizer.mask_id)
    if not runs:
        raise RequestError(
            "max_new_tokens: 0 asks to fill the prompt's <|mask|> holes, but the prompt has none",
            param="max_new_tokens",
        )
    row = rt.make_row(prompt_ids, 0, chat=False)
    return dataclasses.replace(row, region=(runs[0][0], runs[-1][1])), sum(b - a for a, b in runs)


def _hole_fills(tok: Any, row: Any, region_ids: list[int]) -> list[str]:
    """One text per run of masks in the row's region, each cut at its first stop token or leftover mask."""
    stop_ids = getattr(tok, "stop_ids", None)
    stops = set(stop_ids(chat=False) if callable(stop_ids) else (tok.eos_id, tok.pad_id)) | {tok.mask_id}
    lo, hi = row.region
    fills = []
    for a, b in _mask_runs(row.ids[lo:hi], tok.mask_id):
        ids = list(region_ids[a:b])
        cut = next((k for k, t in enumerate(ids) if t in stops), len(ids))
        fills.append(tok.decode(ids[:cut]))
    return fills


def _usage(job: Job, done: JobDone) -> dict[str, int]:
    return {
        "prompt_tokens": job.prompt_tokens,
        "completion_tokens": done.new_tokens,
        "total_tokens": job.prompt_tokens + done.new_tokens,
    }


def _openai_text(done: JobDone, spec: GenSpec) -> tuple[str, str]:
    text, cut = protocol.apply_stop(done.text, spec.stop)
    return text, "stop" if cut else _FINISH_OPENAI.get(done.finish_reason, done.finish_reason)


def _select_fields(body: dict[str, Any], fields: list[str] | None) -> dict[str, Any]:
    """llama.cpp's ``response_fields``: only these paths, keyed by the path (``timings/prompt_n``)."""
    if not fields:
        return body
    out = {}
    for path in fields:
        node: Any = body
        for part in path.split("/"):
            if not isinstance(node, dict) or part not in node:
                break
            node = node[part]
        else:
            out[path] = node
    return out


def _error_body(message: str, kind: str, status: int | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": status}}


async def _request_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestError)
    if exc.status >= 500:
        log.error("%s %s: %s", request.method, request.url.path, exc)
    return JSONResponse(exc.to_dict(), status_code=exc.status)


async def _engine_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, EngineError)
    log.info("%s %s: %s", request.method, request.url.path, exc)
    headers = {"retry-after": str(exc.retry_after)} if exc.retry_after else None
    return JSONResponse(_error_body(str(exc), exc.kind), status_code=exc.status, headers=headers)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    message = {
        404: f"no route {request.url.path}",
        405: f"method {request.method} not allowed on {request.url.path}",
    }.get(exc.status_code, str(exc.detail))
    return JSONResponse(_error_body(message, kind), status_code=exc.status_code, headers=exc.headers)


async def _internal_error(request: Request, exc: Exception) -> Response:
    log.exception("internal error on %s %s", request.method, request.url.path, exc_info=exc)
    return JSONResponse(
        _error_body("internal server error (see the daemon log)", "server_error"), status_code=500
    )
