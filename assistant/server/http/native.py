"""diffu's own routes: ``/v1/diffu/generate`` and ``/v1/diffu/infill`` (every knob, SSE step events), and
``/v1/diffu/warm`` (compile the programs of given shapes ahead of use).

A streamed request gets ``event: waiting`` while its programs compile, ``event: step`` per denoising step
(one forward of the model: the region's text with ``░`` for a masked token, the character spans
unmasked in this step and still masked; with the fast decoder also its block) and one ``event: done``;
a holes request (``max_new_tokens: 0``) also gets each hole's fill.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from assistant import sse
from assistant.server import protocol, request_fields
from assistant.server.http.service import JobService, job_error_event, usage
from assistant.server.job import Job, JobDone, JobStep, JobWaiting
from assistant.server.protocol import GenSpec
from model_runtime.interface import TokenizerProtocol

MASK_MARK = "░"  # how a still-masked token shows in a step's canvas text (one character per token)


class Pieces:
    """Printable text per token id, cached: step events render whole canvases many times."""

    def __init__(self, tokenizer: TokenizerProtocol) -> None:
        self._tok = tokenizer
        self._cache: dict[int, str] = {tokenizer.mask_id: MASK_MARK}

    def render(self, ids: Sequence[int], unmasked: Sequence[int]) -> dict[str, Any]:
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


def routes(app: JobService) -> list[Route]:
    api = _Native(app)
    return [
        Route("/v1/diffu/generate", api.generate, methods=["POST"]),
        Route("/v1/diffu/infill", api.infill, methods=["POST"]),
        Route("/v1/diffu/warm", api.warm, methods=["POST"]),
    ]


class _Native:
    """diffu's own routes over the job service."""

    def __init__(self, app: JobService) -> None:
        self.app = app
        self._pieces: Pieces | None = None  # made once the runtime (and so its tokenizer) exists

    async def generate(self, request: Request) -> Response:
        data = request_fields.parse_json(await request.body())
        spec = protocol.parse_native_generate(data, default_tokens=self.app.config.default_max_tokens)
        return await self.respond(request, spec)

    async def infill(self, request: Request) -> Response:
        data = request_fields.parse_json(await request.body())
        spec = protocol.parse_native_infill(data, default_tokens=self.app.config.infill_tokens)
        return await self.respond(request, spec)

    async def warm(self, request: Request) -> Response:
        shapes = protocol.parse_warm(request_fields.parse_json(await request.body()))
        return JSONResponse(self.app.warm(shapes), status_code=202)

    async def respond(self, request: Request, spec: GenSpec) -> Response:
        job, _ = await self.app.start_job(spec)
        return await self.app.respond(
            request, job, spec.stream, lambda: self.events(job, spec), lambda done: self.done(job, spec, done)
        )

    def done(self, job: Job, spec: GenSpec, done: JobDone) -> dict[str, Any]:
        """The answer: a non-streamed response, or the ``done`` event of a stream."""
        rows = self.app.runtime.rows
        body = {
            "id": job.id,
            "text": done.text,
            "finish_reason": done.finish_reason,
            "stats": done.stats.to_dict(),
            "usage": usage(job, done),
        }
        if job.kind == "holes":
            body["holes"] = rows.hole_fills(job.row, done.ids)
        if spec.return_ids:
            # The row as the runtime denoised it: the prompt before the region (templated for a chat), and
            # the whole canvas after the last step (prompt, region, and an infill's suffix).
            lo, hi = job.row.region
            ids = job.row.ids
            body["ids"] = {
                "prompt": list(ids[:lo]),
                "sequence": [*ids[:lo], *(done.ids or ids[lo:hi]), *ids[hi:]],
                "pad_id": rows.tokenizer.pad_id,
            }
        return body

    def step(self, job: Job, event: JobStep) -> dict[str, Any]:
        """A ``step`` event: the region's text after the step, what it unmasked and what is still masked."""
        if self._pieces is None:
            self._pieces = Pieces(self.app.runtime.rows.tokenizer)
        body = {
            "id": job.id,
            "step": event.step,
            "steps": event.steps,
            "masks": event.masks_left,
            **self._pieces.render(event.ids, event.unmasked),
            "seconds": round(event.seconds, 4),
        }
        if event.blocks:  # the fast decoder: "steps" is then a bound, the block says where it is
            body.update(block=event.block, blocks=event.blocks)
        return body

    async def events(self, job: Job, spec: GenSpec) -> AsyncIterator[bytes]:
        yield sse.comment(f"queued {job.id}")  # flushes the headers so the client sees the request accepted
        async for event in job.events():
            if isinstance(event, JobStep):
                yield sse.encode(self.step(job, event), event="step")
            elif isinstance(event, JobWaiting):
                body = {
                    "id": job.id,
                    "reason": event.reason,
                    "detail": event.detail,
                    "eta_seconds": event.eta_seconds,
                }
                yield sse.encode(body, event="waiting")
            elif isinstance(event, JobDone):
                yield sse.encode(self.done(job, spec, event), event="done")
            else:
                yield sse.encode(job_error_event(event), event="error")
