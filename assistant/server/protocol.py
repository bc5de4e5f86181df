"""Request parsing for the daemon's three API families, into one :class:`GenSpec` the engine understands.

Every check raises :class:`RequestError` with the HTTP status and a message that names the field and says
what is wrong, so bad input gets a 4xx and changes nothing else. The native ``/v1/diffu/*`` routes are
strict (an unknown field is an error: it is probably a typo of a sampling parameter); the OpenAI and
llama.cpp routes ignore fields they do not know, because real clients send many optional ones, but refuse
features we cannot honour (``n > 1``, logprobs, tools) rather than silently doing something else.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

# Re-exported: the routes read bodies and raise errors through this module.
from assistant.server.request_fields import (
    RequestError,
    bad_field,
    get_bool,
    get_float,
    get_int,
    get_str,
    reject_unknown,
)
from assistant.server.warmup import Shape
from assistant.wire import SamplingOptions
from model_runtime.options import OptionError, options
from model_runtime.params import ParamError, SamplingParams

# Sampling fields a request may set directly: every SamplingParams option but max_new_tokens, which each
# route names its own way (max_new_tokens / canvas_tokens / max_tokens / n_predict). Read from the
# declaration, so a knob the runtime gains is served without a change here.
_SAMPLING = {name: opt for name, opt in options(SamplingParams).items() if name != "max_new_tokens"}
SAMPLING_FIELDS = tuple(_SAMPLING)
MAX_STOP_STRINGS = 16
MAX_EXTRA_CHUNKS = 256
MAX_MESSAGES = 1024


@dataclass
class GenSpec:
    """What to generate, independent of the API it came through."""

    mode: str  # "chat" | "prompt" | "infill"
    canvas_tokens: int
    sampling: SamplingOptions  # the knobs the request set (None: unset, the daemon's defaults apply)
    messages: list[dict[str, str]] | None = None
    prompt: str | None = None
    prompt_ids: list[int] | None = None
    prefix: str = ""
    suffix: str = ""
    extra: list[tuple[str, str]] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    stop: list[str] = field(default_factory=list)
    max_seconds: float | None = None
    session: str | None = None
    n_indent: int = 0
    return_ids: bool = False  # the native routes' done body then carries the token ids too


def _sampling(data: dict[str, Any], *, temperature_default: float | None = None) -> SamplingOptions:
    """The sampling fields present in ``data``, each read and checked by its declaration (a bad one is
    a 400 naming it); :func:`check_sampling` then checks them together, as SamplingParams."""
    out: dict[str, Any] = {}
    for name, opt in _SAMPLING.items():
        if data.get(name) is None:
            continue
        try:
            out[name] = opt.read(data[name], json=True)
        except OptionError as exc:
            raise RequestError(str(exc), param=name) from None
    if "temperature" not in out and temperature_default is not None:
        out["temperature"] = temperature_default
    return SamplingOptions(**out)


def check_sampling(spec: GenSpec) -> GenSpec:
    """Validate ``spec.sampling`` as SamplingParams would (``steps`` defaults to one per canvas token)."""
    # A holes-only request (no canvas) gets its default once its masks are counted.
    if spec.canvas_tokens > 0 and spec.sampling.steps is None:
        spec.sampling = replace(spec.sampling, steps=spec.canvas_tokens)
    try:
        SamplingParams(max_new_tokens=max(spec.canvas_tokens, 1), **spec.sampling.body())
    except ParamError as exc:
        raise RequestError(str(exc), param=exc.field) from None
    return spec


def _messages(value: Any) -> list[dict[str, str]]:
    """Validate chat messages: an optional leading system message, then user/assistant turns ending in user.

    OpenAI's content-part arrays are accepted when every part is text; ``developer`` is OpenAI's newer
    name for ``system``.
    """
    if not isinstance(value, list) or not value:
        raise RequestError(
            "messages: expected a non-empty array of {role, content} objects", param="messages"
        )
    if len(value) > MAX_MESSAGES:
        raise RequestError(f"messages: at most {MAX_MESSAGES} messages, got {len(value)}", param="messages")
    out = []
    for i, msg in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise bad_field(where, "an object with role and content", msg)
        role = msg.get("role")
        if role == "developer":
            role = "system"
        if role not in ("system", "user", "assistant"):
            raise RequestError(
                f"{where}.role: expected 'system', 'user' or 'assistant', got {role!r}", param=f"{where}.role"
            )
        if role == "system" and i != 0:
            raise RequestError(f"{where}.role: a system message is only allowed first", param=f"{where}.role")
        content = msg.get("content")
        if isinstance(content, list):
            texts = []
            for j, part in enumerate(content):
                if not (
                    isinstance(part, dict)
                    and part.get("type") == "text"
                    and isinstance(part.get("text"), str)
                ):
                    raise RequestError(
                        f"{where}.content[{j}]: only text parts ({{type: 'text', text}}) are supported",
                        param=f"{where}.content",
                    )
                texts.append(part["text"])
            content = "".join(texts)
        if not isinstance(content, str):
            raise bad_field(f"{where}.content", "a string", content)
        out.append({"role": role, "content": content})
    if out[-1]["role"] != "user":
        raise RequestError("messages: the last message must come from the user", param="messages")
    return out


def _stop(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(s, str) and s for s in value):
        raise bad_field("stop", "a non-empty string or an array of them", value)
    if len(value) > MAX_STOP_STRINGS:
        raise RequestError(f"stop: at most {MAX_STOP_STRINGS} strings, got {len(value)}", param="stop")
    return value


def _refuse(data: dict[str, Any], name: str, ok: Any, message: str) -> None:
    value = data.get(name)
    if value is not None and value != ok and value is not False:
        raise RequestError(f"{name}: {message}", param=name, code="unsupported")


# -- native routes ------------------------------------------------------------------------------------
_NATIVE_COMMON = {"stream", "session", "max_seconds", "return_ids", *SAMPLING_FIELDS}


def _native_common(data: dict[str, Any], spec: GenSpec) -> GenSpec:
    spec.stream = get_bool(data, "stream", True)
    spec.return_ids = get_bool(data, "return_ids", False)
    spec.session = get_str(data, "session", max_len=200)
    spec.max_seconds = get_float(data, "max_seconds", lo=0.001)
    return check_sampling(spec)


def parse_native_generate(data: dict[str, Any], *, default_tokens: int) -> GenSpec:
    """``POST /v1/diffu/generate``: ``messages`` (chat template) or ``prompt`` (raw text), every knob."""
    reject_unknown(data, _NATIVE_COMMON | {"messages", "prompt", "max_new_tokens"}, "/v1/diffu/generate")
    has_messages, has_prompt = data.get("messages") is not None, data.get("prompt") is not None
    if has_messages == has_prompt:
        raise RequestError("give exactly one of messages (a chat) or prompt (raw text)")
    # 0 new tokens: only fill the <|mask|> holes of a raw prompt (checked once the prompt is tokenized).
    tokens = get_int(data, "max_new_tokens", default_tokens, lo=0)
    assert tokens is not None
    if tokens == 0 and has_messages:
        raise RequestError(
            "max_new_tokens: 0 is only for a raw prompt whose <|mask|> holes are to be filled",
            param="max_new_tokens",
        )
    spec = GenSpec(mode="chat" if has_messages else "prompt", canvas_tokens=tokens, sampling=_sampling(data))
    if has_messages:
        spec.messages = _messages(data["messages"])
    else:
        spec.prompt = get_str(data, "prompt")
    return _native_common(data, spec)


def parse_native_infill(data: dict[str, Any], *, default_tokens: int) -> GenSpec:
    """``POST /v1/diffu/infill``: ``prefix``, ``suffix``, ``canvas_tokens`` (the length of the hole)."""
    reject_unknown(data, _NATIVE_COMMON | {"prefix", "suffix", "canvas_tokens"}, "/v1/diffu/infill")
    tokens = get_int(data, "canvas_tokens", default_tokens, lo=1)
    assert tokens is not None
    spec = GenSpec(
        mode="infill",
        canvas_tokens=tokens,
        sampling=_sampling(data),
        prefix=get_str(data, "prefix", required=True) or "",
        suffix=get_str(data, "suffix", "") or "",
    )
    return _native_common(data, spec)


MAX_WARM_SHAPES = 16
_WARM_FIELDS = {"prompt_tokens", "max_new_tokens", "infill", "batch", *SAMPLING_FIELDS}


def parse_warm(data: dict[str, Any]) -> list[Shape]:
    """``POST /v1/diffu/warm``: ``{"shapes": [{prompt_tokens, max_new_tokens, infill, batch, and any
    sampling field of /v1/diffu/generate}]}``; a bad field is named with its shape's index."""
    reject_unknown(data, {"shapes"}, "/v1/diffu/warm")
    shapes = data.get("shapes")
    if not isinstance(shapes, list) or not shapes:
        raise RequestError(
            "shapes: expected a non-empty array of {prompt_tokens, max_new_tokens, ...} objects",
            param="shapes",
        )
    if len(shapes) > MAX_WARM_SHAPES:
        raise RequestError(
            f"shapes: at most {MAX_WARM_SHAPES} per request, got {len(shapes)}", param="shapes"
        )
    out = []
    for i, item in enumerate(shapes):
        try:
            out.append(_warm_shape(item))
        except RequestError as exc:
            raise in_shape(exc, i) from None
    return out


