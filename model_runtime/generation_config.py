"""What a model directory's ``generation_config.json`` says about generating with it.

What is read, all checked and all optional:

- ``diffu_decoder``: the decoder the model recommends (``reference``, ``fast`` or ``sliding``); published
  checkpoints carry no such key and get the reference decoder. ``scripts/decoder_quality.py --record``
  and ``scripts/sft_heldout.py --record`` write it where they measured the fast one writing better code.
- ``diffu_one_line``: the sampling knobs a request whose answer is one line (``max_lines`` 1: an editor
  finishing the cursor's line, the single-line infilling benchmarks) gets when it names no decoder, e.g.
  ``{"decoder": "sliding", "window": 8}`` (the bundled model's, chosen on held-out lines:
  docs/performance.md); absent, such a request gets ``diffu_decoder`` like any other.
- ``diffu_block``: the same for a request whose answer ends where its code leaves a block
  (``block_scope``: an editor's block and empty-line suggestions).
- ``diffu_editor_context``: the longest row in tokens (prompt and canvas) an editor's suggestion takes when
  its user sets no prompt budget (``diffu lsp``'s ``contextTokens``): where more context buys no quality,
  a shorter row is a faster first forward. The bundled model's 512 was measured with
  ``scripts/repo_infill.py --budgets``: no loss against 1,024 (docs/editors.md).
- ``diffu_chat``: the decoder of the model's chat, with its knobs (``{"decoder": "sliding", "window": 64,
  "commit_rule": "credit"}``, the bundled model's, chosen on held-out chat requests): ``diffu chat``
  layers them over the chat defaults below (a chat's settings name their decoder, so no key of the
  daemon's applies to them).
- the chat defaults: the sampling knobs a chat with this model starts from, under their Hugging Face /
  Dream ``generation_config.json`` names (``max_new_tokens``, ``steps``, ``temperature``, ``top_p``,
  ``top_k``, ``alg``, ``alg_temp``) and diffu's fast-decoder ones (``block_length``, ``threshold``).
  ``diffu chat`` layers them under the user's own settings (config.toml, the settings screen).
  Among them the chat's own ``retry_block`` (0 or absent: never): when an answer's python block
  does not parse, the chat decodes it once more with the fast decoder in blocks this long, on the canvas
  rounded up to whole blocks (:func:`retry_request`). ``scripts/sft_heldout.py`` measures it.

A value that SamplingParams would refuse is an error naming the key: a model should not start with
settings that every request would then fail on.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from model_runtime.errors import ModelError
from model_runtime.params import BLOCK_LENGTHS, DECODERS, ParamError, SamplingParams

CHAT_KEYS = (
    "max_new_tokens",
    "steps",
    "temperature",
    "top_p",
    "top_k",
    "alg",
    "alg_temp",
    "block_length",
    "window",
    "threshold",
)
RETRY_KEY = "retry_block"
ONE_LINE_KEY = "diffu_one_line"
BLOCK_KEY = "diffu_block"
CHAT_DECODER_KEY = "diffu_chat"
EDITOR_CONTEXT_KEY = "diffu_editor_context"


def _read(model_dir: str | Path) -> dict[str, Any]:
    path = Path(model_dir) / "generation_config.json"
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelError(f"generation_config.json: cannot read it as a JSON object ({exc})") from None
    except RecursionError:
        raise ModelError("generation_config.json: nested too deep to be a generation config") from None
    if not isinstance(data, dict):
        raise ModelError("generation_config.json: cannot read it as a JSON object (not an object)")
    return data


def recommended_decoder(model_dir: str | Path) -> str:
    """``diffu_decoder`` of the model's generation_config.json, else ``reference``."""
    value = _read(model_dir).get("diffu_decoder", "reference")
    if value not in DECODERS:
        raise ModelError(
            f"generation_config.json: diffu_decoder must be one of {', '.join(DECODERS)}, got {value!r}"
        )
    return value


def knobs_of(model_dir: str | Path, key: str) -> dict[str, Any]:
    """The sampling knobs (by name) of ``key`` in the model's generation_config.json (``diffu_one_line``,
    ``diffu_block``, ``diffu_chat``), else {}; an object SamplingParams refuses is an error naming it."""
    value = _read(model_dir).get(key, {})
    if not isinstance(value, dict):
        raise ModelError(f"generation_config.json: {key} must be an object, got {value!r}")
    try:
        SamplingParams(**value)
    except (ParamError, TypeError) as exc:
        raise ModelError(f"generation_config.json: {key}: {exc}") from None
    return dict(value)


def one_line_defaults(model_dir: str | Path) -> dict[str, Any]:
    """``diffu_one_line``: what a one-line request that names no decoder gets."""
    return knobs_of(model_dir, ONE_LINE_KEY)


def block_defaults(model_dir: str | Path) -> dict[str, Any]:
    """``diffu_block``: what a request with a ``block_scope`` that names no decoder gets."""
    return knobs_of(model_dir, BLOCK_KEY)


def chat_decoder(model_dir: str | Path) -> dict[str, Any]:
    """``diffu_chat``: the decoder and its knobs a chat with the model takes."""
    return knobs_of(model_dir, CHAT_DECODER_KEY)


def editor_context(model_dir: str | Path) -> int | None:
    """``diffu_editor_context``: the editors' prompt budget the model recommends, else None."""
    value = _read(model_dir).get(EDITOR_CONTEXT_KEY)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 16:
        raise ModelError(
            f"generation_config.json: {EDITOR_CONTEXT_KEY} must be an integer >= 16, got {value!r}"
        )
    return value


def chat_defaults(model_dir: str | Path) -> dict[str, Any]:
    """The chat knobs the model's generation_config.json sets (unset and null keys are left out)."""
    data = _read(model_dir)
    knobs = {k: data[k] for k in CHAT_KEYS if data.get(k) is not None}
    try:
        # max_new_tokens and steps go together in SamplingParams (steps <= max_new_tokens): check as a pair.
        tokens = knobs.get("max_new_tokens", max(knobs.get("steps", 1), 1))
        SamplingParams(**{"max_new_tokens": tokens, "steps": knobs.get("steps", tokens)} | knobs)
    except (ParamError, TypeError) as exc:
        raise ModelError(f"generation_config.json: {exc}") from None
    retry = data.get(RETRY_KEY)
    if retry is not None:
        problem = retry_block_problem(retry)
        if problem:
            raise ModelError(f"generation_config.json: {RETRY_KEY} {problem}")
        knobs[RETRY_KEY] = retry
    return knobs


def retry_block_problem(value: Any) -> str:
    """What is wrong with a ``retry_block`` value ("" when nothing is): 0 (never) or a block length."""
    if not isinstance(value, bool) and isinstance(value, int) and (value == 0 or value in BLOCK_LENGTHS):
        return ""
    return f"must be 0 (never) or one of {', '.join(map(str, BLOCK_LENGTHS))}; got {value!r}"


def retry_request(max_new_tokens: int, steps: int | None, block: int) -> dict[str, Any]:
    """The request fields that change in the chat's second decode in blocks of ``block``: the fast
    decoder, ``max_new_tokens`` rounded up to whole blocks, and ``steps`` (None: one per token) scaled
    with it. The chat (``ChatSettings.retry_settings``) and the daemon's warm-up both take them from here."""
    canvas = -(-max_new_tokens // block) * block
    if steps is not None:
        steps = min(canvas, max(1, round(steps * canvas / max_new_tokens)))
    return {"decoder": "fast", "block_length": block, "max_new_tokens": canvas, "steps": steps}
