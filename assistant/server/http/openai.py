"""OpenAI-compatible routes: ``/v1/models``, ``/v1/chat/completions``, ``/v1/completions``.

Standard clients expect append-only content, so a streamed answer sends the role first and the text once
it is final; denoising steps show only as SSE comments (keep-alives). ``suffix`` on completions makes
them fill-in-the-middle.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from assistant import sse
from assistant.server import protocol, request_fields
from assistant.server.http.app import HttpApp, job_error_event, usage
from assistant.server.job import Job, JobDone, JobError, JobStep, JobWaiting
from assistant.server.protocol import GenSpec
from assistant.server.request_fields import RequestError
from model_runtime.interface import RuntimeProtocol

_FINISH_OPENAI = {"stop": "stop", "length": "length", "time": "length", "cancelled": "cancelled"}


def _text(done: JobDone, spec: GenSpec) -> tuple[str, str]:
    """The answer cut at the first stop string, and OpenAI's finish_reason for it."""
    text, cut = protocol.apply_stop(done.text, spec.stop)
    return text, "stop" if cut else _FINISH_OPENAI.get(done.finish_reason, done.finish_reason)


def routes(app: HttpApp) -> list[Route]:
    def model_entry(rt: RuntimeProtocol) -> dict[str, Any]:
        return {
            "id": app.model_name(),
            "object": "model",
            "created": int(app.started),
            "owned_by": "diffu",
            "max_model_len": rt.max_context,
            "context_length": rt.max_context,
        }

    async def models(request: Request) -> Response:
        del request
        return JSONResponse({"object": "list", "data": [model_entry(app.runtime)]})

    async def model(request: Request) -> Response:
        rt = app.runtime
        model_id = request.path_params["model_id"]
        if model_id not in (app.model_name(), rt.model_name):
            raise RequestError(
                f"model {model_id!r} not found; this daemon serves {app.model_name()!r}",
                status=404,
                param="model",
                kind="not_found_error",
                code="model_not_found",
            )
        return JSONResponse(model_entry(rt))

    async def chat_completions(request: Request) -> Response:
        data = request_fields.parse_json(await request.body())
        spec = protocol.parse_chat_completions(data, default_tokens=app.config.default_max_tokens)
        return await respond(request, spec, chat=True)

    async def completions(request: Request) -> Response:
        data = request_fields.parse_json(await request.body())
        spec = protocol.parse_completions(
            data, default_tokens=app.config.default_max_tokens, infill_tokens=app.config.infill_tokens
        )
        return await respond(request, spec, chat=False)

    async def respond(request: Request, spec: GenSpec, *, chat: bool) -> Response:
        job, _ = await app.start_job(spec)
        response_id = ("chatcmpl-" if chat else "cmpl-") + job.id

        def body(done: JobDone) -> dict[str, Any]:
            text, reason = _text(done, spec)
            choice: dict[str, Any] = {"index": 0, "finish_reason": reason}
            if chat:
                choice["message"] = {"role": "assistant", "content": text}
            else:
                choice.update(text=text, logprobs=None)
            return {
                "id": response_id,
                "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()),
                "model": app.model_name(),
                "choices": [choice],
                "usage": usage(job, done),
            }

        return await app.respond(
            request, job, spec.stream, lambda: events(job, spec, response_id, chat=chat), body
        )

    async def events(job: Job, spec: GenSpec, response_id: str, *, chat: bool) -> AsyncIterator[bytes]:
        created, model = int(time.time()), app.model_name()
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
            elif isinstance(event, JobWaiting):
                yield sse.comment(event.detail)  # keeps the connection visibly alive while it compiles
            elif isinstance(event, JobError):
                yield sse.encode(job_error_event(event))
                yield sse.encode("[DONE]")
            else:
                text, reason = _text(event, spec)
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
                            "usage": usage(job, event),
                        }
                    )
                yield sse.encode("[DONE]")

    return [
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{model_id:path}", model, methods=["GET"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
    ]
