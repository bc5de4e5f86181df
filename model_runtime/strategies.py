"""The decoders' small strategies as values: how a forward picks the positions it commits (commit rules)
and when a row's text has ended (early stops).

Each is a frozen dataclass with one method (gemma's sampler parts and ``EarlyStopFn`` are the model):
hashable, so a program's static spec can hold it and ``jax.jit`` compiles one program per value. They are
written against an array namespace ``xp`` passed in, ``jax.numpy`` on the device or ``numpy`` on the host,
so one definition serves the device loop and a host-side check, and this module imports no JAX: program
keys, which hold these values, are made by clients and the fake runtime too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from model_runtime import lines

# dInfer's CreditThresholdParallelDecoder defaults: credit weight, boost exponent, decay per forward.
CREDIT_ALPHA, CREDIT_GAMMA, CREDIT_DECAY = 0.7, 0.2, 0.8


# -- commit rules ------------------------------------------------------------------------------------------
class CommitRule(Protocol):
    """Which positions a forward commits. ``confidence`` ``[B, N]`` is ``-inf`` where nothing may be
    committed; ``threshold`` and ``factor`` are the request's (traced) values."""

    def select(self, xp: Any, confidence: Any, threshold: Any, factor: Any) -> Any:
        """``[B, N]`` bool: the positions to commit, always at least the row's most confident one."""
        ...

    def state_shape(self, batch: int, window: int, vocab: int) -> tuple[int, int, int]:
        """The shape of the float32 state the rule carries from forward to forward (``[B, 1, 1]``: none)."""
        ...

    def fuse(self, xp: Any, state: Any, logits: Any, open_: Any, moved: Any) -> tuple[Any, Any]:
        """(the state, the logits the proposals are drawn from) for a forward whose window moved ``moved``
        ``[B]`` positions to the right; ``open_`` ``[B, W]``: the positions it may commit."""
        ...


class _Stateless:
    """A rule that carries nothing between forwards and draws from the model's logits as they are."""

    def state_shape(self, batch: int, window: int, vocab: int) -> tuple[int, int, int]:
        return (batch, 1, 1)

    def fuse(self, xp: Any, state: Any, logits: Any, open_: Any, moved: Any) -> tuple[Any, Any]:
        return state, logits


@dataclass(frozen=True)
class Threshold(_Stateless):
    """dInfer's threshold rule: commit ``conf >= min(max(conf) - 1e-5, threshold)``, which always includes
    the row's most confident position."""

    def select(self, xp: Any, confidence: Any, threshold: Any, factor: Any) -> Any:
        thr = xp.minimum(xp.max(confidence, axis=-1, keepdims=True) - 1e-5, threshold)
        return (confidence >= thr) & (confidence > -xp.inf)


@dataclass(frozen=True)
class Factor(_Stateless):
    """Fast-dLLM's factor rule: with confidences sorted descending, commit the longest prefix where
    ``c_(i) >= 1 - factor / (i + 1)``, at least one."""

    def select(self, xp: Any, confidence: Any, threshold: Any, factor: Any) -> Any:
        ranked = -xp.sort(-confidence, axis=-1)  # [B, N], descending
        i = xp.arange(1, ranked.shape[-1] + 1, dtype=xp.float32)
        ok = ranked >= 1.0 - factor / (i + 1.0)
        n = xp.maximum(xp.sum(xp.cumprod(ok, axis=-1), axis=-1), 1)  # [B]
        thr = xp.take_along_axis(ranked, (n - 1)[:, None], axis=-1)
        return (confidence >= thr) & (confidence > -xp.inf)


