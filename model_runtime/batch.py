"""A batch on the host side: rows placed into a padded bucket, and the events read back out of it.

Rows are right-aligned in the bucket (left padding), which leaves every real row's result unchanged:
pads are masked out as keys and do not shift real positions (the reference pads the same way, see
docs/reference.md). Events report each row's region in the row's own coordinates, without the padding.
Plain numpy: nothing here runs on a device.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from model_runtime.interface import BatchDone, BatchStep, CanvasRow, GenerationStats
from model_runtime.tokenizer import DreamTokenizer


def answer_length(
    region: Sequence[int], stops: set[int], newlines: Sequence[int], max_lines: int | None
) -> int:
    """The answer's tokens in a generated region: up to its first stop token, or through the token that
    ends its ``max_lines``-th line (``newlines``: newlines per token id)."""
    lines = 0
    for k, t in enumerate(region):
        if t in stops:
            return k
        if max_lines:
            lines += newlines[t] if t < len(newlines) else 0
            if lines >= max_lines:
                return k + 1
    return len(region)


@dataclass(frozen=True)
class PlacedBatch:
    """``rows`` in a ``shape`` bucket: canvas ids ``x`` and padding mask ``attn`` (both ``[B, L]``), and
    where each row starts. Spare batch rows are all padding, with no masks, so they commit nothing."""

    rows: Sequence[CanvasRow]
    shape: tuple[int, int]
    x: np.ndarray
    attn: np.ndarray
    offsets: list[int]

    @classmethod
    def of(cls, rows: Sequence[CanvasRow], shape: tuple[int, int], pad_id: int) -> PlacedBatch:
        b, n = shape
        x = np.full((b, n), pad_id, np.int32)
        attn = np.zeros((b, n), bool)
        offsets = []
        for i, r in enumerate(rows):
            off = n - len(r.ids)
            x[i, off:] = r.ids
            attn[i, off:] = True
            offsets.append(off)
        return cls(rows, shape, x, attn, offsets)

    def step_event(
        self,
        prev: np.ndarray,
        cur: np.ndarray,
        step: int,
        steps: int,
        seconds: float,
        mask_id: int,
        block: tuple[int, int] = (0, 0),
    ) -> BatchStep:
        """The step that took canvas ``prev`` to ``cur`` (host arrays of the whole bucket); ``block`` is
        (block, blocks) for the fast decoder."""
        canvas, unmasked, left = [], [], []
        for j, r in enumerate(self.rows):
            lo, hi = self.offsets[j] + r.region[0], self.offsets[j] + r.region[1]
            region = cur[j, lo:hi]
            canvas.append(region.tolist())
            unmasked.append(np.flatnonzero((prev[j, lo:hi] == mask_id) & (region != mask_id)).tolist())
            left.append(int(np.sum(cur[j, self.offsets[j] :] == mask_id)))
        return BatchStep(
            step=step,
            steps=steps,
            canvas=canvas,
            unmasked=unmasked,
            seconds=seconds,
            masks_left=left,
            content=[cur[j, self.offsets[j] :].tolist() for j in range(len(self.rows))],
            block=block[0],
            blocks=block[1],
        )

    def done_event(
        self,
        final: np.ndarray,
        tokenizer: DreamTokenizer,
        *,
        pad_id: int,
        steps: int,
        elapsed: float,
        compile_s: float,
        compiled: int,
        hits: int,
        decoder: str = "reference",
        max_lines: int | None = None,
    ) -> BatchDone:
        """The answers in the final canvas, each row's region cut at its first stop token and decoded
        (and after its ``max_lines``-th line)."""
        longest = max(len(r.ids) for r in self.rows)
        sequences, generated, texts, answers = [], [], [], []
        newlines = tokenizer.newlines() if max_lines else ()
        for j, r in enumerate(self.rows):
            content = final[j, self.offsets[j] :].tolist()
            sequences.append([pad_id] * (longest - len(content)) + content)
            region = content[r.region[0] : r.region[1]]
            generated.append(region)
            text = tokenizer.postprocess(region, chat=r.chat)
            texts.append("\n".join(text.split("\n")[:max_lines]) if max_lines else text)
            answers.append(answer_length(region, set(tokenizer.stop_ids(chat=r.chat)), newlines, max_lines))
        new_tokens = sum(r.region[1] - r.region[0] for r in self.rows)
        stats = GenerationStats(
            steps=steps,
            new_tokens=new_tokens,
            batch_size=len(self.rows),
            compile_seconds=compile_s,
            generate_seconds=elapsed,
            tokens_per_second=new_tokens / elapsed if elapsed > 0 else 0.0,
            compiled_programs=compiled,
            cache_hits=hits,
            bucket=self.shape,
            decoder=decoder,
        )
        return BatchDone(
            texts=texts,
            sequences=sequences,
            generated=generated,
            prompt_lengths=[r.region[0] for r in self.rows],
            stats=stats,
            answer_tokens=answers,
        )
