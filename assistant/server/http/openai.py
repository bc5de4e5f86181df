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
from assistant.daemon_status import ModelEntry, ModelList
from assistant.server import protocol, request_fields
from assistant.server.http.service import JobService, job_error_event, usage
from assistant.server.job import Job, JobDone, JobError, JobStep, JobWaiting
from assistant.server.protocol import GenSpec
from assistant.server.request_fields import RequestError
from assistant.wire import ErrorCode, ErrorType
from model_runtime.interface import RuntimeInfo

_FINISH_OPENAI = {"stop": "stop", "length": "length", "time": "length", "cancelled": "cancelled"}


def _text(done: JobDone, spec: GenSpec) -> tuple[str, str]:
    """The answer cut at the first stop string, and OpenAI's finish_reason for it."""
    text, cut = protocol.apply_stop(done.text, spec.stop)
    return text, "stop" if cut else _FINISH_OPENAI.get(done.finish_reason, done.finish_reason)


def routes(app: JobService) -> list[Route]:
    api = _OpenAI(app)
    return [
        Route("/v1/models", api.models, methods=["GET"]),
        Route("/v1/models/{model_id:path}", api.model, methods=["GET"]),
        Route("/v1/chat/completions", api.chat_completions, methods=["POST"]),
        Route("/v1/completions", api.completions, methods=["POST"]),
    ]


class _OpenAI:
    """The OpenAI dialect's routes over the job service."""

    def __init__(self, app: JobService) -> None:
        self.app = app

    def model_entry(self, info: RuntimeInfo) -> ModelEntry:
        return ModelEntry(
            id=self.app.model_name(),
            created=int(self.app.started),
            max_model_len=info.max_context,
            context_length=info.max_context,
            editor_context=info.editor_context,
        )

    async def models(self, request: Request) -> Response:
        del request
        return JSONResponse(ModelList((self.model_entry(self.app.runtime.info),)).to_dict())

    async def model(self, request: Request) -> Response:
        info = self.app.runtime.info
        model_id = request.path_params["model_id"]
        if model_id not in (self.app.model_name(), info.model_name):
            raise RequestError(
                f"model {model_id!r} not found; this daemon serves {self.app.model_name()!r}",
                status=404,
                param="model",
                kind=ErrorType.NOT_FOUND,
                code=ErrorCode.MODEL_NOT_FOUND,
            )
        return JSONResponse(self.model_entry(info).to_dict())

    async def chat_completions(self, request: Request) -> Response:
        data = request_fields.parse_json(await request.body())
        spec = protocol.parse_chat_completions(data, default_tokens=self.app.config.default_max_tokens)
        return await self.respond(request, spec, chat=True)

    async def completions(self, request: Request) -> Response:
        data = request_fields.parse_json(await request.body())
        config = self.app.config
        spec = protocol.parse_completions(
            data, default_tokens=config.default_max_tokens, infill_tokens=config.infill_tokens
        )
        return await self.respond(request, spec, chat=False)

    async def respond(self, request: Request, spec: GenSpec, *, chat: bool) -> Response:
        job, _ = await self.app.start_job(spec)
        answer = _Answer(job, spec, chat, self.app.model_name())
        return await self.app.respond(request, job, spec.stream, answer.events, answer.body)


class _Answer:
    """One request's answer in OpenAI's shapes: the whole response, or the chunks of its stream."""

    def __init__(self, job: Job, spec: GenSpec, chat: bool, model: str) -> None:
        self.job, self.spec, self.chat, self.model = job, spec, chat, model
        self.id = ("chatcmpl-" if chat else "cmpl-") + job.id
        self.created = int(time.time())

    def body(self, done: JobDone) -> dict[str, Any]:
        """The non-streamed response."""
        text, reason = _text(done, self.spec)
        choice: dict[str, Any] = {"index": 0, "finish_reason": reason}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice.update(text=text, logprobs=None)
        return {
            "id": self.id,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [choice],
            "usage": usage(self.job, done),
        }

    def chunk(self, content: str | None, reason: str | None, *, role: bool = False) -> bytes:
        """One streamed chunk: content to append (None: none), and the finish reason with the last."""
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant"} if role else {}
            if content is not None:
                delta["content"] = content
            choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": reason}
        else:
            choice = {"index": 0, "text": content or "", "logprobs": None, "finish_reason": reason}
        return sse.encode(self._chunk_body([choice], None))

    def _chunk_body(self, choices: list[dict[str, Any]], counts: dict[str, int] | None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if self.spec.include_usage:
            body["usage"] = counts
        return body

    async def events(self) -> AsyncIterator[bytes]:
        """The stream. Content is append-only for standard clients: the role first, the text once it is
        final; denoising steps only show as SSE comments here (keep-alives), the native stream has them."""
        yield self.chunk("", None, role=True)
        async for event in self.job.events():
            if isinstance(event, JobStep):
                yield sse.comment(f"step {event.step + 1}/{event.steps}")
            elif isinstance(event, JobWaiting):
                yield sse.comment(event.detail)  # keeps the connection visibly alive while it compiles
            elif isinstance(event, JobError):
                yield sse.encode(job_error_event(event))
                yield sse.encode("[DONE]")
            else:
                text, reason = _text(event, self.spec)
                if text:
                    yield self.chunk(text, None)
                yield self.chunk(None, reason)
                if self.spec.include_usage:
                    yield sse.encode(self._chunk_body([], usage(self.job, event)))
                yield sse.encode("[DONE]")