@dataclass(frozen=True)
class Credit:
    """dInfer's credit rule: the threshold rule on logits fused with a decaying credit per position and
    token, ``credit = decay * credit + p_top1 ** gamma`` at each open position's proposal, added to the
    logits as ``alpha * log(1 + credit)``: a proposal that stays the same over forwards passes the
    threshold sooner. The credit is state the decoder carries (``[B, window, V]``), aligned with its
    window."""

    alpha: float = CREDIT_ALPHA
    gamma: float = CREDIT_GAMMA
    decay: float = CREDIT_DECAY

    def select(self, xp: Any, confidence: Any, threshold: Any, factor: Any) -> Any:
        return Threshold().select(xp, confidence, threshold, factor)

    def state_shape(self, batch: int, window: int, vocab: int) -> tuple[int, int, int]:
        return (batch, window, vocab)

    def fuse(self, xp: Any, state: Any, logits: Any, open_: Any, moved: Any) -> tuple[Any, Any]:
        """Follow the window, decay, add the boost at each open position's proposal; returns (credit, the
        fused logits in the logits' dtype)."""
        credit = state
        w = credit.shape[1]
        src = xp.arange(w, dtype=xp.int32)[None, :] + moved[:, None]  # [B, W]
        credit = xp.take_along_axis(credit, xp.clip(src, 0, w - 1)[..., None], axis=1)
        credit = xp.where((src < w)[..., None], credit, 0.0) * self.decay
        wide = logits.astype(xp.float32)
        e = xp.exp(wide - xp.max(wide, axis=-1, keepdims=True))  # softmax, as jax.nn.softmax computes it
        probs = e / xp.sum(e, axis=-1, keepdims=True)
        top = xp.argmax(probs, axis=-1)  # [B, W]
        boost = xp.where(open_, xp.max(probs, axis=-1) ** self.gamma, 0.0)
        hot = xp.arange(credit.shape[-1], dtype=top.dtype) == top[..., None]  # [B, W, V]
        credit = credit + xp.where(hot, boost[..., None], 0.0).astype(xp.float32)
        fused = wide + self.alpha * xp.log1p(credit)
        return credit, fused.astype(logits.dtype)


# The rules a request names (``SamplingParams.commit_rule``, with ``factor`` set: the factor rule).
COMMIT_RULES: dict[str, CommitRule] = {"threshold": Threshold(), "factor": Factor(), "credit": Credit()}


def commit_rule(name: str, factor: float | None) -> CommitRule:
    """The rule a request asks for: ``name``, where the threshold rule with a ``factor`` is the factor
    rule (Fast-dLLM's knob)."""
    return COMMIT_RULES["factor" if name == "threshold" and factor is not None else name]


# -- early stops -------------------------------------------------------------------------------------------
class EarlyStop(Protocol):
    """Whether each row's text has ended. ``x`` ``[B, N]`` token ids, ``decoded`` ``[B, N]`` bool: the
    positions that are the row's decoded text so far (every position before its first mask); ``limits``
    the run's tables (:class:`StopTables`: arrays of the same namespace)."""

    def ended(self, xp: Any, x: Any, decoded: Any, limits: StopTables) -> Any:
        """``[B]`` bool."""
        ...


class StopTables(Protocol):
    """What the early stops read, the same arrays on the host or on the device."""

    @property
    def stops(self) -> Any:
        """``[B, V]`` bool: tokens that end a row's text."""
        ...

    @property
    def newlines(self) -> Any:
        """``[V]`` i32: newlines per token (zeros when lines are not counted)."""
        ...

    @property
    def max_lines(self) -> Any:
        """i32: a row's text ends with this many lines (0: no limit)."""
        ...

    @property
    def lines(self) -> Any:
        """``[lines.ROWS, V]`` i32: where each token puts line breaks, indentation and code
        (``model_runtime.lines``)."""
        ...

    @property
    def scope(self) -> Any:
        """``[B]`` i32: each row's scope, the columns a later line of its text needs (< 0: none)."""
        ...


@dataclass(frozen=True)
class EndOfText:
    """A row ends at a stop token (end of text, end of turn) with every position before it decoded."""

    def ended(self, xp: Any, x: Any, decoded: Any, limits: StopTables) -> Any:
        return xp.any(xp.take_along_axis(limits.stops, x, axis=1) & decoded, axis=-1)


@dataclass(frozen=True)
class LineLimit:
    """A row ends once its decoded text holds ``max_lines`` lines (a one-line suggestion: 1)."""

    def ended(self, xp: Any, x: Any, decoded: Any, limits: StopTables) -> Any:
        lines = xp.sum(xp.where(decoded, limits.newlines[x], 0), axis=-1)
        return (limits.max_lines > 0) & (lines >= limits.max_lines)


