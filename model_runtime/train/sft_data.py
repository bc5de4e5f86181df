"""Conversations (``{"messages": [...]}`` JSONL, the Hugging Face chat format) -> fixed-length SFT rows.

Each conversation becomes one row of ``seq_len`` tokens, laid out as DiffuCoder-Instruct writes its
answers (dream-reference.md 1.2, 3.3)::

    [chat prompt of every turn before the last, ending "<|im_start|>assistant\\n"]   never masked
    [the last assistant turn] <|im_end|> <|dlm_pad|> <|dlm_pad|> ... up to seq_len    the response

The prompt is the chat template the runtime uses at inference (``DreamTokenizer.encode_chat``), so
training sees the same tokens a chat request does. The answer's end-of-turn and the padding after it
are response tokens: noised and scored like the answer, they teach the model where an answer ends
(models without ``<|dlm_pad|>`` in their tokenizer pad with ``<|endoftext|>``, as LLaDA's recipe does).
One conversation per row, no packing: the padding is the stop signal, and packing would remove it.

Rows are stored as ``.npy`` arrays (tokens and prompt lengths) beside a ``meta.json`` naming the data
file's hash and the tokenizer; the batch of a step is a pure function of ``(seed, step)``: an epoch-wise
permutation of the rows, so a resumed run sees exactly the batches the interrupted one would have.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from model_runtime.errors import InputError
from model_runtime.tokenizer import DreamTokenizer
from model_runtime.train.config import SFTOptions
from model_runtime.train.corpus import TokenShards

ROLES = ("system", "user", "assistant")
SHOWN_BAD_LINES = 20  # bad lines named one by one when skipping; the rest are counted
SFT_VERSION = 1


class BadLine(ValueError):
    """A data line that cannot become a training row; the message says why (without the line number)."""


def parse_line(text: str) -> list[dict[str, str]]:
    """The messages of one JSONL line, checked: roles, string contents, an assistant answer at the end."""
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadLine(f"not JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(record, dict) or not isinstance(record.get("messages"), list):
        raise BadLine('no "messages" list (each line must be {"messages": [{"role": ..., "content": ...}]})')
    messages = record["messages"]
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise BadLine(f"messages[{i}] is not an object")
        if msg.get("role") not in ROLES:
            raise BadLine(f"messages[{i}].role: expected one of {', '.join(ROLES)}, got {msg.get('role')!r}")
        if not isinstance(msg.get("content"), str):
            raise BadLine(f"messages[{i}].content: expected a string")
    if not any(msg["role"] == "assistant" for msg in messages):
        raise BadLine("no assistant turn: nothing to learn from")
    if messages[-1]["role"] != "assistant":
        raise BadLine(f"the last message is the {messages[-1]['role']}'s; it must be the assistant's answer")
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def pad_id(tok: DreamTokenizer) -> int:
    """What fills a row after the answer's end-of-turn: ``<|dlm_pad|>``, else ``<|endoftext|>``."""
    return tok.dlm_pad_id if tok.dlm_pad_id is not None else tok.eos_id


def encode_conversation(
    tok: DreamTokenizer, messages: list[dict[str, str]], seq_len: int
) -> tuple[list[int], int]:
    """(row ids of length ``seq_len``, prompt length) of checked messages; BadLine when it cannot fit."""
    if tok.im_end_id is None:
        raise InputError("the tokenizer has no <|im_end|> token: it cannot mark where an answer ends")
    try:
        prompt = tok.encode_chat(messages[:-1])
    except ValueError as exc:  # the template's own checks: a system turn in the middle, two answers ...
        raise BadLine(str(exc)) from None
    # The answer's text never becomes control tokens, as a user's message never does (encode_chat).
    answer = tok.encode_text(messages[-1]["content"]) + [tok.im_end_id]
    n = len(prompt) + len(answer)
    if n > seq_len:
        raise BadLine(
            f"prompt and answer are {n} tokens ({len(prompt)} + {len(answer)}), more than --seq-len {seq_len}"
        )
    return prompt + answer + [pad_id(tok)] * (seq_len - n), len(prompt)


def is_heldout_line(text: str, permille: int) -> bool:
    h = int.from_bytes(hashlib.sha256(text.strip().encode("utf-8")).digest()[:4], "big")
    return h % 1000 < permille


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with Path(path).open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@dataclass
class SFTRows:
    """Fixed-length SFT rows: ``tokens`` [N, L] and ``prompt_len`` [N]."""

    tokens: np.ndarray
    prompt_len: np.ndarray

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def batch(self, seed: int, step: int, batch_size: int) -> dict[str, np.ndarray]:
        """The batch of ``step``: rows ``step*B .. step*B+B-1`` of the epoch-wise permutations."""
        n = len(self)
        idx = step * batch_size + np.arange(batch_size)
        epochs, pos = idx // n, idx % n
        rows = np.empty(batch_size, np.int64)
        for e in np.unique(epochs):
            perm = np.random.default_rng([seed, int(e)]).permutation(n)
            rows[epochs == e] = perm[pos[epochs == e]]
        return {
            "tokens": self.tokens[rows].astype(np.int32),
            "prompt_len": self.prompt_len[rows].astype(np.int32),
        }


