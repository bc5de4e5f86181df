"""From a parsed request to a job: the decoder default, the steps limit, the top-k clamp, the canvas row
and the context check. Pure: no HTTP and no event loop, so it is tested with a fake runtime alone.

The HTTP layer runs :func:`build_job` in a worker thread (tokenizing a long prompt takes a while), then
attaches the job to its event loop and submits it. Every refusal is a :class:`RequestError` naming the
field, and a prompt that does not fit the context says so in fields too (``details``), so clients such
as the language server can shorten it by the right amount instead of reading numbers out of a message.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

from assistant.config import Config
from assistant.server.job import Job
from assistant.server.protocol import GenSpec
from assistant.server.request_fields import RequestError
from assistant.server.warmup import Shape, WarmTask, shape_rows
from assistant.wire import ErrorCode, SamplingOptions
from model_runtime import decoders
from model_runtime.errors import InputError
from model_runtime.interface import CanvasRow, RuntimeProtocol
from model_runtime.params import MAX_TOP_K, ParamError, SamplingParams


def build_job(rt: RuntimeProtocol, spec: GenSpec, config: Config) -> tuple[Job, bool]:
    """The job for ``spec`` on ``rt``, and whether context (``input_extra`` files) was dropped to fit.

    The job has no event loop yet: the caller sets ``job.loop`` before submitting it.
    """
    try:
        return _build(rt, spec, config)
    except InputError as exc:  # the runtime's own checks, e.g. a chat it cannot template
        raise RequestError(str(exc), param=exc.field, details=exc.details) from None


def _build(rt: RuntimeProtocol, spec: GenSpec, config: Config) -> tuple[Job, bool]:
    # Sizes first: a row is built as a list of ids, so an absurd length must never get that far.
    if spec.canvas_tokens >= rt.info.max_context:
        raise RequestError(
            f"{spec.canvas_tokens} tokens to generate do not fit the model's context of "
            f"{rt.info.max_context} tokens",
            param="max_tokens",
            code=ErrorCode.CONTEXT_LENGTH_EXCEEDED,
            details={"max_new_tokens": spec.canvas_tokens, "context_length": rt.info.max_context},
        )
    params = _params(rt, spec, config)
    truncated = False
    if spec.mode == "chat":
        row = rt.rows.make_row(rt.rows.encode_chat(spec.messages or []), spec.canvas_tokens, chat=True)
    elif spec.mode == "prompt":
        row, params = _prompt_row(rt, spec, params, config)
    else:
        row, truncated = rt.rows.make_repo_infill_row(
            spec.prefix, spec.suffix, spec.canvas_tokens, spec.extra
        )
    row = dataclasses.replace(row, seed=params.seed)  # it samples with its own seed in any batch
    length = len(row.ids)
    prompt_tokens = length - spec.canvas_tokens
    if length > rt.info.max_context:
        raise RequestError(
            f"the prompt ({prompt_tokens} tokens) plus the {spec.canvas_tokens} tokens to generate make "
            f"{length}, beyond the model's context of {rt.info.max_context} tokens; shorten the prompt or "
            "ask for fewer tokens",
            param="messages" if spec.mode == "chat" else "prompt",
            code=ErrorCode.CONTEXT_LENGTH_EXCEEDED,
            details={
                "prompt_tokens": prompt_tokens,
                "max_new_tokens": spec.canvas_tokens,
                "context_length": rt.info.max_context,
            },
        )
    job = Job(
        row=row,
        params=params,
        chat=spec.mode == "chat",
        prompt_tokens=prompt_tokens,
        canvas_tokens=spec.canvas_tokens,
        row_length=length,
        max_seconds=min(spec.max_seconds or config.max_seconds, config.max_seconds),
        session=spec.session,
        kind="infill" if spec.mode == "infill" else "holes" if spec.canvas_tokens == 0 else "generate",
        want_steps=spec.stream,
        id=uuid.uuid4().hex[:20],
    )
    return job, truncated


def warm_task(rt: RuntimeProtocol, shape: Shape, config: Config) -> WarmTask:
    """The programs a request of ``shape`` would run, with the defaults and limits a request gets, as a
    task for the warm-up. A shape no request could have is a RequestError naming the field."""
    length = shape.prompt_tokens + shape.max_new_tokens
    if length > rt.info.max_context:
        raise RequestError(
            f"prompt_tokens + max_new_tokens: {shape.prompt_tokens} + {shape.max_new_tokens} = {length} "
            f"tokens do not fit the model's context of {rt.info.max_context} tokens",
            param="prompt_tokens",
            code=ErrorCode.CONTEXT_LENGTH_EXCEEDED,
            details={
                "prompt_tokens": shape.prompt_tokens,
                "max_new_tokens": shape.max_new_tokens,
                "context_length": rt.info.max_context,
            },
        )
    mode = "infill" if shape.infill else "chat"
    spec = GenSpec(mode=mode, canvas_tokens=shape.max_new_tokens, sampling=SamplingOptions(**shape.sampling))
    params = _params(rt, spec, config)
    return WarmTask(shape_rows(rt, shape), params, f"{shape.describe()}, {params.decoder} decoder")


def _params(rt: RuntimeProtocol, spec: GenSpec, config: Config) -> SamplingParams:
    """The request's sampling parameters with the daemon's defaults and limits applied."""
    sampling = spec.sampling.body()
    if "decoder" not in sampling and spec.canvas_tokens:
        # A request that names no decoder gets the one its model recommends, for a one-line answer the
        # model's one-line knobs under the request's own (holes inside a prompt, canvas_tokens 0, always
        # take the reference decoder: the fast ones cannot fill them).
        if sampling.get("max_lines") == 1:
            sampling = {**rt.info.one_line_defaults, **sampling}
        elif sampling.get("block_scope") is not None:
            sampling = {**rt.info.block_defaults, **sampling}
        sampling.setdefault("decoder", rt.info.default_decoder)
    steps = sampling.setdefault("steps", max(spec.canvas_tokens, 1))
    if steps > config.max_steps:
        raise RequestError(
            f"steps: must be <= {config.max_steps} (the daemon's max_steps), got {steps}", param="steps"
        )
    top_k = sampling.get("top_k")
    if isinstance(top_k, int) and top_k >= rt.info.vocab_size:
        sampling["top_k"] = top_k = 0  # keeping every token is no filtering, and lax.top_k needs k <= vocab
    if isinstance(top_k, int) and not isinstance(top_k, bool) and top_k > MAX_TOP_K:
        # One program serves every k up to the bound (a traced value); anything between is refused.
        raise RequestError(
            f"top_k: must be 0 (off), 1..{MAX_TOP_K}, or at least the vocabulary size "
            f"({rt.info.vocab_size}, also off); got {top_k}",
            param="top_k",
        )
    try:
        return SamplingParams(max_new_tokens=max(spec.canvas_tokens, 1), **sampling)
    except ParamError as exc:
        raise RequestError(str(exc), param=exc.field) from None


def _prompt_row(
    rt: RuntimeProtocol, spec: GenSpec, params: SamplingParams, config: Config
) -> tuple[CanvasRow, SamplingParams]:
    """A raw prompt (text or token ids): a canvas after it, or with ``canvas_tokens`` 0 its holes."""
    vocab = rt.info.vocab_size
    if spec.prompt_ids is not None:
        bad = next((t for t in spec.prompt_ids if t < 0 or t >= vocab), None)
        if bad is not None:
            raise RequestError(
                f"prompt: token id {bad} is outside the vocabulary (0..{vocab})", param="prompt"
            )
        prompt_ids = list(spec.prompt_ids)
    else:
        prompt_ids = rt.rows.encode_prompt(
            spec.prompt or "", holes=not spec.canvas_tokens and rt.info.supports_holes
        )
    if not prompt_ids:
        raise RequestError("prompt: must not be empty", param="prompt")
    if spec.canvas_tokens:
        return rt.rows.make_row(prompt_ids, spec.canvas_tokens, chat=False), params
    row, masks = rt.rows.make_holes_row(prompt_ids)
    if not decoders.get(params.decoder).fills_prompt_holes:
        raise RequestError(
            "decoder: holes inside the prompt need the reference decoder (the fast decoder "
            "only unmasks the canvas after the prompt)",
            param="decoder",
        )
    # Every mask is denoised together; steps default to one per mask, as for a canvas.
    changes: dict[str, Any] = {"max_new_tokens": row.canvas_tokens}
    if spec.sampling.steps is None:
        changes["steps"] = min(masks, config.max_steps)
    return row, dataclasses.replace(params, **changes)
