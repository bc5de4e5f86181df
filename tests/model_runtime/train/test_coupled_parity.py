"""Parity of coupled-GRPO's scoring and loss with a PyTorch re-statement of the published trainer.

Same tiny float32 checkpoints (old policy, current policy, reference model), same completions, same
masks (the torch side draws them from its mask seeds exactly as ``forward_process`` does; ours receive
those draws), same rewards: per-token log-probabilities, advantages, loss, KL, clip fraction and the
gradient agree within 1e-5 relative (the gradient 1e-4), for ``num_iterations`` 1 and 2.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

import model_runtime
from model_runtime.tiny import write_checkpoint
from model_runtime.train.corpus import TOKENIZER_FILES
from model_runtime.train.export import params_by_path
from model_runtime.train.rl import coupled
from tests.reference.coupled_grpo_torch import PublishedCoupledGRPO
from tests.reference.dream_torch import DreamReference


def rel_err(ours: np.ndarray, ref: np.ndarray) -> float:
    return float(np.max(np.abs(np.asarray(ours) - np.asarray(ref))) / np.max(np.abs(np.asarray(ref))))


def _perturbed(tiny_dir: Path, out: Path, seed: int, scale: float) -> Path:
    """A copy of the tiny checkpoint with every tensor nudged by ``scale`` of its own spread."""
    import json

    tensors = {}
    for f in sorted(tiny_dir.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    rng = np.random.default_rng(seed)
    for name, w in tensors.items():
        tensors[name] = w + scale * w.std() * rng.standard_normal(w.shape).astype(np.float32)
    cfg = json.loads((tiny_dir / "config.json").read_text())
    write_checkpoint(out, cfg, tensors, shards=1)
    for name in TOKENIZER_FILES:
        if (tiny_dir / name).is_file():
            shutil.copyfile(tiny_dir / name, out / name)
    return out


@pytest.fixture(scope="module")
def models(tiny_dir, tmp_path_factory):
    """(old, current, reference) checkpoints: current and reference near the old policy."""
    root = tmp_path_factory.mktemp("cpgrpo")
    dirs = {
        "old": tiny_dir,
        "cur": _perturbed(tiny_dir, root / "cur", 1, 0.15),
        "ref": _perturbed(tiny_dir, root / "ref", 2, 0.05),
    }
    jx = {k: model_runtime.load(d, dtype="float32") for k, d in dirs.items()}
    th = {k: DreamReference.from_dir(d) for k, d in dirs.items()}
    return jx, th


def _batch(rt, rows: int, prompt: int, completion: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Left-padded prompts and completions; some completions hold ``<|im_end|>`` early."""
    cfg, tok = rt.config, rt.tokenizer
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, cfg.mask_token_id, size=(rows, prompt + completion))
    for b in range(rows):
        ids[b, : b % 3] = cfg.pad_token_id  # rows padded by 0, 1, 2 tokens
    for b, at in ((0, 3), (2, 8)):
        ids[b, prompt + at] = tok.im_end_id
    mask = coupled.completion_mask(ids[:, prompt:], tok.im_end_id)
    return ids, mask


@pytest.mark.parametrize(
    ("num_iterations", "accumulation", "chunk", "group"),
    [(1, 1, 4, 2), (2, 2, 3, 3)],
    ids=["num_iterations=1", "num_iterations=2"],
)
def test_logps_advantages_and_loss_match_the_published_trainer(
    models, num_iterations, accumulation, chunk, group
):
    jx, th = models
    rt = jx["old"]
    mask_id = rt.config.mask_token_id
    prompt, completion = 7, 12
    rows = chunk * accumulation
    ids, cmask = _batch(rt, rows, prompt, completion, seed=num_iterations)
    rewards = np.array([2.5, 0.5, 1.0, 0.0, 2.0, 0.5][:rows], np.float32)
    seeds = [17, 3071][:num_iterations]
    ref_impl = PublishedCoupledGRPO(
        mask_id=mask_id,
        num_iterations=num_iterations,
        gradient_accumulation_steps=accumulation,
        num_generations=group,
    )
    full = torch.tensor(ids)

    # The rollout's scoring: old-policy (num_iterations > 1) and reference log-probs per iteration.
    old_t, ref_t = ref_impl.score_rollout(th["old"], th["ref"], full, completion, seeds)
    draws = []
    for seed in seeds:
        t, matrix = ref_impl.draw(seed, rows, prompt + completion, accumulate=num_iterations > 1)
        draws.append(coupled.MaskDraw(jnp.float32(t), jnp.asarray(matrix[:chunk, prompt:].numpy())))

    def logps(name: str, k: int) -> jax.Array:
        r = coupled.tile_rows(draws[k].r, rows)
        return coupled.coupled_logps(
            jx[name].graphdef, jx[name].state, jnp.asarray(ids), draws[k].t, r, mask_id
        )

    for k in range(num_iterations):
        assert rel_err(logps("ref", k), ref_t[:, k].numpy()) < 1e-5
        if num_iterations > 1:
            assert rel_err(logps("old", k), old_t[:, k].numpy()) < 1e-5

    adv = coupled.leave_one_out(rewards, group)
    adv_t = ref_impl.advantages(torch.tensor(rewards))
    np.testing.assert_allclose(adv, adv_t.numpy(), rtol=1e-6)

    settings = coupled.LossSettings(chunk=chunk)
    for k in range(num_iterations):
        # Published: one compute_loss per micro-batch, each divided by the accumulation steps.
        th_cur = th["cur"]
        th_cur.zero_grad()
        total, kls, clips = 0.0, [], []
        for j in range(accumulation):
            part = slice(j * chunk, (j + 1) * chunk)
            inputs = {
                "prompt_ids": full[part, :prompt],
                "completion_ids": full[part, prompt:],
                "completion_mask": torch.tensor(cmask[part]),
                "mask_seeds": seeds,
                "advantages": adv_t[part],
                "ref_per_token_logps": ref_t[part],
                "old_per_token_logps": old_t[part] if old_t is not None else [],
            }
            ref_impl._step = k  # compute_loss picks the iteration as _step % num_iterations
            loss_j, m = ref_impl.compute_loss(th_cur, inputs)
            (loss_j / accumulation).backward()
            total += float(loss_j.detach()) / accumulation
            kls.append(float(m["kl"].detach()))
            clips.append(float(m["clip_ratio"].detach()))

        old_k = None if num_iterations == 1 else jnp.asarray(old_t[:, k].numpy())

        def loss_fn(params, k=k, old_k=old_k):
            cur = coupled.coupled_logps(
                jx["cur"].graphdef,
                params,
                jnp.asarray(ids),
                draws[k].t,
                coupled.tile_rows(draws[k].r, rows),
                mask_id,
            )
            return coupled.grpo_loss(
                cur, old_k, jnp.asarray(ref_t[:, k].numpy()), jnp.asarray(adv), jnp.asarray(cmask), settings
            )

        (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(jx["cur"].state)
        assert abs(float(loss) - total) <= 1e-5 * abs(total), (float(loss), total)
        assert float(metrics["kl"]) == pytest.approx(np.mean(kls), rel=1e-5)
        assert float(metrics["clip_ratio"]) == pytest.approx(np.mean(clips), rel=1e-5, abs=1e-7)
        ours = params_by_path(grads)
        for path, name in (
            (("lm_head",), "lm_head"),
            (("layers", 0, "mlp", "gate_kernel"), "layers.0.gate_proj"),
        ):
            theirs = dict(th_cur.named_parameters())[f"{name}.weight"].grad.numpy()
            assert rel_err(ours[path], theirs.T) < 1e-4, name
