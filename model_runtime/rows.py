"""Canvas rows and how they are built from prompts: plain generation, infill, infill with other files,
prompt holes.

Every runtime builds rows the same way from its tokenizer, so the logic lives once here, in the row
builder each runtime hands out as ``runtime.rows`` (the real runtime, the fake one and the multi-host
leader, which hands out the one of the runtime it wraps). Plain Python (no JAX): the daemon builds rows in
worker threads while the device runs other batches, and clients import this module.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from model_runtime.errors import InputError
from model_runtime.params import SamplingParams

# Qwen2.5-Coder's repository layout, which DiffuCoder's tokenizer still carries: ``<|file_sep|>name\ntext``
# per other file, then ``<|file_sep|>\n`` and the edited file.
FILE_SEP = "<|file_sep|>"


@dataclass(frozen=True)
class CanvasRow:
    """One row of a batch: its token ids (prompt and masks, no padding) and the region to report.

    For plain generation the region is the ``max_new_tokens`` masks appended after the prompt; for
    infill it is the masks between prefix and suffix; for a prompt with ``<|mask|>`` holes it spans the
    first hole to the last. ``chat`` picks the stop tokens of the answer. ``seed`` is the row's own PRNG
    seed (its request's), so rows with different seeds share a batch and each draws as it would alone;
    None takes the batch's ``params.seed``.
    """

    ids: tuple[int, ...]
    region: tuple[int, int]
    chat: bool = False
    seed: int | None = None

    def seed_for(self, params: SamplingParams) -> int:
        """The seed this row samples with in a batch run with ``params``."""
        return params.seed if self.seed is None else self.seed

    @property
    def canvas_tokens(self) -> int:
        """Positions in the reported region."""
        return self.region[1] - self.region[0]


@runtime_checkable
class TokenizerProtocol(Protocol):
    """What serving needs of a tokenizer: text to ids and back, the chat template, and the special ids."""

    @property
    def mask_id(self) -> int: ...

    @property
    def eos_id(self) -> int: ...

    @property
    def pad_id(self) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def encode_text(self, text: str) -> list[int]:
        """Ids of text people wrote: control-token strings in it stay text, never control tokens."""
        ...

    def encode_chat(self, messages: Sequence[dict[str, str]]) -> list[int]:
        """The ids of a chat prompt (the model's template); ValueError for messages it cannot template."""
        ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def token_strings(self, ids: Sequence[int]) -> list[str]:
        """One printable piece per id (step events render canvases from them)."""
        ...

    def stop_ids(self, *, chat: bool) -> tuple[int, ...]:
        """The ids an answer is cut at."""
        ...


class CanvasBuilder:
    """Rows for one model: its tokenizer, and its context (the longest row it runs, in tokens), which
    bounds how many other files an infill row takes in."""

    def __init__(self, tokenizer: TokenizerProtocol, max_context: int) -> None:
        self.tokenizer = tokenizer
        self.max_context = max_context

    def encode_chat(self, messages: Sequence[dict[str, str]]) -> list[int]:
        """The chat prompt's ids; messages the template refuses are an InputError."""
        try:
            return self.tokenizer.encode_chat(messages)
        except ValueError as exc:
            raise InputError(str(exc)) from None

    def encode_prompt(self, text: str, *, holes: bool = False) -> list[int]:
        """A raw prompt's ids. Its text stays text: a file being edited that holds ``<|endoftext|>`` or
        ``<|im_end|>`` cannot inject them. With ``holes`` (a request to fill the prompt's holes, and a
        runtime whose tokenizer has the mask token) each ``<|mask|>`` in it is the mask token; token ids
        sent as the prompt are the way to ask for any other control token."""
        tok = self.tokenizer
        if not holes:
            return tok.encode_text(text)
        ids: list[int] = []
        for i, piece in enumerate(text.split(tok.decode([tok.mask_id]))):
            ids += ([tok.mask_id] if i else []) + tok.encode_text(piece)
        return ids

    def make_row(self, prompt_ids: Sequence[int], max_new_tokens: int, *, chat: bool) -> CanvasRow:
        """``prompt + <|mask|> * max_new_tokens``: plain generation (chat or raw)."""
        ids = tuple(int(i) for i in prompt_ids) + (self.tokenizer.mask_id,) * max_new_tokens
        return CanvasRow(ids, (len(prompt_ids), len(ids)), chat)

    def make_infill_row(self, prefix: str, suffix: str, canvas_tokens: int) -> CanvasRow:
        """``prefix + <|mask|> * canvas_tokens + suffix``: the model fills the middle. Prefix and suffix
        are text (control-token strings in them stay text)."""
        tok = self.tokenizer
        return self._infill_row(tok.encode_text(prefix), tok.encode_text(suffix), canvas_tokens)

    def _infill_row(self, pre: Sequence[int], suf: Sequence[int], canvas_tokens: int) -> CanvasRow:
        if canvas_tokens < 1:
            raise InputError(f"canvas_tokens: must be >= 1, got {canvas_tokens}", field="canvas_tokens")
        ids = tuple(pre) + (self.tokenizer.mask_id,) * canvas_tokens + tuple(suf)
        return CanvasRow(ids, (len(pre), len(pre) + canvas_tokens), chat=False)

    def make_repo_infill_row(
        self, prefix: str, suffix: str, canvas_tokens: int, files: Sequence[tuple[str, str]]
    ) -> tuple[CanvasRow, bool]:
        """An infill row with other files (``(name, text)``, oldest first) in front, as many as fit.

        Returns the row and whether files were dropped. When they do not all fit the context the newest
        are kept: llama.vim appends to its ring buffer, so the last chunk is the latest. The separators
        are the layout's own token; names and texts are text. Each chunk starts with a separator token,
        which no merge crosses, so the chunks' ids add up to the row's exactly.
        """
        tok = self.tokenizer
        suf = tok.encode_text(suffix)
        if not files:
            return self._infill_row(tok.encode_text(prefix), suf, canvas_tokens), False
        sep = tok.encode(FILE_SEP)
        tail = sep + tok.encode_text(f"\n{prefix}")
        budget = self.max_context - len(tail) - canvas_tokens - len(suf)
        kept: list[list[int]] = []
        for name, text in reversed(files):  # each chunk is tokenized once, newest first
            chunk = sep + tok.encode_text(f"{name}\n{text}")
            if len(chunk) > budget:
                break
            budget -= len(chunk)
            kept.insert(0, chunk)
        if not kept:
            return self._infill_row(tok.encode_text(prefix), suf, canvas_tokens), True
        pre = [i for chunk in kept for i in chunk] + tail
        return self._infill_row(pre, suf, canvas_tokens), len(kept) < len(files)

    def make_holes_row(self, prompt_ids: Sequence[int]) -> tuple[CanvasRow, int]:
        """A row whose region spans the prompt's ``<|mask|>`` holes, first to last, with no canvas after.

        Only masked positions are ever committed, so the text between holes stays as it is. Returns the
        row and its number of masks.
        """
        runs = mask_runs(prompt_ids, self.tokenizer.mask_id)
        if not runs:
            raise InputError(
                "max_new_tokens: 0 asks to fill the prompt's <|mask|> holes, but the prompt has none",
                field="max_new_tokens",
            )
        row = self.make_row(prompt_ids, 0, chat=False)
        return dataclasses.replace(row, region=(runs[0][0], runs[-1][1])), sum(b - a for a, b in runs)

    def hole_fills(self, row: CanvasRow, region_ids: Sequence[int]) -> list[str]:
        """One text per run of masks in ``row``'s region, each cut at its first stop token or leftover
        mask; ``region_ids`` is the region after denoising."""
        tok = self.tokenizer
        stops = set(tok.stop_ids(chat=False)) | {tok.mask_id}
        lo, hi = row.region
        fills = []
        for a, b in mask_runs(row.ids[lo:hi], tok.mask_id):
            ids = list(region_ids[a:b])
            cut = next((k for k, t in enumerate(ids) if t in stops), len(ids))
            fills.append(tok.decode(ids[:cut]))
        return fills


def mask_runs(ids: Sequence[int], mask_id: int) -> list[tuple[int, int]]:
    """[start, end) of each maximal run of ``mask_id`` in ``ids``."""
    runs: list[tuple[int, int]] = []
    for i, t in enumerate(ids):
        if t == mask_id:
            if runs and runs[-1][1] == i:
                runs[-1] = (runs[-1][0], i + 1)
            else:
                runs.append((i, i + 1))
    return runs
