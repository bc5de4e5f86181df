"""Rollouts: G completions per prompt from diffu's reference decoder with the policy's current weights.

The published trainer left-pads the batch's prompts, keeps their last ``max_prompt_length`` tokens and
calls Dream's ``diffusion_generate`` (``max_new_tokens`` = ``steps``: one token per step, ``alg``
entropy, ``alg_temp`` 0, temperature 1.0 and ``top_p`` 0.95 in the recipe, ``top_k`` left unset, which
the reference reads as 50). Here the runtime's reference decoder does that (``Runtime.run``), batched
``generation_batch_size`` rows at a time; ``<|im_end|>`` ends the completion mask.

Prompts of different lengths share a generation batch, left-padded into the runtime's bucket; the runtime
hides the pads (no keys, positions counted from each row's first real token), so a row samples as it
would alone, as a published device batch (one prompt's generations) does. The rollout's prompts are
left-padded together again for scoring, and ``attention_mask`` (from each prompt's own length) lets the
scoring passes hide those pads the same way (``coupled.coupled_logps``): a completion is sampled and
scored on its own prompt alone.

``decoder="fast"`` (not the published setting) samples with diffu's block-wise fast decoder instead, for
small models whose reference-decoder rollouts collapse (a confident end-of-text committed first leaves an
empty answer). The update does not depend on the sampler: old, reference and current log-probabilities
all come from the coupled estimate of the completions as sampled.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from flax import nnx

from model_runtime.interface import BatchDone
from model_runtime.params import SamplingParams
from model_runtime.runtime import Runtime
from model_runtime.train.rl.coupled import completion_mask

PROMPT_MULTIPLE = 16  # prompts are left-padded to a multiple of this: fewer shapes for the jitted steps


@dataclass
class Rollout:
    """A batch of completions: ``[B, P]`` prompts (left-padded), their ``[B]`` own lengths, ``[B, T]``
    completions and mask."""

    prompt_ids: np.ndarray
    prompt_lengths: np.ndarray
    completion_ids: np.ndarray
    completion_mask: np.ndarray
    texts: list[str]
    seconds: float

    @property
    def ids(self) -> np.ndarray:
        return np.concatenate([self.prompt_ids, self.completion_ids], axis=1)


def attention_mask(prompt_lengths: np.ndarray, prompt_width: int, completion_length: int) -> np.ndarray:
    """``[B, prompt_width + completion_length]`` bool: False on each row's left padding, True on its own
    prompt and its completion. Taken from the lengths, not from pad ids: a completion may hold the pad
    token (``<|endoftext|>`` after the end of its turn)."""
    cols = np.arange(prompt_width + completion_length)
    return cols[None, :] >= (prompt_width - np.asarray(prompt_lengths))[:, None]


def sampling(
    max_new_tokens: int,
    steps: int,
    temperature: float,
    top_p: float,
    decoder: str = "reference",
    block_length: int = 32,
    threshold: float = 0.9,
) -> SamplingParams:
    """The published rollout settings for the reference decoder (``top_k`` unset: the reference's 50);
    with ``decoder="fast"`` its blocks of ``block_length`` and confidence ``threshold``."""
    return SamplingParams(
        max_new_tokens=max_new_tokens,
        steps=steps,
        alg="entropy",
        alg_temp=0.0,
        temperature=temperature,
        top_p=top_p if temperature > 0 else 1.0,
        decoder=decoder,
        block_length=block_length,
        threshold=threshold,
    )


def encode_prompts(
    rt: Runtime, messages: Sequence[list[dict[str, str]]], max_prompt_length: int
) -> list[list[int]]:
    """Chat prompts as ids, each cut to its last ``max_prompt_length`` tokens (published left truncation)."""
    return [rt.rows.encode_chat(m)[-max_prompt_length:] for m in messages]


def generate(
    rt: Runtime,
    params: nnx.State,
    prompts: Sequence[Sequence[int]],
    settings: SamplingParams,
    *,
    batch_size: int,
    seed: int,
) -> Rollout:
    """Completions of ``prompts`` (one row each, repeats included) by ``rt``'s reference decoder run with
    ``params`` (the policy's weights, same tree as ``rt.state``); row ``b`` samples with seed ``seed + b``.

    One seed per row, not per batch: the runtime draws each row's noise from its own seed alone (a row
    samples the same in any batch), so the G repeats of a prompt under one seed would be G copies of one
    completion, every advantage 0. Per-row seeds also make a rollout independent of the batch size."""
    rt.state = params  # the compiled programs take the weights as an argument: nothing recompiles
    tok = rt.tokenizer
    start = time.perf_counter()
    completions: list[list[int]] = []
    for lo in range(0, len(prompts), batch_size):
        rows = [
            rt.rows.make_row(p, settings.max_new_tokens, chat=True) for p in prompts[lo : lo + batch_size]
        ]
        rows = [dataclasses.replace(row, seed=(seed + lo + j) % 2**32) for j, row in enumerate(rows)]
        events = rt.run(rows, dataclasses.replace(settings, seed=seed), stream=False)
        done = [e for e in events if isinstance(e, BatchDone)]  # without streaming: the one event
        completions += done[-1].generated
    seconds = time.perf_counter() - start
    width = -(-max(len(p) for p in prompts) // PROMPT_MULTIPLE) * PROMPT_MULTIPLE
    prompt_ids = np.full((len(prompts), width), rt.config.pad_token_id, np.int32)
    for b, p in enumerate(prompts):
        prompt_ids[b, width - len(p) :] = p
    comp = np.asarray(completions, np.int32)  # [B, T]
    # The published reward input: the whole completion decoded without special tokens.
    texts = [tok.decode(row.tolist(), skip_special_tokens=True) for row in comp]
    end = tok.im_end_id if tok.im_end_id is not None else tok.eos_id  # a base tokenizer has no turns
    lengths = np.array([len(p) for p in prompts], np.int32)
    return Rollout(prompt_ids, lengths, comp, completion_mask(comp, end), texts, seconds)
