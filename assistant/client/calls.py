"""The call table: every call of the daemon's API, written once for the sync and the async client.

Each entry is a function with the call's public signature and docstring that says what to send and how
to read the answer: a :class:`Call` (one JSON request, its result parsed) or a :class:`Stream` (a POST
whose SSE events are parsed into ``Step``, ``Waiting`` and ``Done``). ``Client`` and ``AsyncClient`` turn
each entry into a method with :func:`method` (their own ``call``/``events`` do the waiting, blocking or
awaiting), so adding a call is one entry here and one line in each client, and a signature can never
differ between the two.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from assistant.client.core import APIError, Done, Step, Waiting, WarmShape, parse_done
from assistant.daemon_status import DaemonStatus, ModelList
from assistant.wire import SamplingOptions

T = TypeVar("T")
Event = Step | Waiting | Done


@dataclass(frozen=True)
class Call(Generic[T]):
    """One JSON request and how to read its answer. ``if_not_found``: the result of a 404 (the call
    asks about something that may be gone, e.g. a finished request), instead of an ``APIError``."""

    method: str
    path: str
    body: dict[str, Any] | None
    read: Callable[[Any], T]
    if_not_found: T | None = None


@dataclass(frozen=True)
class Stream:
    """A POST answered with an SSE stream of step events and a final ``done``."""

    path: str
    body: dict[str, Any]


def _json(data: Any) -> dict[str, Any]:
    return dict(data)


# -- the table ------------------------------------------------------------------------------------------
def status() -> Call[DaemonStatus]:
    """The daemon's ``/v1/diffu/status``: model, device, buckets, queue, counters, limits."""
    return Call("GET", "/v1/diffu/status", None, DaemonStatus.from_dict)


def models() -> Call[ModelList]:
    """OpenAI's ``/v1/models``: the one model this daemon serves."""
    return Call("GET", "/v1/models", None, ModelList.from_dict)


def warm(shapes: list[WarmShape]) -> Call[dict[str, Any]]:
    """Have the daemon compile the programs of ``shapes`` ahead of its generic warm-up; it answers at
    once (``queued``, the indices of shapes already ``compiled``, ``eta_seconds``) and compiles in the
    background, between requests."""
    return Call("POST", "/v1/diffu/warm", warm_body(shapes), _json)


def cancel(request_id: str) -> Call[bool]:
    """Cancel a queued or running request; False when there is no such request (any more)."""
    return Call("POST", "/v1/diffu/cancel", {"id": request_id}, _cancelled, if_not_found=False)


def _cancelled(data: Any) -> bool:
    return bool(data.get("cancelled"))


def tokenize(content: str) -> Call[list[int]]:
    """The token ids of ``content`` as the model's tokenizer reads a prompt's text (llama.cpp's
    ``/tokenize``): what the text costs against the context, counted where the tokenizer is."""
    return Call("POST", "/tokenize", {"content": content}, _tokens)


def _tokens(data: Any) -> list[int]:
    return [int(t) for t in data["tokens"]]


def generate(
    *,
    messages: list[dict[str, str]] | None = None,
    prompt: str | None = None,
    max_new_tokens: int | None = None,
    sampling: SamplingOptions | None = None,
    session: str | None = None,
    max_seconds: float | None = None,
) -> Call[Done]:
    """A chat answer (``messages``) or a continuation of a raw ``prompt``, as one Done."""
    body = generate_body(messages, prompt, max_new_tokens, sampling, session, max_seconds, stream=False)
    return Call("POST", "/v1/diffu/generate", body, parse_done)


def stream_generate(
    *,
    messages: list[dict[str, str]] | None = None,
    prompt: str | None = None,
    max_new_tokens: int | None = None,
    sampling: SamplingOptions | None = None,
    session: str | None = None,
    max_seconds: float | None = None,
    return_ids: bool = False,
) -> Stream:
    """Step events (a Waiting first while its programs compile) then one Done (with ``return_ids``,
    carrying the token ids). Leaving the loop early closes the stream, which cancels the job."""
    body = generate_body(
        messages, prompt, max_new_tokens, sampling, session, max_seconds, stream=True, return_ids=return_ids
    )
    return Stream("/v1/diffu/generate", body)


def infill(
    prefix: str,
    suffix: str = "",
    *,
    canvas_tokens: int | None = None,
    sampling: SamplingOptions | None = None,
    session: str | None = None,
    max_seconds: float | None = None,
) -> Call[Done]:
    """The ``canvas_tokens`` between ``prefix`` and ``suffix``, as one Done."""
    body = infill_body(prefix, suffix, canvas_tokens, sampling, session, max_seconds, stream=False)
    return Call("POST", "/v1/diffu/infill", body, parse_done)


