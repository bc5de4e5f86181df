"""Parity of coupled-GRPO's scoring and loss with a PyTorch re-statement of the published trainer.

Same tiny float32 checkpoints (old policy, current policy, reference model), same completions, same
masks (the torch side draws them from its mask seeds exactly as ``forward_process`` does; ours receive
those draws), same rewards: per-token log-probabilities, advantages, loss, KL, clip fraction and the
gradient agree within 1e-5 relative (the gradient 1e-4), for ``num_iterations`` 1 and 2.

Then the trainer itself: a rollout of prompts of different lengths, made and scored by ``RLTrainer``,
with ``<|im_end|>`` forced into some completions, against the published computation on each prompt's
rows alone (a published device batch): the published side's prompts are encoded here, from the tasks'
messages, and its completion mask is the published code's (``completion_mask``), so neither borrows the
trainer's prompt lengths or mask; only the trainer's per-device-group masks are shared. Then the mask
draws per device group; the recipe's warm-up.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

import model_runtime
from model_runtime.interface import BatchDone
from model_runtime.tiny import write_checkpoint
from model_runtime.tokenizer import chat_prompt
from model_runtime.train.corpus import TOKENIZER_FILES
from model_runtime.train.export import params_by_path
from model_runtime.train.loop import TrainConfig, schedule
from model_runtime.train.rl import coupled
from model_runtime.train.rl.config import Reward, RLConfig, RLOptions
from model_runtime.train.rl.run import load_policy
from model_runtime.train.rl.tasks import Task
from model_runtime.train.rl.trainer import LOGPS, LOSS_AND_GRAD, RLTrainer
from tests.reference.coupled_grpo_torch import PublishedCoupledGRPO, completion_mask
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
    mask = completion_mask(torch.tensor(ids[:, prompt:]), tok.im_end_id).numpy()
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

    def per_row(k: int) -> tuple[jax.Array, jax.Array]:
        """Iteration k's draw for every row: one device, its [chunk, T] draws repeated per micro-batch."""
        return jnp.full(rows, draws[k].t), jnp.tile(draws[k].r, (rows // chunk, 1))

    def logps(name: str, k: int) -> jax.Array:
        # The trainer's program. No attention mask: the hand-made pads are attended, as the published
        # get_logits does.
        return LOGPS(jx[name].graphdef, jx[name].state, jnp.asarray(ids), None, *per_row(k), mask_id=mask_id)

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
        total, kls, clips, logged_kls = 0.0, [], [], []
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
            logged_kls.append(float(m["logged_kl"].detach()))

        old_k = None if num_iterations == 1 else jnp.asarray(old_t[:, k].numpy())

        # The trainer's loss and gradient program, on the whole batch (one device, no attention mask).
        (loss, metrics), grads = LOSS_AND_GRAD(
            jx["cur"].graphdef, mask_id, settings, jx["cur"].state, jnp.asarray(ids), None, *per_row(k),
            old_k, jnp.asarray(ref_t[:, k].numpy()), jnp.asarray(adv), jnp.asarray(cmask),
        )  # fmt: skip
        assert abs(float(loss) - total) <= 1e-5 * abs(total), (float(loss), total)
        assert float(metrics["kl"]) == pytest.approx(np.mean(kls), rel=1e-5)
        assert float(metrics["clip_ratio"]) == pytest.approx(np.mean(clips), rel=1e-5, abs=1e-7)
        # The published log: every row's KL under every row's mask. Where no completion of a micro-batch
        # ends early it is exactly the rows times the per-token mean (docs/training.md).
        for j, (kl_j, logged_j) in enumerate(zip(kls, logged_kls, strict=True)):
            if cmask[j * chunk : (j + 1) * chunk].all():
                assert logged_j == pytest.approx(chunk * kl_j, rel=1e-5)
        ours = params_by_path(grads)
        for path, name in (
            (("lm_head",), "lm_head"),
            (("layers", 0, "mlp", "gate_kernel"), "layers.0.gate_proj"),
        ):
            theirs = dict(th_cur.named_parameters())[f"{name}.weight"].grad.numpy()
            assert rel_err(ours[path], theirs.T) < 1e-4, name


# -- the trainer's own path ---------------------------------------------------------------------------

QUESTIONS = (
    "Write f.",
    "Write a function f(x) that returns x plus one, for any integer x given.",
    "Write a function total(xs) that returns the sum of the numbers in the list xs, or 0 when the list is "
    "empty; do not use the built-in sum, loop over the items instead and add them one by one.",
)
# 3 prompts (61, 92 and 142 tokens with the tiny tokenizer) x 4 completions; a published device holds 2
# micro-batches of 2 rows: one prompt's 4 generations, so the rollout spans 3 device groups.
ROLLOUT = dict(
    steps=4, prompts_per_step=3, num_generations=4, chunk=2, accumulation=2, num_iterations=2,
    max_completion_length=16, diffusion_steps=16, generation_batch_size=12, max_prompt_length=200,
    learning_rate=1e-3, mask_seed_pick="published",
)  # fmt: skip


def text_length(completions, **_):
    return [len(c[-1]["content"]) / 10 for c in completions]


def _rollout_trainer(run_dir: Path, tiny_dir: Path, **over) -> RLTrainer:
    cfg = RLConfig(**{**ROLLOUT, **over})
    tasks = [Task(f"t{i}", q, ("assert f(1) == 2",), {}) for i, q in enumerate(QUESTIONS)]
    opts = RLOptions(show_progress=False, log=lambda m: None)
    return RLTrainer(run_dir, load_policy(tiny_dir, cfg), tasks, [Reward("len", text_length, 1.0)], cfg, opts)


class GivenMasks(PublishedCoupledGRPO):
    """The published arithmetic with the trainer's masks in place of ``set_seed`` draws: mask "seed" k is
    iteration k, and ``masks[k]`` is that iteration's (ratio, ``[b, T]`` draws) of the rows being scored.
    Tiling stays the published code's: with ``accumulate`` only the first ``b // accumulation`` rows are
    read and repeated, so the trainer's draws must repeat the same way to match."""

    def __init__(self, masks: list[tuple[float, np.ndarray]], **kw) -> None:
        super().__init__(**kw)
        self.masks = masks

    def draw(self, seed: int, b: int, length: int, accumulate: bool) -> tuple[float, torch.Tensor]:
        t, r = self.masks[seed]
        rows = torch.tensor(r[: b // self.gradient_accumulation_steps] if accumulate else r)
        if accumulate:
            rows = torch.cat([rows] * self.gradient_accumulation_steps, dim=0)
        matrix = torch.zeros((b, length))  # the prompt's columns are never masked: any value
        matrix[:, length - rows.shape[1] :] = rows
        return t, matrix


# <|im_end|> forced into the rollout's completions (row: positions): early, at the first token, twice (the
# first one ends the mask), at the last token. Rows 0-3 are the first prompt's, 4-7 the second's.
FORCED_END = {0: (3,), 5: (0,), 7: (6, 9), 10: (15,)}


def _forcing_the_end_of_turn(rt) -> None:
    """Make ``rt.run`` (the rollout's sampler) return ``<|im_end|>`` where ``FORCED_END`` says, before the
    trainer reads its completions: the end-of-turn mask is then the trainer's own, as in a real rollout."""
    real, seen = rt.run, [0]

    def run(rows, params, stream=False):
        for event in real(rows, params, stream=stream):
            if isinstance(event, BatchDone):
                for k, generated in enumerate(event.generated):
                    for at in FORCED_END.get(seen[0] + k, ()):
                        generated[at] = rt.tokenizer.im_end_id
                seen[0] += len(event.generated)
            yield event

    rt.run = run


def published_prompts(trainer: RLTrainer) -> list[list[int]]:
    """Each row's prompt as the published trainer encodes it (the chat template's text through the
    tokenizer, left-truncated to max_prompt_length), from the tasks themselves."""
    tok, cfg = trainer.rt.tokenizer, trainer.cfg
    tasks = [t for t in trainer.tasks_for(0) for _ in range(cfg.num_generations)]
    return [tok.encode(chat_prompt(t.messages()))[-cfg.max_prompt_length :] for t in tasks]


@pytest.fixture(scope="module")
def scored_rollout(models, tiny_dir, tmp_path_factory):
    """A trainer after its first rollout and first update (the reference model: a perturbed checkpoint,
    so that KL and reference scores are not the policy's), with its metrics and what the published code
    makes of the same completions: ``[B, I, T]`` old-policy and reference log-probs of each prompt's rows
    alone, the prompts and the completion mask."""
    jx, th = models
    trainer = _rollout_trainer(tmp_path_factory.mktemp("rollout"), tiny_dir)
    trainer.state["ref"] = jax.tree.map(jnp.copy, jx["ref"].state)
    _forcing_the_end_of_turn(trainer.rt)
    trainer.make_rollout(0)
    buf = trainer.buffer
    cfg = trainer.cfg
    masks = [trainer.masks(int(s)) for s in buf.mask_seeds]  # per iteration: ([B], [B, T])
    t_len = cfg.max_completion_length
    completions = torch.tensor(buf.ids[:, -t_len:])  # the rollout's sampled tokens
    prompts = published_prompts(trainer)
    published: dict = {"old": [], "ref": [], "prompts": prompts}
    published["mask"] = completion_mask(completions, trainer.rt.tokenizer.im_end_id).numpy()
    for lo in range(0, cfg.rows, cfg.num_generations):
        rows = slice(lo, lo + cfg.num_generations)
        prompt = torch.tensor(prompts[lo]).expand(cfg.num_generations, -1)
        alone = torch.cat([prompt, completions[rows]], dim=1)  # the prompt unpadded, then the completions
        impl = GivenMasks(
            [(float(t[lo]), r[rows]) for t, r in masks],
            mask_id=jx["old"].config.mask_token_id,
            num_iterations=cfg.num_iterations,
            gradient_accumulation_steps=cfg.accumulation,
            num_generations=cfg.num_generations,
        )
        old, ref = impl.score_rollout(th["old"], th["ref"], alone, t_len, list(range(cfg.num_iterations)))
        published["old"].append(old.numpy())
        published["ref"].append(ref.numpy())
    expected = {k: np.concatenate(v) if k in ("old", "ref") else v for k, v in published.items()}
    update = trainer.update()
    yield trainer, expected, update
    trainer.close()


def test_rollout_of_prompts_of_different_lengths_scores_as_published(scored_rollout):
    trainer, expected, update = scored_rollout
    buf, cfg = trainer.buffer, trainer.cfg
    lengths = buf.prompt_lengths.reshape(-1, cfg.num_generations)[:, 0]
    assert len(set(lengths.tolist())) == 3 and buf.ids.shape[1] - cfg.max_completion_length > min(lengths)
    # The trainer's prompts are the published ones: the same ids, the same lengths (its attention mask).
    width = buf.ids.shape[1] - cfg.max_completion_length
    for b, prompt in enumerate(expected["prompts"]):
        assert (
            buf.prompt_lengths[b] == len(prompt)
            and buf.ids[b, width - len(prompt) : width].tolist() == prompt
        )
    for name, scores in (("old", buf.old), ("ref", buf.ref)):
        ours = np.transpose(scores, (1, 0, 2))  # [B, I, T]
        worst = float(np.max(np.abs(ours - expected[name])))
        assert worst <= 1e-4, f"{name}: off by up to {worst:.4g} nats a token"


def test_the_end_of_turn_ends_the_completion_mask_as_published(scored_rollout):
    """With <|im_end|> in the rollout the trainer's mask is the published one, that token included, and
    the update's KL and loss are the published ones over it."""
    trainer, expected, update = scored_rollout
    buf, cfg = trainer.buffer, trainer.cfg
    mask = expected["mask"]
    assert mask[0].sum() == 4 and mask[5].sum() == 1 and mask[7].sum() == 7 and mask[10].all()
    assert np.array_equal(buf.completion_mask, mask), np.argwhere(buf.completion_mask != mask).tolist()
    # The update scores the current policy the same way: at the first step it is the old policy, so the
    # ratio is 1 and the loss is -A + beta KL per token, under the masks iterations_at(0) picks.
    ks, rows = trainer.iterations_at(0), np.arange(cfg.rows)
    d = expected["ref"][rows, ks] - expected["old"][rows, ks]
    kl = np.exp(d) - d - 1
    per_token_loss = -buf.advantages[:, None] + cfg.beta * kl

    def chunk_means(x: np.ndarray) -> np.ndarray:
        flat = (x * mask).reshape(-1, cfg.chunk * cfg.max_completion_length)
        return flat.sum(1) / mask.reshape(flat.shape).sum(1)

    assert update["kl"] == pytest.approx(float(chunk_means(kl).mean()), rel=1e-3)
    assert update["loss"] == pytest.approx(float(chunk_means(per_token_loss).mean()), rel=1e-3, abs=1e-6)
    assert update["kl"] > 1e-4 and update["clip_ratio"] == 0.0


def test_each_device_group_draws_its_own_masks_and_the_seed_reproduces_them(
    scored_rollout, tiny_dir, tmp_path
):
    trainer, _, _ = scored_rollout
    cfg = trainer.cfg
    seeds = trainer.mask_seeds(0)
    assert len(set(seeds.tolist())) == cfg.num_iterations
    t, r = trainer.masks(int(seeds[0]))
    group = cfg.chunk * cfg.accumulation
    assert cfg.rows // group == 3
    ratios = t.reshape(3, group)
    assert np.all(ratios == ratios[:, :1]) and len(set(ratios[:, 0].tolist())) == 3  # one ratio a group
    assert np.all((0.2 <= ratios) & (ratios < 0.8))
    blocks = r.reshape(3, cfg.accumulation, cfg.chunk, -1)
    assert np.array_equal(blocks[:, 0], blocks[:, 1])  # a group's micro-batches share its draws
    assert not np.allclose(blocks[0, 0], blocks[1, 0]) and not np.allclose(blocks[1, 0], blocks[2, 0])
    # Another trainer with the same seed: the same seeds and masks; another seed: others.
    again = _rollout_trainer(tmp_path / "again", tiny_dir)
    assert np.array_equal(again.mask_seeds(0), seeds)
    t2, r2 = again.masks(int(seeds[0]))
    assert np.array_equal(t2, t) and np.array_equal(r2, r)
    t3, _ = again.masks(int(seeds[1]))
    assert not np.any(t3 == t)
    other = _rollout_trainer(tmp_path / "other", tiny_dir, seed=7)
    assert not np.array_equal(other.mask_seeds(0), seeds)
    # The published seed pick: each device's first micro-batch uses iteration 1, its second iteration 0,
    # at both steps of a rollout; by default every row uses iteration s % 2 at step s.
    picked = np.tile(np.repeat([1, 0], cfg.chunk), 3)
    assert all(np.array_equal(trainer.iterations_at(s), picked) for s in range(4))
    plain = _rollout_trainer(tmp_path / "plain", tiny_dir, mask_seed_pick="iteration")
    assert [plain.iterations_at(s).tolist() for s in range(3)] == [[s % 2] * 12 for s in range(3)]


def test_one_warmup_step_is_the_recipes_warmup_ratio():
    """``--warmup 1`` is the recipe's ``warmup_ratio: 0.0001`` with transformers' cosine_with_min_lr
    schedule (``ceil(0.0001 * steps)`` warm-up steps, 1 below 10,000 steps): learning rate 0 at the first
    step, the peak at the second, then a cosine to 0.1 of it."""
    steps, peak = 5250, 1e-6  # ~21K hard AceCode prompts / 8 a rollout x 2 iterations
    warmup = math.ceil(0.0001 * steps)

    def published(step: int) -> float:  # transformers' lr lambda, times the peak
        if step < warmup:
            return peak * step / max(1, warmup)
        progress = (step - warmup) / max(1, steps - warmup)
        return peak * (0.5 * (1 + math.cos(math.pi * progress)) * 0.9 + 0.1)

    ours = schedule(TrainConfig(steps=steps, learning_rate=peak, warmup_steps=1, min_lr_ratio=0.1))
    for step in (0, 1, 2, 100, 2625, 5249):
        assert float(ours(step)) == pytest.approx(published(step), rel=1e-5, abs=1e-15), step
    assert warmup == 1 and float(ours(0)) == 0.0