@dataclass(frozen=True)
class ScopeEnd:
    """A row ends where its code leaves its scope (an editor's block or empty-line suggestion, Tabby's
    limitScopeByIndentation done while decoding): at a line after its first whose code is indented less
    than the row's ``scope`` columns, or at a blank line after code. Its first line continues the
    cursor's and is never judged. Token by token: a line's indentation is the blank columns after the
    newline that starts it, of the blank tokens after that, and before the code of its first code token
    (``model_runtime.lines``)."""

    def ended(self, xp: Any, x: Any, decoded: Any, limits: StopTables) -> Any:
        t = limits.lines[:, x]  # [ROWS, B, L]: each position's token's row of the table
        pos = xp.arange(x.shape[1], dtype=xp.int32)
        nl = (t[lines.NEWLINES] > 0) & decoded  # the answer's newlines: its first line is never judged
        head = (t[lines.HEAD_CODE] > 0) & decoded  # code on the line a token continues (before its newline)
        tail = (t[lines.TAIL_CODE] > 0) & nl  # a line whose code starts in the newline token that starts it
        start = xp.maximum.accumulate(xp.where(nl, pos, -1), axis=-1)  # [B, L]: the last newline token
        # The newline token that starts the line a token's head is on: the last one before the token.
        prev = xp.concatenate([xp.full_like(start[:, :1], -1), start[:, :-1]], axis=1)
        at = xp.clip(prev, 0, None)
        codes = xp.cumsum(head.astype(xp.int32), axis=-1)
        tails = xp.cumsum(tail.astype(xp.int32), axis=-1)
        spaces = xp.cumsum(xp.where(decoded & ~nl, t[lines.SPACES], 0), axis=-1)

        def at_prev(a: Any) -> Any:
            return xp.take_along_axis(a, at, axis=1)

        started = (prev >= 0) & ~at_prev(tail)  # a line a newline started, its code not begun with it
        # The first code of such a line, and the line's indentation there.
        first = head & started & (codes - head == at_prev(codes))
        indent = at_prev(t[lines.TAIL_LEAD]) + spaces - at_prev(spaces) + t[lines.LEAD]
        scope = limits.scope[:, None]
        left = (first & (indent < scope)) | (tail & (t[lines.TAIL_LEAD] < scope))
        # A blank line after code: inside a newline token ("\n\n"), or a line with no code that the next
        # newline token ends; code came before it.
        inner = (t[lines.INNER_BLANK] > 0) & nl & (codes + tails - tail > 0)
        empty = nl & started & (codes == at_prev(codes)) & (at_prev(codes + tails) > 0)
        return (limits.scope >= 0) & xp.any(left | inner | empty, axis=-1)


# Every run checks these; a request switches each off with its value (``max_lines`` 0, a scope < 0), so
# one program serves requests with and without them.
EARLY_STOPS: tuple[EarlyStop, ...] = (EndOfText(), LineLimit(), ScopeEnd())


def ended(stops: tuple[EarlyStop, ...], xp: Any, x: Any, decoded: Any, limits: StopTables) -> Any:
    """``[B]`` bool: the rows any of ``stops`` ends."""
    out = xp.zeros(x.shape[0], dtype=bool)
    for stop in stops:
        out = out | stop.ended(xp, x, decoded, limits)
    return out


def finished(
    stops: tuple[EarlyStop, ...], xp: Any, x: Any, fill: Any, limits: StopTables, mask_id: int
) -> tuple[Any, Any]:
    """Each row's first mask among ``fill`` (``[B, L]`` bool: the positions its run decodes; ``L`` when
    none is left) and whether the row is finished: no mask left, or one of ``stops`` ends the text before
    its first mask. ``[B]`` each; the same on the host (numpy) and on the device."""
    n = x.shape[1]
    pos = xp.arange(n, dtype=xp.int32)
    first = xp.min(xp.where((x == mask_id) & fill, pos, n), axis=-1)  # [B]
    decoded = fill & (pos < first[:, None])  # [B, L]
    return first, ended(stops, xp, x, decoded, limits) | (first == n)
