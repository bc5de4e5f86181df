"""A float32 PyTorch re-statement of the published coupled-GRPO trainer's scoring and loss.

Written from apple/ml-diffucoder ``src/open_r1/coupled_grpo.py`` (``DiffuGRPOTrainer``: ``forward_process``,
``get_logits``, ``_get_per_token_logps``, ``selective_log_softmax``, ``compute_loss`` and the advantage
block of ``_generate_and_score_completions``), in its structure: the per-iteration list of three noisy
copies, the ``[iterations * 3 * batch]`` logits layout and its index arithmetic, the ``permute`` to
``[batch, iterations, T]``, the ``_step % num_iterations`` iteration pick. Only the parts that need a GPU,
accelerate or TRL are left out (bf16 autocast, gathers); the logged metrics are kept as the published
code computes them (``logged_kl``, ``logged_clip_ratio``) beside the per-token means diffu logs. One
defect is fixed, as the port fixes it: the published reference-model branch reads
``prompt_completion_ids_expanded``, which exists only when ``num_iterations > 1`` (a NameError with
``num_iterations == 1`` and ``beta != 0``). ``completion_mask`` restates the end-of-turn mask of
``_generate_and_score_completions``.

The model is ``dream_torch.DreamReference``, called like the published ``model(batch).logits``: no
attention mask, positions ``0..L-1``. Tests use it as the parity reference; torch lives only here.
"""

from __future__ import annotations

import random

import numpy as np
import torch
import torch.nn.functional as F


def completion_mask(completion_ids: torch.Tensor, eos_token_id: int) -> torch.Tensor:
    """``_generate_and_score_completions``' mask (the eos token there is ``<|im_end|>``): per row the
    index of its first eos (the row's length when it has none), then 1 at every position ``<=`` it."""
    is_eos = completion_ids == eos_token_id
    rows, length = is_eos.shape
    first = torch.full((rows,), length, dtype=torch.long)
    has_eos = is_eos.any(dim=1)
    first[has_eos] = is_eos.int().argmax(dim=1)[has_eos]
    positions = torch.arange(length).expand(rows, -1)
    return (positions <= first.unsqueeze(1)).int()


