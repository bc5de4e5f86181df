"""What the dialect routes (``native``, ``openai``, ``llama``) need of the daemon: the job service.

The routes are thin: parse a body into a ``GenSpec``, start its job, shape the answer. They depend on this
protocol, not on :class:`~assistant.server.http.app.HttpApp`, which satisfies it and mounts them, so the
imports point one way (app -> routes -> service). The answer pieces every dialect reports alike (token
counts, a job's error as an SSE event) live here too.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import Response

from assistant.config import Config
from assistant.server.job import Job, JobDone, JobError
from assistant.server.protocol import GenSpec
from assistant.server.warmup import Shape
from assistant.wire import error_body
from model_runtime.interface import RuntimeProtocol


class JobService(Protocol):
    """The daemon as its routes see it."""

    @property
    def config(self) -> Config: ...

    @property
    def started(self) -> float:
        """When the daemon started (epoch seconds; OpenAI's model ``created``)."""
        ...

    @property
    def runtime(self) -> RuntimeProtocol:
        """The serving runtime, or a 503 (``NotReady``) while the model loads."""
        ...

    def model_name(self) -> str:
        """The id clients see."""
        ...

    async def start_job(self, spec: GenSpec) -> tuple[Job, bool]:
        """Build ``spec``'s job and submit it; returns (job, context truncated)."""
        ...

    async def respond(
        self,
        request: Request,
        job: Job,
        stream: bool,
        events: Callable[[], AsyncIterator[bytes]],
        body: Callable[[JobDone], Any],
    ) -> Response:
        """The job's answer: an SSE stream of ``events()``, or the finished job as the JSON ``body``."""
        ...

    def warm(self, shapes: list[Shape]) -> dict[str, Any]:
        """Queue the programs of ``shapes`` ahead of the generic warm-up."""
        ...


def usage(job: Job, done: JobDone) -> dict[str, int]:
    """OpenAI-style token counts of a finished job (every dialect reports them)."""
    return {
        "prompt_tokens": job.prompt_tokens,
        "completion_tokens": done.new_tokens,
        "total_tokens": job.prompt_tokens + done.new_tokens,
    }


def job_error_event(error: JobError) -> dict[str, Any]:
    """A JobError as the body of an SSE error event (``code`` is the HTTP status)."""
    return error_body(error.message, error.kind, param=error.param, code=error.status, details=error.details)