def in_shape(exc: RequestError, index: int) -> RequestError:
    """``exc`` about ``shapes[index]`` of a warm request."""
    where = f"shapes[{index}]"
    return RequestError(
        f"{where}.{exc}",
        status=exc.status,
        kind=exc.kind,
        code=exc.code,
        details=exc.details,
        param=f"{where}.{exc.param}" if exc.param else where,
    )


def _warm_shape(item: Any) -> Shape:
    if not isinstance(item, dict):
        raise bad_field("shape", "an object with prompt_tokens and max_new_tokens", item)
    reject_unknown(item, _WARM_FIELDS, "a warm shape")
    for name in ("prompt_tokens", "max_new_tokens"):
        if item.get(name) is None:
            raise RequestError(f"{name}: required", param=name)
    prompt_tokens = get_int(item, "prompt_tokens", lo=0) or 0
    tokens = get_int(item, "max_new_tokens", lo=1) or 1
    spec = GenSpec(mode="prompt", canvas_tokens=tokens, sampling=_sampling(item))
    check_sampling(spec)  # the same checks and defaults a request of this shape gets
    sampling = {k: v for k, v in spec.sampling.body().items() if k in item}
    return Shape(
        prompt_tokens,
        tokens,
        infill=get_bool(item, "infill", False),
        batch=get_int(item, "batch", 1, lo=1) or 1,
        sampling=sampling,
    )