@dataclass
class MixedRows:
    """SFT rows with pre-training code windows mixed in (``--mix-code``): ``round(B * share)`` rows of each
    batch are windows of a code corpus with ``prompt_len`` 0, so every position but the first may be
    noised, as in pre-training. One bundled model serves chat, raw completion and editor infill; without
    this replay, instruction tuning alone makes it forget raw code (docs/training.md has the figures).
    Not part of DiffuCoder's recipe, whose instruct model only chats: off unless asked for.
    """

    sft: SFTRows
    code: TokenShards
    share: float

    def batch(self, seed: int, step: int, batch_size: int) -> dict[str, np.ndarray]:
        n_code = int(round(batch_size * self.share))
        out = self.sft.batch(seed, step, batch_size - n_code)
        if n_code:
            # Its own stream (seed + 1): the SFT rows of a step do not depend on the share.
            windows = self.code.batch(seed + 1, step, n_code)
            out = {
                "tokens": np.concatenate([out["tokens"], windows]),
                "prompt_len": np.concatenate([out["prompt_len"], np.zeros(n_code, np.int32)]),
            }
        return out


def build_rows(
    data: Path,
    tok: DreamTokenizer,
    seq_len: int,
    options: SFTOptions,
    log: Callable[[str], None] = print,
) -> tuple[dict[str, SFTRows], dict[str, Any]]:
    """Read and check every line of ``data``; returns ({"train": rows, "heldout": rows}, facts)."""
    rows: dict[str, tuple[list[list[int]], list[int]]] = {"train": ([], []), "heldout": ([], [])}
    bad: list[str] = []
    with Path(data).open(encoding="utf-8", errors="replace") as f:
        for number, text in enumerate(f, 1):
            if not text.strip():
                continue  # blank lines (a trailing newline, spacing) are not records
            try:
                ids, n_prompt = encode_conversation(tok, parse_line(text), seq_len)
            except BadLine as exc:
                where = f"{data}: line {number}: {exc}"
                if options.on_bad_line == "stop":
                    raise InputError(f"{where} (--on-bad-line skip leaves such lines out)") from None
                if len(bad) < SHOWN_BAD_LINES:
                    log(f"{where}; skipped")
                bad.append(f"line {number}: {exc}")
                continue
            split = "heldout" if is_heldout_line(text, options.heldout_permille) else "train"
            rows[split][0].append(ids)
            rows[split][1].append(n_prompt)
    if len(bad) > SHOWN_BAD_LINES:
        log(f"{data}: {len(bad) - SHOWN_BAD_LINES} more bad lines skipped")
    if not rows["train"][0]:
        raise InputError(f"{data}: no usable conversation for training")
    dtype = np.uint16 if tok.vocab_size <= 1 << 16 else np.uint32
    out = {
        split: SFTRows(np.asarray(ids, dtype).reshape(-1, seq_len), np.asarray(plen, np.int32))
        for split, (ids, plen) in rows.items()
    }
    train = out["train"]
    response = np.arange(seq_len)[None, :] >= train.prompt_len[:, None]
    answer = response & (train.tokens != pad_id(tok))
    facts = {
        "conversations": len(train),
        "heldout_conversations": len(out["heldout"]),
        "skipped_lines": len(bad),
        "skipped": bad[:SHOWN_BAD_LINES],
        "prompt_tokens_mean": float(train.prompt_len.mean()),
        "answer_tokens_mean": float(answer.sum(axis=1).mean()),  # with <|im_end|>, without padding
    }
    return out, facts


def prepare(
    out_dir: Path,
    data: Path,
    tok: DreamTokenizer,
    tokenizer_id: str,
    seq_len: int,
    options: SFTOptions,
    log: Callable[[str], None] = print,
) -> tuple[dict[str, SFTRows], dict[str, Any]]:
    """Rows of ``data`` in ``out_dir``: built once, then reused while the data file and settings match."""
    out_dir = Path(out_dir)
    if not Path(data).is_file():
        raise InputError(f"SFT data {data} is not a file")
    want = {
        "version": SFT_VERSION,
        "data_sha256": file_sha256(data),
        "tokenizer": tokenizer_id,
        "seq_len": seq_len,
        "heldout_permille": options.heldout_permille,
        "on_bad_line": options.on_bad_line,
    }
    meta_path = out_dir / "meta.json"
    if meta_path.is_file():
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        if {k: meta.get(k) for k in want} == want:
            split = {
                s: SFTRows(np.load(out_dir / f"{s}.npy"), np.load(out_dir / f"{s}-prompt.npy"))
                for s in ("train", "heldout")
            }
            return split, meta["facts"]
    split, facts = build_rows(data, tok, seq_len, options, log)
    out_dir.mkdir(parents=True, exist_ok=True)
    meta_path.unlink(missing_ok=True)  # written last: its presence marks complete rows
    for name, rows in split.items():
        np.save(out_dir / f"{name}.npy", rows.tokens)
        np.save(out_dir / f"{name}-prompt.npy", rows.prompt_len)
    meta_path.write_text(
        json.dumps(want | {"data": str(data), "facts": facts}, indent=1) + "\n", encoding="utf-8"
    )
    return split, facts
