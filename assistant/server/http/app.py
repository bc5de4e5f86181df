"""The daemon's HTTP app: lifecycle, the path every generation route shares, and the daemon's own routes.

Every generation route does the same: parse the body into a :class:`~assistant.server.protocol.GenSpec`
(4xx on bad input), build the job off the event loop (:func:`assistant.server.job_builder.build_job`),
submit it to the :class:`~assistant.server.scheduler.Scheduler`, then turn the job's events into the
route's response shape (``native``, ``openai``, ``llama``). While a job runs, a watcher waits for the client's
``http.disconnect`` and cancels the job, so an abandoned request frees the device at the next step.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp

from assistant import __version__, sse
from assistant.config import Config
from assistant.daemon_status import DaemonLimits, DaemonStatus, ProgramsStatus, QueueStatus
from assistant.server import protocol, request_fields, warmup
from assistant.server.http import llama, native, openai
from assistant.server.http.service import JobService
from assistant.server.http.streaming import EventStream, HealthFeed, wait_disconnect
from assistant.server.job import Job, JobDone, JobError
from assistant.server.job_builder import build_job, warm_task
from assistant.server.protocol import GenSpec
from assistant.server.request_fields import RequestError
from assistant.server.scheduler import Loader, Scheduler
from assistant.server.security import GuardMiddleware, is_loopback
from assistant.server.status import NotReady, SchedulerError, SchedulerStatus
from assistant.server.warmup import Shape, WarmTask
from assistant.wire import ENDED, HEALTH_OK, HEALTHY, SERVING, ErrorType, Stage, error_body
from model_runtime.bundled import BUNDLED_MODEL_NAME, bundled_model_dir
from model_runtime.interface import RuntimeProtocol

log = logging.getLogger("diffu.server")


class HttpApp:
    """The daemon's state behind its routes: config, the scheduler, and what every route shares."""

    def __init__(
        self,
        config: Config,
        *,
        loader: Loader,
        on_fatal: Callable[[str], None] | None = None,
        warmup: bool | None = None,
    ) -> None:
        self.config = config
        self.loader = loader
        self.on_fatal = on_fatal
        self.warmup = config.warmup if warmup is None else warmup
        self.scheduler: Scheduler | None = None
        self.health_feed: HealthFeed | None = None
        self.started = time.time()
        self._stage = ""

    # -- lifecycle -------------------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        del app
        loop = asyncio.get_running_loop()
        self.health_feed = HealthFeed(loop)
        self.scheduler = Scheduler(
            self.loader,
            queue_size=self.config.queue_size,
            max_batch=self.config.max_batch,
            planner=self._plan if self.warmup else None,
            warm_threads=self.config.warm_threads,
        )
        self.scheduler.add_listener(self.health_feed.notify)
        self.scheduler.add_listener(self._on_status)
        self.scheduler.start()
        try:
            yield
        finally:
            await run_in_threadpool(self.scheduler.stop, self.config.shutdown_grace + 5)

    def _plan(self, rt: RuntimeProtocol) -> list[WarmTask]:  # scheduler thread, once loaded
        """The generic warm-up (``assistant.server.warmup.default_plan``) as tasks, the chat's first
        programs marked ``ready``; shapes that do not fit this model (a context shorter than the chat's
        canvas) are left out."""
        accelerator = not rt.info.device.startswith("cpu")
        first, rest = warmup.default_plan(rt, self.config, accelerator=accelerator)
        tasks = []
        for ready, shapes in ((True, first), (False, rest)):
            for shape in shapes:
                try:
                    task = warm_task(rt, shape, self.config)
                except RequestError as exc:
                    log.info("warm-up leaves out %s: %s", shape.describe(), exc)
                    continue
                tasks.append(dataclasses.replace(task, ready=ready))
        return tasks

    def warm(self, shapes: list[Shape]) -> dict[str, Any]:
        """Queue the programs of ``shapes`` ahead of the generic warm-up (``POST /v1/diffu/warm``)."""
        rt = self.runtime
        tasks = []
        for i, shape in enumerate(shapes):
            try:
                tasks.append(warm_task(rt, shape, self.config))
            except RequestError as exc:  # a shape this model cannot run (beyond its context)
                raise protocol.in_shape(exc, i) from None
        compiled = [rt.compiled(t.rows, t.params) for t in tasks]
        queued = self.sched.warm([t for t, done in zip(tasks, compiled, strict=True) if not done])
        st = self.sched.status
        return {
            "queued": queued,
            "compiled": [i for i, done in enumerate(compiled) if done],
            "shapes": [{"label": t.label, "compiled": done} for t, done in zip(tasks, compiled, strict=True)],
            "stage": st.stage,
            "eta_seconds": st.eta_seconds,
        }

    def _on_status(self, status: SchedulerStatus) -> None:  # scheduler thread
        if status.stage == Stage.FAILED:
            log.error("cannot serve: %s", status.error)
            if self.on_fatal:
                self.on_fatal(status.error or "model load failed")
        elif status.stage in SERVING and self._stage not in SERVING:
            log.info("serving (the warm-up compiles beside the requests)")
        self._stage = status.stage

    @property
    def sched(self) -> Scheduler:
        """The scheduler (it exists from the app's start to its end)."""
        assert self.scheduler is not None, "the app's lifespan has not started"
        return self.scheduler

    @property
    def runtime(self) -> RuntimeProtocol:
        """The runtime, or a 503 (NotReady) while the model loads."""
        sched = self.sched
        if not sched.ready:
            st = sched.status
            raise NotReady(
                f"the model is not ready ({st.stage} {st.progress:.0%}: {st.detail})", retry_after=2
            )
        return sched.runtime

    def _ready_runtime(self) -> RuntimeProtocol | None:
        sched = self.scheduler
        return sched.runtime if sched is not None and sched.ready else None

    def _loaded_chat_defaults(self) -> dict[str, Any]:
        sched = self.scheduler
        return dict(sched.runtime.info.chat_defaults) if sched is not None and sched.loaded else {}

    def model_name(self) -> str:
        """The id clients see: a local checkpoint by its directory name, a hub id as it is."""
        sched = self.scheduler
        rt = sched.runtime if sched is not None and sched.loaded else None  # named while it compiles too
        name = str((rt.info.model_name if rt is not None else None) or self.config.model)
        if os.path.isdir(name) and Path(name).resolve() == bundled_model_dir():
            return BUNDLED_MODEL_NAME
        if os.path.isabs(name) or os.path.isdir(name):
            return os.path.basename(name.rstrip("/")) or name
        return name

    # -- jobs ------------------------------------------------------------------------------------------
    async def start_job(self, spec: GenSpec) -> tuple[Job, bool]:
        """Build ``spec``'s job in a worker thread and submit it; returns (job, context truncated)."""
        rt = self.runtime
        loop = asyncio.get_running_loop()
        sched = self.sched
        with sched.preparing():
            job, truncated = await run_in_threadpool(build_job, rt, spec, self.config)
            job.loop = loop
            sched.submit(job)
        return job, truncated

    async def wait_result(self, request: Request, job: Job) -> JobDone | JobError | None:
        """The job's final event, or None if the client went away first (the job is then cancelled)."""

        async def consume() -> JobDone | JobError:
            async for event in job.events():
                if isinstance(event, JobDone | JobError):
                    return event
            raise AssertionError("job events ended without a final event")

        result = asyncio.ensure_future(consume())
        watch = asyncio.ensure_future(wait_disconnect(request.receive))
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
        if self.scheduler is not None and not job.finished:
            log.info("cancelling %s: %s", job.id, reason)
            self.scheduler.cancel(job, reason)

    async def respond(
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
            raise RequestError(
                result.message,
                status=result.status,
                kind=result.kind,
                param=result.param,
                details=result.details,
            )
        return JSONResponse(body(result), headers=headers)

    # -- the daemon's routes: health, status, cancel ---------------------------------------------------
    def _health_body(self) -> tuple[int, dict[str, Any]]:
        st = self.sched.status
        if st.stage in HEALTHY:
            # A chat's first prompt is answered without a compile from here on: "warming" only says other
            # programs still compile in the background ("warmed" of "shapes", "eta_seconds" once one
            # compile was timed).
            return 200, {"status": HEALTH_OK, **st.to_dict(), "serving": True, "model": self.model_name()}
        if st.stage == Stage.FAILED:
            message = st.error or "model load failed"
        elif st.stage in SERVING:  # requests are taken, but a chat's first one would wait for a compile
            message = f"Compiling ({st.detail}); requests are taken meanwhile"
        else:
            message = f"Loading model ({st.stage}: {st.detail})"
        return 503, {
            "status": st.stage,
            **st.to_dict(),
            "serving": st.stage in SERVING,  # requests are taken (clients that need no compile go ahead)
            "model": self.model_name(),
            "error": {"code": 503, "message": message, "type": ErrorType.UNAVAILABLE},
        }

    async def health(self, request: Request) -> Response:
        """503 with stage and progress while loading and while the clients' first programs compile (stage
        "compiling": requests are taken meanwhile), 200 once a chat's first prompt is answered without a
        compile (stage "warming" while the rest of the warm-up compiles in the background, then
        "ready"). No token needed."""
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
            if status == 200 or body["status"] in ENDED:
                waiter.cancel()
                return
            await waiter

    async def status(self, request: Request) -> Response:
        del request
        sched = self.sched
        rt = self._ready_runtime()
        status = _with_runtime(
            DaemonStatus(
                model=self.model_name(),
                model_path=self.config.model,
                version=__version__,
                pid=os.getpid(),
                # The model's chat defaults (generation_config.json); diffu chat starts from them. Known once
                # the weights are loaded, while programs may still compile.
                chat_defaults=self._loaded_chat_defaults(),
                engine=sched.status,
                queue=QueueStatus(**sched.queue_info()),
                counters=sched.counters,
                uptime_seconds=round(time.time() - self.started, 3),
                limits=DaemonLimits(
                    max_steps=self.config.max_steps,
                    max_seconds=self.config.max_seconds,
                    max_body_bytes=self.config.max_body_bytes,
                    queue_size=self.config.queue_size,
                ),
                auth=self.config.auth,
                # What clients may rely on beyond the basic routes (``diffu lsp`` checks "holes").
                features=("holes",) if rt is not None and rt.info.supports_holes else (),
            ),
            rt,
        )
        return JSONResponse(status.to_dict())

    async def cancel(self, request: Request) -> Response:
        data = request_fields.parse_json(await request.body())
        request_fields.reject_unknown(data, {"id"}, "/v1/diffu/cancel")
        job_id = request_fields.get_str(data, "id", required=True, max_len=200) or ""
        for prefix in ("chatcmpl-", "cmpl-"):
            job_id = job_id.removeprefix(prefix)
        if not self.sched.cancel(job_id, "cancelled by the client"):
            raise RequestError(
                f"id: no queued or running request {job_id!r}",
                status=404,
                param="id",
                kind=ErrorType.NOT_FOUND,
            )
        return JSONResponse({"id": job_id, "cancelled": True})

    # -- the app ---------------------------------------------------------------------------------------
    def app(self, *, api_key: str | None) -> ASGIApp:
        """The ASGI app: every dialect's routes behind the security guard."""
        routes = [
            Route("/health", self.health, methods=["GET"]),
            Route("/v1/diffu/status", self.status, methods=["GET"]),
            *native.routes(self),
            Route("/v1/diffu/cancel", self.cancel, methods=["POST"]),
            *openai.routes(self),
            *llama.routes(self),
        ]
        app = Starlette(
            routes=routes,
            lifespan=self.lifespan,
            exception_handlers={
                RequestError: _request_error,
                SchedulerError: _scheduler_error,
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


def _with_runtime(status: DaemonStatus, rt: RuntimeProtocol | None) -> DaemonStatus:
    """``status`` with the serving runtime's fields (left null or empty while the model is not ready)."""
    if rt is None:
        return status
    info, programs = rt.info, rt.program_cache()
    return dataclasses.replace(
        status,
        device=info.device,
        dtype=info.dtype,
        quantize=info.quantize_mode,
        max_context=info.max_context,
        default_decoder=info.default_decoder,
        one_line_defaults=info.one_line_defaults,
        block_defaults=info.block_defaults,
        chat_decoder=info.chat_decoder,
        mesh=info.mesh,
        buckets=info.buckets,
        # The compiled-program cache: its bound, what it holds, its memory ceiling (issue #17).
        programs=ProgramsStatus.from_dict(programs) if programs is not None else None,
    )


async def _request_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestError)
    if exc.status >= 500:
        log.error("%s %s: %s", request.method, request.url.path, exc)
    return JSONResponse(exc.to_dict(), status_code=exc.status)


async def _scheduler_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, SchedulerError)
    log.info("%s %s: %s", request.method, request.url.path, exc)
    headers = {"retry-after": str(exc.retry_after)} if exc.retry_after else None
    return JSONResponse(error_body(str(exc), exc.kind), status_code=exc.status, headers=headers)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    kind = ErrorType.NOT_FOUND if exc.status_code == 404 else ErrorType.INVALID_REQUEST
    message = {
        404: f"no route {request.url.path}",
        405: f"method {request.method} not allowed on {request.url.path}",
    }.get(exc.status_code, str(exc.detail))
    return JSONResponse(error_body(message, kind), status_code=exc.status_code, headers=exc.headers)


async def _internal_error(request: Request, exc: Exception) -> Response:
    log.exception("internal error on %s %s", request.method, request.url.path, exc_info=exc)
    return JSONResponse(
        error_body("internal server error (see the daemon log)", ErrorType.SERVER), status_code=500
    )


if TYPE_CHECKING:
    # The routes are typed against the job service; the type checker in .ci/run holds the app to it.
    _serves: type[JobService] = HttpApp