# -- OpenAI routes ------------------------------------------------------------------------------------
def _openai_common(data: dict[str, Any], spec: GenSpec) -> GenSpec:
    _refuse(data, "n", 1, "only n=1 is supported")
    _refuse(data, "best_of", 1, "only best_of=1 is supported")
    _refuse(data, "logprobs", None, "logprobs are not supported by this server")
    _refuse(data, "top_logprobs", None, "logprobs are not supported by this server")
    _refuse(data, "echo", None, "echo is not supported by this server")
    _refuse(data, "tools", None, "tools are not supported by this server")
    _refuse(data, "functions", None, "function calling is not supported by this server")
    for name in ("presence_penalty", "frequency_penalty"):
        if get_float(data, name, 0.0) != 0.0:
            raise RequestError(
                f"{name}: penalties are not supported (a diffusion model has no token history "
                "to penalise); leave it 0",
                param=name,
                code="unsupported",
            )
    fmt = data.get("response_format")
    if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") != "text"):
        raise RequestError(
            'response_format: only {"type": "text"} is supported', param="response_format", code="unsupported"
        )
    get_str(data, "model")  # any name is accepted (clients insist on one), but it must be a string
    spec.stream = get_bool(data, "stream", False)
    options = data.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            raise bad_field("stream_options", "an object", options)
        spec.include_usage = get_bool(options, "include_usage", False)
    spec.stop = _stop(data.get("stop"))
    # A diffusion-specific time budget, like llama.cpp's t_max_predict_ms.
    spec.max_seconds = get_float(data, "max_seconds", lo=0.001)
    spec.session = get_str(data, "session", max_len=200)
    return check_sampling(spec)


def _max_tokens(data: dict[str, Any], default: int) -> int:
    value = get_int(data, "max_completion_tokens", lo=1)
    if value is None:
        value = get_int(data, "max_tokens", default, lo=1)
    assert value is not None
    return value


def parse_chat_completions(data: dict[str, Any], *, default_tokens: int) -> GenSpec:
    """``POST /v1/chat/completions``."""
    if "messages" not in data:
        raise RequestError("messages: required", param="messages")
    spec = GenSpec(
        mode="chat",
        canvas_tokens=_max_tokens(data, default_tokens),
        sampling=_sampling(data, temperature_default=0.0),
        messages=_messages(data["messages"]),
    )
    return _openai_common(data, spec)


