"""Which queued jobs run together: the oldest, and later ones that can share its canvas batch.

Jobs share a batch only if everything the runtime takes once per ``run`` is equal (the sampling
parameters but ``max_new_tokens`` and ``seed``) and their rows fit one (batch, length) bucket together.
FIFO order: a job is never passed over for a later one that would not fit with it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

from assistant.server.job import Job
from model_runtime.params import SamplingParams


def params_key(params: SamplingParams) -> tuple[Any, ...]:
    """Jobs batch together only if everything the runtime shares across rows is equal.

    ``max_new_tokens`` is per row (it sized the row's canvas when the row was made), and so is ``seed``
    (each row carries its request's, ``CanvasRow.seed``); the rest (steps, alg, temperature, ...) is one
    value per ``run`` call.
    """
    d = params.to_dict()
    d.pop("max_new_tokens")
    d.pop("seed")
    return tuple(sorted(d.items()))


def fits(lengths: Sequence[int], max_batch: int, buckets: Sequence[tuple[int, int]]) -> bool:
    """Whether rows of these lengths fit one (batch, length) bucket, at most ``max_batch`` rows."""
    if len(lengths) > max_batch:
        return False
    if len(lengths) == 1:
        return True
    longest = max(lengths)
    return any(b >= len(lengths) and n >= longest for b, n in buckets)


def take_batch(pending: deque[Job], max_batch: int, buckets: Sequence[tuple[int, int]]) -> list[Job]:
    """Take the oldest job from ``pending``, and the later ones that share its parameters and fit a
    bucket with it (in queue order)."""
    first = pending.popleft()
    batch, key = [first], params_key(first.params)
    for job in list(pending):
        if params_key(job.params) == key and fits(
            [j.row_length for j in batch] + [job.row_length], max_batch, buckets
        ):
            batch.append(job)
            pending.remove(job)
    return batch