def stream_infill(
    prefix: str,
    suffix: str = "",
    *,
    canvas_tokens: int | None = None,
    sampling: SamplingOptions | None = None,
    session: str | None = None,
    max_seconds: float | None = None,
    return_ids: bool = False,
) -> Stream:
    """An infill's step events then one Done, as :func:`stream_generate`."""
    body = infill_body(
        prefix, suffix, canvas_tokens, sampling, session, max_seconds, stream=True, return_ids=return_ids
    )
    return Stream("/v1/diffu/infill", body)


def chat_completions(
    messages: list[dict[str, Any]],
    *,
    max_tokens: int | None = None,
    sampling: SamplingOptions | None = None,
    stop: list[str] | None = None,
) -> Call[dict[str, Any]]:
    """OpenAI's ``/v1/chat/completions``, not streamed: the response object as it comes."""
    body = openai_body(("messages", messages), max_tokens, sampling, stop)
    return Call("POST", "/v1/chat/completions", body, _json)


def completions(
    prompt: str,
    *,
    max_tokens: int | None = None,
    suffix: str | None = None,
    sampling: SamplingOptions | None = None,
    stop: list[str] | None = None,
) -> Call[dict[str, Any]]:
    """OpenAI's ``/v1/completions`` (``suffix``: fill in the middle), not streamed."""
    body = openai_body(("prompt", prompt), max_tokens, sampling, stop, suffix=suffix)
    return Call("POST", "/v1/completions", body, _json)


# -- request bodies -------------------------------------------------------------------------------------
def generate_body(
    messages: list[dict[str, str]] | None,
    prompt: str | None,
    max_new_tokens: int | None,
    sampling: SamplingOptions | None,
    session: str | None,
    max_seconds: float | None,
    *,
    stream: bool,
    return_ids: bool = False,
) -> dict[str, Any]:
    body = _common_body(sampling, session, max_seconds, stream=stream, return_ids=return_ids)
    if max_new_tokens is not None:
        body["max_new_tokens"] = max_new_tokens
    if messages is not None:
        body["messages"] = messages
    if prompt is not None:
        body["prompt"] = prompt
    return body


def infill_body(
    prefix: str,
    suffix: str,
    canvas_tokens: int | None,
    sampling: SamplingOptions | None,
    session: str | None,
    max_seconds: float | None,
    *,
    stream: bool,
    return_ids: bool = False,
) -> dict[str, Any]:
    common = _common_body(sampling, session, max_seconds, stream=stream, return_ids=return_ids)
    body = {"prefix": prefix, "suffix": suffix, **common}
    if canvas_tokens is not None:
        body["canvas_tokens"] = canvas_tokens
    return body


def _common_body(
    sampling: SamplingOptions | None,
    session: str | None,
    max_seconds: float | None,
    *,
    stream: bool,
    return_ids: bool = False,
) -> dict[str, Any]:
    body: dict[str, Any] = sampling.body() if sampling is not None else {}
    if return_ids:
        body["return_ids"] = True
    if session is not None:
        body["session"] = session  # a newer request of the same session supersedes this one
    if max_seconds is not None:
        body["max_seconds"] = max_seconds
    body["stream"] = stream
    return body


def warm_body(shapes: list[WarmShape]) -> dict[str, Any]:
    return {"shapes": [shape.body() for shape in shapes]}


def openai_body(
    first: tuple[str, Any],
    max_tokens: int | None,
    sampling: SamplingOptions | None,
    stop: list[str] | None,
    **extra: str | None,
) -> dict[str, Any]:
    """A non-streamed OpenAI request: ``first`` is (``messages``, ...) or (``prompt``, ...)."""
    body: dict[str, Any] = {first[0]: first[1], **(sampling.body() if sampling is not None else {})}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    if stop is not None:
        body["stop"] = stop
    body.update({k: v for k, v in extra.items() if v is not None})
    body["stream"] = False
    return body


# -- entries into methods ---------------------------------------------------------------------------------
def named_like(entry: Callable[..., Any], impl: Callable[..., Any], owner: str, returns: Any = None) -> None:
    """Give ``impl`` (the method of class ``owner`` made from ``entry``) the entry's name, docstring and
    signature with ``self`` in front, so ``help(Client.generate)`` and editors show the call as it is.
    It returns ``returns``, or for a :class:`Call` entry what the call reads (``Call[Done]``: ``Done``)."""
    signature = inspect.signature(entry)
    if returns is None:
        (returns,) = typing.get_args(typing.get_type_hints(entry)["return"])
    own = inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY)
    impl.__name__ = entry.__name__
    impl.__qualname__ = f"{owner}.{entry.__name__}"
    impl.__doc__ = entry.__doc__
    parameters = [own, *signature.parameters.values()]
    impl.__signature__ = signature.replace(parameters=parameters, return_annotation=returns)  # type: ignore[attr-defined]


def answer(call: Call[T], exc: APIError) -> T:
    """The result of ``call`` that failed with ``exc``: its ``if_not_found`` for a 404, else ``exc``."""
    if exc.status == 404 and call.if_not_found is not None:
        return call.if_not_found
    raise exc