def parse_completions(data: dict[str, Any], *, default_tokens: int, infill_tokens: int) -> GenSpec:
    """``POST /v1/completions``; a ``suffix`` makes it fill-in-the-middle."""
    prompt = data.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    suffix = get_str(data, "suffix")
    spec = GenSpec(
        mode="prompt" if suffix is None else "infill",
        canvas_tokens=_max_tokens(data, default_tokens if suffix is None else infill_tokens),
        sampling=_sampling(data, temperature_default=0.0),
    )
    if isinstance(prompt, str):
        spec.prompt = prompt
    elif (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    ):
        if suffix is not None:
            raise RequestError("prompt: token ids cannot be combined with suffix; send text", param="prompt")
        spec.prompt_ids = prompt
    elif prompt is None:
        raise RequestError("prompt: required", param="prompt")
    else:
        raise bad_field("prompt", "a string, an array of one string, or an array of token ids", prompt)
    if suffix is not None:
        spec.prefix, spec.suffix = spec.prompt or "", suffix
    return _openai_common(data, spec)


# -- llama.cpp /infill --------------------------------------------------------------------------------
def parse_llama_infill(data: dict[str, Any], *, default_tokens: int) -> GenSpec:
    """llama.cpp's ``POST /infill`` as llama.vim, llama.vscode and minuet-ai send it.

    ``prompt`` is text the middle must start with (appended to the prefix); ``input_extra`` chunks
    (``[{filename, text}]``, other files for context) go before the prefix; ``n_predict`` sizes the canvas
    (-1 or absent: the configured default); ``t_max_predict_ms`` is the time budget. llama.cpp-only knobs
    (cache_prompt, samplers, id_slot, ...) are accepted and ignored.
    """
    prefix = get_str(data, "input_prefix", "") or ""
    suffix = get_str(data, "input_suffix", "") or ""
    forced = get_str(data, "prompt", "") or ""
    extra_raw = data.get("input_extra") or []
    if not isinstance(extra_raw, list):
        raise bad_field("input_extra", "an array of {filename, text} objects", extra_raw)
    if len(extra_raw) > MAX_EXTRA_CHUNKS:
        raise RequestError(
            f"input_extra: at most {MAX_EXTRA_CHUNKS} chunks, got {len(extra_raw)}", param="input_extra"
        )
    extra = []
    for i, chunk in enumerate(extra_raw):
        if not isinstance(chunk, dict) or not isinstance(chunk.get("text"), str):
            raise RequestError(
                f"input_extra[{i}]: expected an object with a string text", param="input_extra"
            )
        filename = chunk.get("filename", "")
        if not isinstance(filename, str):
            raise bad_field(f"input_extra[{i}].filename", "a string", filename)
        extra.append((filename, chunk["text"]))
    n_predict = get_int(data, "n_predict", -1, lo=-1)
    if n_predict == 0:
        # llama.vim sends n_predict 0 to warm the KV cache of a prompt; there is no such cache here.
        n_predict = None
    tokens = default_tokens if n_predict in (-1, None) else n_predict
    assert tokens is not None
    t_max = get_int(data, "t_max_predict_ms", lo=0)
    spec = GenSpec(
        mode="infill",
        canvas_tokens=tokens,
        sampling=_sampling(data, temperature_default=0.0),
        prefix=prefix + forced,
        suffix=suffix,
        extra=extra,
        stream=get_bool(data, "stream", False),
        max_seconds=t_max / 1000 if t_max else None,
        n_indent=get_int(data, "n_indent", 0, lo=0) or 0,
    )
    spec.stop = _stop(data.get("stop"))
    check_sampling(spec)
    if n_predict is None:
        spec.canvas_tokens = 0  # the caller answers at once with empty content
    return spec


# -- post-processing shared by routes -----------------------------------------------------------------
def apply_stop(text: str, stop: list[str]) -> tuple[str, bool]:
    """Cut ``text`` at the earliest stop string; returns (text, whether it was cut)."""
    cuts = [i for i in (text.find(s) for s in stop) if i >= 0]
    return (text[: min(cuts)], True) if cuts else (text, False)


def apply_n_indent(text: str, n_indent: int) -> tuple[str, bool]:
    """llama.cpp's ``n_indent``: stop at a non-empty line (after the first) indented less than n_indent."""
    if n_indent <= 0:
        return text, False
    lines = text.split("\n")
    for i in range(1, len(lines)):
        line = lines[i]
        if line.strip() and len(line) - len(line.lstrip(" \t")) < n_indent:
            return "\n".join(lines[:i]) + "\n", True
    return text, False
