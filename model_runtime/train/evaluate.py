"""Held-out evaluation: diffusion loss, masked-token accuracy at fixed mask rates, single-line infill.

All three run on files the trainer never saw (the corpus's held-out split) with fixed seeds, so numbers
from different checkpoints of one run are comparable. Each metric comes with the trivial baseline a
model must beat: always predicting the most frequent training token (masked accuracy) or always writing
the most frequent training line (infill).

Single-line infill: hide one non-empty line of a held-out file; the model sees up to ``prefix_tokens``
tokens before it and ``suffix_tokens`` after it, with exactly as many ``<|mask|>`` tokens as the line
has; it fills them greedily, one token per step, most confident position first (``maskgit_plus`` at
temperature 0, the commit rule of ``diffu generate --alg maskgit_plus``); an exact match is the decoded
canvas equal to the line, both stripped of surrounding whitespace.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from model_runtime.model import shift_logits
from model_runtime.tokenizer import DreamTokenizer
from model_runtime.train.objective import add_noise, mask_at_rate, token_losses

DEFAULT_MASK_RATES = (0.15, 0.5, 0.9)


@dataclass(frozen=True)
class InfillCase:
    path: str
    line: str  # the hidden line, as in the file (indentation kept, newline dropped)
    prefix: tuple[int, ...]
    middle: tuple[int, ...]
    suffix: tuple[int, ...]


@dataclass(frozen=True)
class EvalSet:
    """Fixed held-out material: token windows for loss/accuracy, and infill cases."""

    windows: np.ndarray  # [N, L] int32
    cases: tuple[InfillCase, ...]
    top_token: int
    top_line: str
    # SFT rows: positions before prompt_len are the prompt, never masked nor scored ([N] int32).
    prompt_len: np.ndarray | None = None


def heldout_windows(tokens: np.ndarray, seq_len: int, max_windows: int) -> np.ndarray:
    """Non-overlapping ``seq_len`` windows spread evenly over the held-out token stream."""
    n = tokens.size // seq_len
    if n == 0:
        return np.zeros((0, seq_len), np.int32)
    take = np.linspace(0, n - 1, num=min(n, max_windows)).astype(np.int64)
    return np.stack([tokens[i * seq_len : (i + 1) * seq_len] for i in take]).astype(np.int32)


def infill_cases(
    tok: DreamTokenizer,
    texts: Sequence[tuple[str, str]],
    n_cases: int,
    *,
    prefix_tokens: int = 128,
    suffix_tokens: int = 64,
    max_line_tokens: int = 32,
    seed: int = 0,
) -> list[InfillCase]:
    """``n_cases`` lines drawn uniformly (fixed seed) from all non-empty held-out lines that are at most
    ``max_line_tokens`` tokens long, with their token windows."""
    candidates: list[tuple[int, int]] = []
    split = [text.split("\n") for _, text in texts]
    for f, lines in enumerate(split):
        candidates += [(f, i) for i, line in enumerate(lines) if line.strip()]
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(candidates))
    cases: list[InfillCase] = []
    for j in order:
        if len(cases) == n_cases:
            break
        f, i = candidates[j]
        lines = split[f]
        # The hidden span is the line *with* its newline: byte-level BPE merges a line's last symbols
        # with the newline (``):\n``, ``\"\"\"\n``), so cutting before the newline would ask for token
        # boundaries the model never sees in running text (nor does an editor's infill at a line end).
        last = i + 1 == len(lines)
        middle = tok.encode(lines[i] if last else lines[i] + "\n")
        if not 0 < len(middle) <= max_line_tokens:
            continue
        # Tokenize a character window that surely holds more than the token budget, then cut by tokens.
        before = "\n".join(lines[:i]) + "\n" if i else ""
        after = "\n".join(lines[i + 1 :])
        pre = tok.encode(before[-prefix_tokens * 16 :])[-prefix_tokens:] if before else []
        suf = tok.encode(after[: suffix_tokens * 16])[:suffix_tokens] if after else []
        if not pre:
            continue  # position 0 must be visible context (the shifted prediction needs a left neighbour)
        cases.append(InfillCase(texts[f][0], lines[i], tuple(pre), tuple(middle), tuple(suf)))
    return cases


def build_eval_set(
    tok: DreamTokenizer,
    heldout_tokens: np.ndarray,
    heldout_texts: Sequence[tuple[str, str]],
    *,
    seq_len: int,
    top_token: int,
    top_line: str,
    max_windows: int = 64,
    n_cases: int = 64,
) -> EvalSet:
    windows = heldout_windows(heldout_tokens, seq_len, max_windows)
    prefix = min(128, seq_len // 2)
    suffix = max(min(64, seq_len - prefix - 32), 1)
    cases = infill_cases(
        tok,
        heldout_texts,
        n_cases,
        prefix_tokens=prefix,
        suffix_tokens=suffix,
        max_line_tokens=min(32, seq_len - prefix - suffix),
    )
    return EvalSet(windows, tuple(cases), top_token, top_line)


@partial(jax.jit, static_argnames=("graphdef", "mask_id", "eps"))
def _window_stats(
    graphdef: nnx.GraphDef,
    params: nnx.State,
    tokens: jax.Array,
    prompt_len: jax.Array,
    valid: jax.Array,
    key: jax.Array,
    top_token: jax.Array,
    rate: jax.Array,
    *,
    mask_id: int,
    eps: float,
) -> jax.Array:
    """Sums over the valid rows of one batch: [objective, masked, correct, CE, baseline correct].

    ``rate < 0`` draws t per row as in training (for the objective); otherwise tokens are masked at
    that rate. The rate is traced, not static, so one compiled program serves every rate. Positions
    before a row's ``prompt_len`` are never masked (0 for code windows: every position may be).
    """
    maskable = jnp.arange(tokens.shape[1])[None, :] >= prompt_len[:, None]  # [B, L]
    drawn = add_noise(key, tokens, mask_id, eps, maskable=maskable)
    fixed = mask_at_rate(key, tokens, mask_id, rate)
    fixed_masked = fixed.masked & maskable
    use_drawn = rate < 0
    noisy = jnp.where(use_drawn, drawn.noisy, jnp.where(fixed_masked, mask_id, tokens))
    masked = jnp.where(use_drawn, drawn.masked, fixed_masked)
    t = jnp.where(use_drawn, drawn.t, fixed.t)
    logits = nnx.merge(graphdef, params)(noisy)
    ce = token_losses(logits, tokens)  # [B, L], shifted as in training
    m = masked & valid[:, None]
    # Per-row 1/t-weighted objective, normalised by the row's scorable tokens (objective.py): the whole
    # window but position 0 for code, the response for SFT (LLaDA's per-answer-length normalisation).
    scorable = jnp.maximum(jnp.sum(maskable[:, 1:], axis=-1), 1)  # [B]
    row_obj = jnp.sum(jnp.where(m, ce, 0.0), axis=-1) / t / scorable
    correct = jnp.argmax(shift_logits(logits), axis=-1) == tokens
    return jnp.stack(
        [
            jnp.sum(jnp.where(valid, row_obj, 0.0)),
            jnp.sum(m),
            jnp.sum(correct & m),
            jnp.sum(jnp.where(m, ce, 0.0)),
            jnp.sum((tokens == top_token) & m),
        ]
    ).astype(jnp.float32)


def masked_token_metrics(
    graphdef: nnx.GraphDef,
    params: nnx.State,
    ev: EvalSet,
    mask_id: int,
    *,
    rates: Sequence[float] = DEFAULT_MASK_RATES,
    eps: float = 1e-3,
    batch_size: int = 16,
    seed: int = 1234,
) -> dict[str, Any]:
    """Held-out objective and, per mask rate, masked-token accuracy / CE and the baseline accuracy."""
    n = len(ev.windows)
    if n == 0:
        return {}
    key = jax.random.PRNGKey(seed)
    plen = ev.prompt_len if ev.prompt_len is not None else np.zeros((n,), np.int32)
    out: dict[str, Any] = {}
    for r_i, rate in enumerate((None, *rates)):
        totals = np.zeros(5)
        for b, start in enumerate(range(0, n, batch_size)):
            take = np.arange(start, start + batch_size)
            valid = take < n
            # Pad the last batch with copies of row 0 so one compiled shape serves all; ``valid`` drops them.
            take = np.where(valid, take, 0)
            k = jax.random.fold_in(jax.random.fold_in(key, r_i), b)
            stats = _window_stats(
                graphdef,
                params,
                jnp.asarray(ev.windows[take]),
                jnp.asarray(plen[take]),
                jnp.asarray(valid),
                k,
                jnp.int32(ev.top_token),
                jnp.float32(-1.0 if rate is None else rate),
                mask_id=mask_id,
                eps=eps,
            )
            totals += np.asarray(stats, dtype=np.float64)
        if rate is None:
            out["loss"] = totals[0] / n
            continue
        count = max(totals[1], 1.0)
        out[f"acc@{rate:g}"] = totals[2] / count
        out[f"ce@{rate:g}"] = totals[3] / count
        out[f"baseline_acc@{rate:g}"] = totals[4] / count
    return out


def _fill(
    graphdef: nnx.GraphDef, params: nnx.State, ids: jax.Array, attn: jax.Array, steps: jax.Array, mask_id: int
) -> jax.Array:
    """Greedy iterative unmasking: each step commits, in every row that still has masks, the masked
    position whose argmax probability is highest. ``steps`` (the largest hole) bounds the loop."""
    model = nnx.merge(graphdef, params)
    n = ids.shape[1]

    def cond(carry: tuple[jax.Array, jax.Array]) -> jax.Array:
        i, x = carry
        return (i < steps) & jnp.any(x == mask_id)

    def body(carry: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        i, x = carry
        logits = shift_logits(model(x, attn)).astype(jnp.float32)  # [B, L, V]
        # <|mask|> is never a training target, but a committed mask would stay a hole: rule it out.
        logits = logits.at[..., mask_id].set(-jnp.inf)
        probs = jax.nn.softmax(logits, axis=-1)
        conf, pred = jnp.max(probs, axis=-1), jnp.argmax(probs, axis=-1)  # [B, L]
        masked = x == mask_id
        pos = jnp.argmax(jnp.where(masked, conf, -1.0), axis=-1)  # [B]
        commit = (jnp.arange(n)[None, :] == pos[:, None]) & jnp.any(masked, axis=-1, keepdims=True)
        return i + 1, jnp.where(commit, pred, x)

    return jax.lax.while_loop(cond, body, (jnp.int32(0), ids))[1]


_fill_jit = jax.jit(_fill, static_argnames=("graphdef", "mask_id"))


def infill_metrics(
    graphdef: nnx.GraphDef,
    params: nnx.State,
    ev: EvalSet,
    tok: DreamTokenizer,
    *,
    batch_size: int = 16,
    return_samples: int = 0,
) -> dict[str, Any]:
    """Single-line infill exact match of the model and of the most-frequent-line baseline."""
    cases = list(ev.cases)
    if not cases:
        return {}
    mask_id, pad_id = tok.mask_id, tok.pad_id
    width = max(len(c.prefix) + len(c.middle) + len(c.suffix) for c in cases)
    width = 1 << max(width - 1, 1).bit_length()  # one bucket: a power of two at least as long as any row
    # Similar hole sizes in one batch: the loop runs until the longest hole of the batch is full.
    order = sorted(range(len(cases)), key=lambda i: len(cases[i].middle))
    hits = 0
    samples: list[dict[str, Any]] = []
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        ids = np.full((batch_size, width), pad_id, np.int32)
        attn = np.zeros((batch_size, width), bool)
        for r in range(batch_size):
            c = cases[idx[r]] if r < len(idx) else cases[idx[0]]
            row = c.prefix + (mask_id,) * len(c.middle) + c.suffix
            ids[r, : len(row)] = row
            attn[r, : len(row)] = True
        steps = jnp.int32(max(len(cases[i].middle) for i in idx))
        filled = np.asarray(_fill_jit(graphdef, params, jnp.asarray(ids), jnp.asarray(attn), steps, mask_id))
        for r, i in enumerate(idx):
            c = cases[i]
            got = tok.decode(filled[r, len(c.prefix) : len(c.prefix) + len(c.middle)].tolist())
            ok = got.strip() == c.line.strip()
            hits += ok
            if len(samples) < return_samples:
                samples.append({"path": c.path, "line": c.line, "filled": got, "exact": bool(ok)})
    baseline = sum(c.line.strip() == ev.top_line for c in cases)
    out: dict[str, Any] = {
        "infill_exact_match": hits / len(cases),
        "infill_baseline_exact_match": baseline / len(cases),
        "infill_cases": len(cases),
        "infill_baseline_line": ev.top_line,
    }
    if return_samples:
        out["infill_samples"] = samples
    return out


def python_share(prompt: str, text: str) -> float:
    """How much of a generation is Python: the share of its non-empty lines that are code (not comment-only)
    and lie inside the longest line prefix of ``prompt + text`` that parses as a Python module.

    Judging the program as a whole, not line by line, treats docstring delimiters, block headers and
    bracketed continuations as Python, and still stops at the first line that breaks the program.
    """
    lines = (prompt + text).split("\n")
    first = prompt.count("\n")  # the line where the generated text starts
    own = text.split("\n")[0]  # the generated part of that line
    generated = [i for i in range(first, len(lines)) if (own if i == first else lines[i]).strip()]
    if not generated:
        return 0.0
    for k in range(len(lines), first, -1):
        try:
            ast.parse("\n".join(lines[:k]))
        except (SyntaxError, ValueError):
            continue
        code = [i for i in generated if i < k and not lines[i].strip().startswith("#")]
        return len(code) / len(generated)
    return 0.0


def evaluate(
    graphdef: nnx.GraphDef,
    params: nnx.State,
    ev: EvalSet,
    tok: DreamTokenizer,
    *,
    eps: float = 1e-3,
    rates: Sequence[float] = DEFAULT_MASK_RATES,
    return_samples: int = 0,
) -> dict[str, Any]:
    """Every held-out metric of ``params`` on ``ev`` (see the module docstring)."""
    out = {"heldout_windows": len(ev.windows), "baseline_token": tok.decode([ev.top_token])}
    out |= masked_token_metrics(graphdef, params, ev, tok.mask_id, rates=rates, eps=eps)
    out |= infill_metrics(graphdef, params, ev, tok, return_samples=return_samples)
    return out
