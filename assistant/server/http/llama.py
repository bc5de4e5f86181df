"""llama.cpp's ``POST /infill``, as llama.vim, llama.vscode and minuet-ai send it and read it back, and
its ``POST /tokenize``.

``response_fields`` selects paths of the answer (``timings/prompt_n``); ``n_predict: 0`` (a prompt-cache
warm-up in llama.cpp) is answered at once with empty content. ``/tokenize`` counts tokens for clients,
which never load the tokenizer themselves (the chat's files in context count against the prompt budget).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from assistant import sse
from assistant.server import protocol, request_fields
from assistant.server.http.service import JobService, job_error_event
from assistant.server.job import Job, JobDone, JobError, JobStep, JobWaiting
from assistant.server.protocol import GenSpec
from assistant.server.request_fields import RequestError


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


def routes(app: JobService) -> list[Route]:
    async def infill(request: Request) -> Response:
        data = request_fields.parse_json(await request.body())
        spec = protocol.parse_llama_infill(data, default_tokens=app.config.infill_tokens)
        fields = data.get("response_fields")
        if fields is not None and not (isinstance(fields, list) and all(isinstance(f, str) for f in fields)):
            raise RequestError("response_fields: expected an array of strings", param="response_fields")
        if spec.canvas_tokens == 0:
            # llama.vim's n_predict=0 requests warm llama.cpp's prompt cache; there is nothing to warm here.
            app.runtime  # noqa: B018 - still answers 503 while loading, as llama-server does
            body = {
                "content": "",
                "stop": True,
                "stop_type": "limit",
                "tokens_predicted": 0,
                "tokens_cached": 0,
                "truncated": False,
                "model": app.model_name(),
            }
            return JSONResponse(_select_fields(body, fields))
        job, truncated = await app.start_job(spec)
        return await app.respond(
            request,
            job,
            spec.stream,
            lambda: events(job, spec, truncated),
            lambda done: _select_fields(answer(job, done, spec, truncated), fields),
        )

    def answer(job: Job, done: JobDone, spec: GenSpec, truncated: bool) -> dict[str, Any]:
        text, cut_stop = protocol.apply_stop(done.text, spec.stop)
        text, cut_indent = protocol.apply_n_indent(text, spec.n_indent)
        stop_type = "word" if cut_stop else "limit" if cut_indent or done.finish_reason != "stop" else "eos"
        gen_ms = done.stats.generate_seconds * 1000
        return {
            "index": 0,
            "content": text,
            "id_slot": 0,
            "stop": True,
            "model": app.model_name(),
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

    async def events(job: Job, spec: GenSpec, truncated: bool) -> AsyncIterator[bytes]:
        async for event in job.events():
            if isinstance(event, JobStep):
                yield sse.comment(f"step {event.step + 1}/{event.steps}")
            elif isinstance(event, JobWaiting):
                yield sse.comment(event.detail)  # keeps the connection visibly alive while it compiles
            elif isinstance(event, JobError):
                yield sse.encode(job_error_event(event))
            else:
                body = answer(job, event, spec, truncated)
                if body["content"]:
                    yield sse.encode({"index": 0, "content": body["content"], "stop": False, "id_slot": 0})
                body["content"] = ""
                yield sse.encode(body)

    return [Route("/infill", infill, methods=["POST"]), Route("/tokenize", _tokenize(app), methods=["POST"])]


def _tokenize(app: JobService) -> Callable[[Request], Awaitable[Response]]:
    """The ``/tokenize`` route over ``app``'s runtime."""

    async def tokenize(request: Request) -> Response:
        """llama.cpp's ``{"content": text, "with_pieces": false}`` -> ``{"tokens": [ids]}`` (with pieces,
        ``[{"id", "piece"}]``). The text is encoded as a prompt's text is: control-token strings in it
        stay text, so the count is what the same text costs in a request."""
        data = request_fields.parse_json(await request.body())
        content = request_fields.get_str(data, "content", required=True)
        assert content is not None
        with_pieces = request_fields.get_bool(data, "with_pieces", False)
        tokenizer = app.runtime.rows.tokenizer  # 503 while the model loads
        # A long file takes a while to encode: off the event loop, like a request's rows.
        ids = await run_in_threadpool(tokenizer.encode_text, content)
        if not with_pieces:
            return JSONResponse({"tokens": ids})
        pieces = tokenizer.token_strings(ids)
        return JSONResponse({"tokens": [{"id": i, "piece": p} for i, p in zip(ids, pieces, strict=True)]})

    return tokenize