def set_seed(seed: int) -> None:
    """accelerate.utils.set_seed on CPU: Python's, numpy's and torch's generators."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class PublishedCoupledGRPO:
    """The published trainer's arithmetic, for a model, a mask id and the recipe's constants."""

    def __init__(
        self,
        *,
        mask_id: int,
        num_iterations: int,
        gradient_accumulation_steps: int,
        beta: float = 0.01,
        epsilon: float = 0.5,
        num_generations: int,
    ) -> None:
        self.mask_id = mask_id
        self.num_iterations = num_iterations
        self.gradient_accumulation_steps = gradient_accumulation_steps
        self.beta = beta
        self.epsilon_low = self.epsilon_high = epsilon
        self.num_generations = num_generations
        self._step = 0

    # -- forward_process: three noisy copies per iteration ---------------------------------------
    def draw(self, seed: int, b: int, length: int, accumulate: bool) -> tuple[float, torch.Tensor]:
        """The mask ratio and the uniform matrix ``forward_process`` draws after ``set_seed(seed)``."""
        set_seed(seed)
        mask_ratio = random.uniform(0.2, 0.8)
        if accumulate:
            rows = torch.rand((b // self.gradient_accumulation_steps, length))
            rows = torch.cat([rows] * self.gradient_accumulation_steps, dim=0)
        else:
            rows = torch.rand((b, length))
        return mask_ratio, rows

    def forward_process(self, batch, prompt_index, seed, accumulate):
        b, length = batch.shape
        mask_ratio, random_matrix = self.draw(seed, b, length, accumulate)
        t_p = torch.ones(b) * mask_ratio
        noisy = []
        is_mask = ~prompt_index  # every completion token
        noisy.append(torch.where(is_mask, self.mask_id, batch))
        is_mask = ~prompt_index & (random_matrix < t_p.unsqueeze(1))
        completion_mask = is_mask
        noisy.append(torch.where(is_mask, self.mask_id, batch))
        is_mask = ~prompt_index & (random_matrix > t_p.unsqueeze(1))
        noisy.append(torch.where(is_mask, self.mask_id, batch))
        return noisy, [1, 1 / mask_ratio, 1 / (1 - mask_ratio)], completion_mask

    @staticmethod
    def get_logits(model, batch):
        return model(batch)[:, :-1]

    # -- _get_per_token_logps ---------------------------------------------------------------------
    def per_token_logps(self, model, input_ids, logits_to_keep, mask_seeds):
        """``input_ids`` ``[iterations, batch, L]`` -> ``[batch, iterations, T]``."""
        num_iterations, batch_size, seq_len = input_ids.size()
        prompt_length = seq_len - logits_to_keep
        prompt_index = torch.zeros(seq_len, dtype=torch.bool)
        prompt_index[:prompt_length] = True
        seqs, weights, inputs, masks = [], [], [], []
        for it, seed in enumerate(mask_seeds):
            noisy, w, cmask = self.forward_process(
                input_ids[it], prompt_index, seed, accumulate=num_iterations > 1
            )
            seqs.extend(noisy)
            weights.extend(w)
            inputs.append(input_ids[it])
            masks.append(cmask)
        perturbed = torch.cat(seqs, dim=0)  # [iterations * 3 * batch, L]
        mask_seq = torch.cat(masks, dim=0)
        expanded = torch.cat(inputs, dim=0)
        all_weights = torch.tensor(weights)
        logits = self.get_logits(model, perturbed)
        logps = selective_log_softmax(
            logits[:, -logits_to_keep:, :],
            expanded[:, -logits_to_keep:],
            all_weights,
            mask_seq[:, -logits_to_keep:],
        )
        return logps.view(num_iterations, batch_size, logits_to_keep).permute(1, 0, 2).to(torch.float32)

    # -- the scoring part of _generate_and_score_completions --------------------------------------
    def score_rollout(self, model, ref_model, prompt_completion_ids, logits_to_keep, mask_seeds):
        """Old-policy and reference log-probs ``[batch, iterations, T]`` (old None for 1 iteration)."""
        expanded = prompt_completion_ids.unsqueeze(0).expand(self.num_iterations, -1, -1)
        with torch.no_grad():
            old = None
            if self.num_iterations > 1:
                old = self.per_token_logps(model, expanded, logits_to_keep, mask_seeds)
            # Fixed: the published code reads `prompt_completion_ids_expanded` here, defined only in the
            # branch above.
            ref = self.per_token_logps(ref_model, expanded, logits_to_keep, mask_seeds)
        return old, ref

    def advantages(self, rewards):
        grouped = rewards.view(-1, self.num_generations)
        baseline = (grouped.sum(dim=1, keepdim=True) - grouped) / (self.num_generations - 1)
        return (grouped - baseline).view(-1)

    # -- compute_loss ---------------------------------------------------------------------------
    def compute_loss(self, model, inputs):
        prompt_ids, completion_ids = inputs["prompt_ids"], inputs["completion_ids"]
        completion_mask = inputs["completion_mask"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        logits_to_keep = completion_ids.size(1)
        itr = self._step % self.num_iterations
        logps = self.per_token_logps(
            model, input_ids.unsqueeze(0), logits_to_keep, [inputs["mask_seeds"][itr]]
        )
        ref = inputs["ref_per_token_logps"][:, itr, :].unsqueeze(1)
        kl = torch.exp(ref - logps) - (ref - logps) - 1
        advantages = inputs["advantages"]
        old = (
            inputs["old_per_token_logps"][:, itr, :].unsqueeze(1)
            if self.num_iterations > 1
            else logps.detach()
        )
        coef_1 = torch.exp(logps - old)
        coef_2 = torch.clamp(coef_1, 1 - self.epsilon_low, 1 + self.epsilon_high)
        per_token_loss = -torch.min(coef_1 * advantages.view(-1, 1, 1), coef_2 * advantages.view(-1, 1, 1))
        if self.beta != 0.0:
            per_token_loss = per_token_loss + self.beta * kl
        loss = (per_token_loss[:, 0, :] * completion_mask).sum() / completion_mask.sum().clamp(min=1.0)
        # The per-token means (what diffu logs): each row's values under its own mask.
        mean_kl = (kl[:, 0, :] * completion_mask).sum() / completion_mask.sum()
        low = (coef_1 < 1 - self.epsilon_low) & (advantages.view(-1, 1, 1) < 0)
        high = (coef_1 > 1 + self.epsilon_high) & (advantages.view(-1, 1, 1) > 0)
        region = ((low | high)[:, 0, :] * completion_mask).sum() / completion_mask.sum()
        # The published metrics: kl [B, 1, T] times completion_mask [B, T] broadcasts to [B, B, T] (every
        # row's KL under every row's mask), and the clip tests pair coef_1 [B, 1, T] with
        # advantages.unsqueeze(1) [B, 1] (every row's ratio with every row's advantage), [B, B, T] too.
        logged_kl = (kl * completion_mask).sum() / completion_mask.sum()
        logged_low = (coef_1 < 1 - self.epsilon_low) & (advantages.unsqueeze(1) < 0)
        logged_high = (coef_1 > 1 + self.epsilon_high) & (advantages.unsqueeze(1) > 0)
        logged_region = ((logged_low | logged_high) * completion_mask).sum() / completion_mask.sum()
        return loss, {
            "kl": mean_kl,
            "clip_ratio": region,
            "logged_kl": logged_kl,
            "logged_clip_ratio": logged_region,
        }


def selective_log_softmax(logits, index, weights, mask):
    """Per sequence, its three versions' log-probs combined as ``(p0 + where(mask, p1 w1, p2 w2)) / 2``.

    ``logits`` ``[iterations * 3 * batch, T, V]`` in the layout ``[it0: v0 rows, v1 rows, v2 rows, it1:
    ...]``; ``index`` and ``mask`` ``[iterations * batch, T]``; ``weights`` ``[iterations * 3]``.
    """
    full_batch = logits.size(0) // 3
    num_iterations = weights.size(0) // 3
    batch_size = full_batch // num_iterations
    out = []
    for i in range(full_batch):
        chunk, offset = divmod(i, batch_size)
        base = chunk * 3 * batch_size
        rows = torch.tensor([base + offset, base + batch_size + offset, base + 2 * batch_size + offset])
        seq_logps = F.log_softmax(logits[rows], dim=-1)  # [3, T, V]
        labels = index[i].unsqueeze(0).unsqueeze(-1).expand(3, -1, 1)
        per_token = seq_logps.gather(dim=-1, index=labels).squeeze(-1)  # [3, T]
        w = weights[chunk * 3 : (chunk + 1) * 3]
        weighted = torch.where(mask[i], per_token[1] * w[1], per_token[2] * w[2])
        out.append((per_token[0] + weighted) / 2)
    return torch.stack(out)
