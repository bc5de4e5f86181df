"""The coupled-GRPO loop: rollouts, rewards, ``num_iterations`` updates per rollout, reference sync.

One step is one optimizer update (the published ``global_step``). Every ``num_iterations`` steps a
rollout is made: ``prompts_per_step`` tasks, ``num_generations`` completions each, rewarded, turned into
leave-one-out advantages, and scored by the policy that made it (old log-probs, when ``num_iterations >
1``) and by the reference model, each under every iteration's masks. Step ``s`` then updates the policy
on that rollout with the masks of iteration ``s % num_iterations`` (``iterations_at``). Every
``ref_sync_steps`` steps the reference model moves toward the policy: ``ref = alpha * policy + (1 - alpha)
* ref`` (TRL's ``SyncRefModelCallback``, alpha 0.6 by default).

Rows are laid out as the published run lays them over its devices: each prompt's ``num_generations``
completions adjacent, ``chunk x accumulation`` consecutive rows per device group (TRL's RepeatSampler with
the recipe's 5 per device x 2 accumulation steps gives each of 8 devices one prompt's 10 generations).
Each device group draws its own masks (``coupled.group_masks``), and every completion is scored on its own
prompt alone: the left padding that joins a rollout's prompts is hidden from the scoring passes.

Exact resume: the tasks of rollout ``r``, its sampling seeds and its mask seeds are pure functions of
``(seed, r)``; a checkpoint holds the policy, the optimizer state, the reference model and the current
rollout (ids, mask, advantages, old and reference log-probs, mask seeds), so a run killed after the
checkpoint at step ``k`` and resumed computes the same step ``k + 1``, inside a rollout's iterations too.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from functools import partial
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from model_runtime.errors import InputError
from model_runtime.runtime import Runtime
from model_runtime.train.checkpoints import RunCheckpoints, checkpoint_due, interruptible, last_step
from model_runtime.train.config import TrainConfig
from model_runtime.train.loop import make_optimizer, schedule
from model_runtime.train.rl import coupled, rollout
from model_runtime.train.rl.config import Reward, RLConfig, RLOptions
from model_runtime.train.rl.progress import Progress
from model_runtime.train.rl.tasks import Task


@dataclass(frozen=True)
class ScoredRollout:
    """The rollout the updates use until the next one, with everything a resume inside its iterations
    needs: ``[B, L]`` ids (left-padded prompts, then completions), ``[B]`` prompt lengths, ``[B, T]``
    completion mask, ``[B]`` advantages, ``[I]`` mask seeds and, per iteration, ``[I, B, T]`` old-policy
    log-probs (with ``num_iterations > 1``) and reference log-probs (with ``beta != 0``)."""

    rollout: int
    ids: np.ndarray
    prompt_lengths: np.ndarray
    completion_mask: np.ndarray
    advantages: np.ndarray
    mask_seeds: np.ndarray
    old: np.ndarray | None = None
    ref: np.ndarray | None = None

    def arrays(self) -> dict[str, np.ndarray | np.int64]:
        """What a checkpoint holds: the arrays by field name (absent scores left out)."""
        out: dict[str, np.ndarray | np.int64] = {"rollout": np.int64(self.rollout)}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name != "rollout" and value is not None:
                out[f.name] = value
        return out

    @classmethod
    def from_arrays(cls, saved: Mapping[str, Any]) -> ScoredRollout:
        """The rollout ``arrays`` returned, read back from a checkpoint."""
        a = {k: np.asarray(v) for k, v in saved.items()}
        return cls(
            rollout=int(a["rollout"]),
            ids=a["ids"],
            prompt_lengths=a["prompt_lengths"],
            completion_mask=a["completion_mask"],
            advantages=a["advantages"],
            mask_seeds=a["mask_seeds"],
            old=a.get("old"),
            ref=a.get("ref"),
        )


class RLTrainer:
    """Owns the policy, optimizer and reference state, the current rollout and the compiled programs."""

    def __init__(
        self,
        run_dir: Path,
        rt: Runtime,  # loaded in float32: its weights are the starting policy
        tasks: Sequence[Task],
        rewards: Sequence[Reward],
        cfg: RLConfig,
        options: RLOptions | None = None,
    ) -> None:
        if len(tasks) < cfg.prompts_per_step:
            raise InputError(f"{len(tasks)} tasks, fewer than prompts_per_step={cfg.prompts_per_step}")
        if not rewards:
            raise InputError("no reward functions")
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.rt, self.tasks, self.rewards, self.cfg = rt, list(tasks), list(rewards), cfg
        self.options = options or RLOptions()
        micro = self.options.micro_batch or cfg.rows
        if micro % cfg.chunk or cfg.rows % micro:
            raise InputError(f"micro_batch {micro} must be a multiple of chunk and divide {cfg.rows} rows")
        self.micro = micro
        self.mask_id = rt.config.mask_token_id
        params = rt.state
        self._shardings = jax.tree.map(lambda x: x.sharding, params)
        mesh = rt.mesh
        self._rows = None if mesh is None else NamedSharding(mesh, PartitionSpec("dp"))
        self.tx = make_optimizer(self._optax_config(), params)
        self.state: dict[str, Any] = {"params": params, "opt_state": self.tx.init(params)}
        if cfg.beta != 0.0:
            self.state["ref"] = jax.tree.map(jnp.copy, params)  # the starting policy, as published
        self.step = 0
        self.buffer: ScoredRollout | None = None
        self.settings = coupled.LossSettings(cfg.epsilon, cfg.epsilon, cfg.beta, cfg.chunk)
        self.sampling = rollout.sampling(
            cfg.max_completion_length,
            cfg.diffusion_steps,
            cfg.temperature,
            cfg.top_p,
            cfg.rollout_decoder,
            cfg.block_length,
            cfg.threshold,
        )
        graphdef, mask_id = rt.graphdef, self.mask_id
        # The process's programs (module level, keyed by their statics): a trainer made again in the same
        # process (a resumed run, a test's) traces and compiles them once, not once per trainer.
        self._logps = lambda params, *args: LOGPS(graphdef, params, *args, mask_id=mask_id)
        self._grad = partial(LOSS_AND_GRAD, graphdef, mask_id, self.settings)
        self._apply = jax.jit(self._apply_fn, donate_argnums=(0,))
        alpha = cfg.ref_mixup_alpha
        self._mix = jax.jit(lambda ref, p: jax.tree.map(lambda a, b: (1 - alpha) * a + alpha * b, ref, p))
        # Summing micro-batch gradients and their norm are one program each, not one per parameter: on a
        # mesh every per-leaf norm is a collective, and dozens of them queued at once can deadlock XLA:CPU's
        # virtual devices (each device allows 32 programs in flight).
        self._add = jax.jit(lambda a, b: jax.tree.map(jnp.add, a, b))
        self._mean = jax.jit(lambda g, parts: jax.tree.map(lambda x: x / parts, g), static_argnums=1)
        self._norm = jax.jit(optax.tree.norm)
        self.checkpoints = RunCheckpoints(self.run_dir, self.options.keep_checkpoints)

    def _optax_config(self) -> TrainConfig:
        c = self.cfg
        return TrainConfig(
            steps=c.steps,
            learning_rate=c.learning_rate,
            warmup_steps=c.warmup_steps,
            min_lr_ratio=c.min_lr_ratio,
            weight_decay=c.weight_decay,
            b1=c.b1,
            b2=c.b2,
            grad_clip=c.grad_clip,
            seed=c.seed,
        )

    def _apply_fn(self, state: dict[str, Any], grads: Any) -> dict[str, Any]:
        updates, opt_state = self.tx.update(grads, state["opt_state"], state["params"])
        return dict(state, params=optax.apply_updates(state["params"], updates), opt_state=opt_state)

    # -- rollouts -----------------------------------------------------------------------------------
    def tasks_for(self, r: int) -> list[Task]:
        """Rollout ``r``'s tasks: a seeded shuffle per epoch cut into groups (a short tail is dropped)."""
        per = self.cfg.prompts_per_step
        per_epoch = len(self.tasks) // per
        epoch, j = divmod(r, per_epoch)
        order = np.random.default_rng([self.cfg.seed, epoch]).permutation(len(self.tasks))
        return [self.tasks[i] for i in order[j * per : (j + 1) * per]]

    def mask_seeds(self, r: int) -> np.ndarray:
        """One seed per iteration (published ``random_masking``), or 42 for every iteration without."""
        if not self.cfg.random_masking:
            return np.full(self.cfg.num_iterations, 42, np.int64)
        return np.random.default_rng([self.cfg.seed, r, 1]).integers(0, 2**31, self.cfg.num_iterations)

    def masks(self, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """Every row's mask ratio ``[B]`` and draws ``[B, T]`` under mask seed ``seed``: one draw per device
        group (``coupled.group_masks``)."""
        c = self.cfg
        key = jax.random.key(int(seed))
        draw = coupled.group_masks(key, c.device_groups, c.chunk, c.accumulation, c.max_completion_length)
        return np.asarray(draw.t), np.asarray(draw.r)

    def iterations_at(self, step: int) -> np.ndarray:
        """Which iteration's masks (and old and reference log-probs) each row uses at optimizer step
        ``step`` (0-based): ``[B]``.

        ``mask_seed_pick="iteration"``: ``step % num_iterations`` for every row. ``"published"``: the
        published ``compute_loss`` takes ``_step % num_iterations`` after ``_prepare_inputs`` has counted
        the micro-batch, so micro-batch ``j`` of a device at step ``s`` uses iteration ``(s * accumulation
        + j + 1) % num_iterations``; with the recipe's accumulation 2 and 2 iterations the first micro-batch
        uses iteration 1 and the second iteration 0 at both steps of a rollout.
        """
        c = self.cfg
        if c.mask_seed_pick == "iteration":
            return np.full(c.rows, step % c.num_iterations)
        micro = (np.arange(c.rows) % c.device_rows) // c.chunk
        return (step * c.accumulation + micro + 1) % c.num_iterations

    def _put(self, x: np.ndarray) -> jax.Array:
        return jnp.asarray(x) if self._rows is None else jax.device_put(x, self._rows)

    def _attention_mask(self, prompt_lengths: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """The rollout's ``[B, L]`` scoring mask: each row's own prompt and completion, not its padding."""
        t_len = self.cfg.max_completion_length
        return rollout.attention_mask(prompt_lengths, ids.shape[1] - t_len, t_len)

    def _scores(self, params: Any, ids: np.ndarray, attn: np.ndarray, seeds: np.ndarray) -> np.ndarray:
        """Coupled log-probs ``[I, B, T]`` of every row under each mask seed, micro-batch by micro-batch."""
        per_seed = []
        for seed in seeds:
            t, r = self.masks(int(seed))
            out = []
            for lo in range(0, len(ids), self.micro):
                sl = slice(lo, lo + self.micro)
                args = (self._put(ids[sl]), self._put(attn[sl]), self._put(t[sl]), self._put(r[sl]))
                out.append(np.asarray(self._logps(params, *args)))
            per_seed.append(np.concatenate(out))
        return np.stack(per_seed)

    def rewards_of(self, tasks: Sequence[Task], texts: Sequence[str], step: int) -> tuple[np.ndarray, int]:
        """``[B, F]`` rewards (NaN where a function gave None or failed) and the number of failures.

        A reward function that raises, or returns the wrong number of values, counts 0 for the whole
        batch; the error is logged with the tasks it was scoring. The run goes on.
        """
        prompts = [t.messages() for t in tasks]
        completions = [[{"role": "assistant", "content": text}] for text in texts]
        columns: dict[str, list[object]] = {}
        for t in tasks:
            for k, v in t.columns().items():
                columns.setdefault(k, []).append(v)
        columns = {k: v for k, v in columns.items() if len(v) == len(tasks)}
        out = np.full((len(tasks), len(self.rewards)), np.nan, np.float32)
        failures = 0
        for j, reward in enumerate(self.rewards):
            try:
                run_name = str(self.run_dir)
                values = list(
                    reward.fn(
                        prompts=prompts, completions=completions, step=step, run_name=run_name, **columns
                    )
                )
                if len(values) != len(tasks):
                    raise ValueError(f"returned {len(values)} values for {len(tasks)} completions")
                out[:, j] = [np.nan if v is None else float(v) for v in values]
            except Exception as exc:  # a user's reward must never stop the run, nor fail silently
                failures += 1
                ids = sorted({t.task_id for t in tasks})
                self.options.log(
                    f"reward {reward.name!r} failed at step {step} ({type(exc).__name__}: {exc}); "
                    f"counted as 0 for tasks {', '.join(ids[:5])}{' ...' if len(ids) > 5 else ''}"
                )
        return out, failures

    def make_rollout(self, r: int) -> dict[str, Any]:
        """Rollout ``r``: completions, rewards, advantages and the per-iteration old/reference scores.

        Sets ``self.buffer`` and returns the rollout's metrics.
        """
        cfg = self.cfg
        tasks = self.tasks_for(r)
        rows = [t for t in tasks for _ in range(cfg.num_generations)]  # each prompt G times, adjacent
        prompts = rollout.encode_prompts(self.rt, [t.messages() for t in rows], cfg.max_prompt_length)
        params = self.state["params"]
        seed = int(np.random.default_rng([cfg.seed, r, 0]).integers(0, 2**31))
        ro = rollout.generate(
            self.rt, params, prompts, self.sampling, batch_size=cfg.generation_batch_size, seed=seed
        )
        t0 = time.perf_counter()
        per_func, failures = self.rewards_of(rows, ro.texts, self.step)
        reward_s = time.perf_counter() - t0
        weights = np.array([w.weight for w in self.rewards], np.float32)
        total = np.nansum(per_func * weights, axis=1).astype(np.float32)  # published nansum
        seeds = self.mask_seeds(r)
        ids = ro.ids
        attn = self._attention_mask(ro.prompt_lengths, ids)
        self.buffer = ScoredRollout(
            rollout=r,
            ids=ids,
            prompt_lengths=ro.prompt_lengths,
            completion_mask=ro.completion_mask,
            advantages=coupled.leave_one_out(total, cfg.num_generations),
            mask_seeds=seeds,
            old=None if cfg.num_iterations == 1 else self._scores(params, ids, attn, seeds),
            ref=None if cfg.beta == 0.0 else self._scores(self.state["ref"], ids, attn, seeds),
        )
        std = coupled.group_std(total, cfg.num_generations)
        metrics: dict[str, Any] = {
            "rollout": r,
            "reward": float(total.mean()),
            "reward_std": float(std.mean()),
            "zero_std_ratio": float(np.mean(std < 1e-6)),
            "completion_length": float(ro.completion_mask.sum(axis=1).mean()),
            "rollouts_per_s": len(rows) / max(ro.seconds, 1e-9),
            "rollout_seconds": round(ro.seconds, 3),
            "reward_seconds": round(reward_s, 3),
            "reward_errors": failures,
        }
        for j, reward in enumerate(self.rewards):
            col = np.nan_to_num(per_func[:, j])
            metrics[f"rewards/{reward.name}"] = float(col.mean())
            rate = rate_of(reward.name)
            if rate is not None:
                metrics[rate] = float(np.mean(col >= 1.0))  # every assert passed / a well-formed block
        metrics["sample"] = {"task": rows[0].task_id, "completion": ro.texts[0][:400]}
        return metrics

    # -- one update ---------------------------------------------------------------------------------
    def update(self) -> dict[str, float]:
        """One optimizer step on the current rollout, each row with the masks of ``iterations_at``."""
        cfg, buf = self.cfg, self.buffer
        assert buf is not None, "update() needs a rollout (make_rollout or restore_latest)"
        ks = self.iterations_at(self.step)
        rows = np.arange(cfg.rows)
        draws = [self.masks(int(s)) for s in buf.mask_seeds]
        t = np.stack([d[0] for d in draws])[ks, rows]  # [B]
        r = np.stack([d[1] for d in draws])[ks, rows]  # [B, T]
        old = None if buf.old is None else buf.old[ks, rows]
        ref = None if buf.ref is None else buf.ref[ks, rows]
        attn = self._attention_mask(buf.prompt_lengths, buf.ids)
        parts = len(buf.ids) // self.micro
        grads: Any = None
        sums: dict[str, float] = {}
        for lo in range(0, len(buf.ids), self.micro):
            sl = slice(lo, lo + self.micro)
            (loss, metrics), g = self._grad(
                self.state["params"],
                self._put(buf.ids[sl]),
                self._put(attn[sl]),
                self._put(t[sl]),
                self._put(r[sl]),
                None if old is None else self._put(old[sl]),
                None if ref is None else self._put(ref[sl]),
                self._put(buf.advantages[sl]),
                self._put(buf.completion_mask[sl]),
            )
            # Every micro-batch holds the same number of chunks: the batch loss is their plain mean.
            grads = g if grads is None else self._add(grads, g)
            for name, v in {"loss": loss, **metrics}.items():
                sums[name] = sums.get(name, 0.0) + float(v) / parts
        if parts > 1:
            grads = self._mean(grads, parts)
        sums["grad_norm"] = float(self._norm(grads))
        sums["lr"] = float(schedule(self._optax_config())(self.step))
        sums["iteration"] = self.step % cfg.num_iterations  # the update's place in its rollout
        self.state = self._apply(self.state, grads)
        self.state["params"] = jax.device_put(self.state["params"], self._shardings)
        self.step += 1
        if cfg.beta != 0.0 and self.step % cfg.ref_sync_steps == 0:
            mixed = self._mix(self.state["ref"], self.state["params"])
            self.state["ref"] = jax.device_put(mixed, self._shardings)
        return sums

    # -- checkpoints --------------------------------------------------------------------------------
    def save(self) -> None:
        """The whole state and the current rollout at ``self.step`` (blocking)."""
        if self.buffer is not None:
            self.checkpoints.save(self.step, self.state, {"rollout": self.buffer.arrays()})

    def restore_latest(self) -> bool:
        """Load the newest checkpoint (state and rollout), if any; returns whether one was found."""
        restored = self.checkpoints.restore_latest(self.state, extras=("rollout",))
        if restored is None:
            return False
        self.state, self.step = restored.state, restored.step
        self.buffer = ScoredRollout.from_arrays(restored.extras["rollout"])
        return True

    def close(self) -> None:
        self.checkpoints.close()

    # -- the loop -----------------------------------------------------------------------------------
    def run(self) -> list[dict[str, Any]]:
        """Train from ``self.step`` to ``cfg.steps`` (or ``stop_at``); one metrics.jsonl line per step.
        Ctrl-C or SIGTERM checkpoints after the step in progress and stops (KeyboardInterrupt)."""
        cfg, opts = self.cfg, self.options
        last = last_step(cfg.steps, opts.stop_at)
        history: list[dict[str, Any]] = []
        with interruptible(lambda: self.state, self.save) as stop:
            with Progress(cfg.steps, self.step, enabled=opts.show_progress) as progress:
                while self.step < last:
                    t0 = time.perf_counter()
                    record: dict[str, Any] = {"step": self.step + 1}
                    if self.step % cfg.num_iterations == 0:
                        progress.phase("rollout")
                        record.update(self.make_rollout(self.step // cfg.num_iterations))
                    progress.phase("update")
                    record.update(self.update())
                    if not math.isfinite(record["loss"]):
                        raise FloatingPointError(f"the loss became {record['loss']} at step {self.step}")
                    record.update(time=time.time(), seconds=round(time.perf_counter() - t0, 3))
                    self.checkpoints.log(record)
                    history.append(record)
                    progress.update(self.step, record)
                    if opts.on_step is not None:
                        opts.on_step(self.step, record)
                    if checkpoint_due(self.step, opts.checkpoint_every, last):
                        self.save()
                    stop.check()
        return history


def rate_of(reward_name: str) -> str | None:
    """``pass_rate`` for a reward function named ``code`` (built in, or ``pkg.mod:code``), ``format_rate``
    for ``code_format``: the share of completions scoring 1.0 is then every assert passed / a well-formed
    block."""
    short = reward_name.rsplit(":", 1)[-1].rsplit(".", 1)[-1]
    return {"code": "pass_rate", "code_format": "format_rate"}.get(short)


def _loss_and_grad(
    graphdef: nnx.GraphDef,
    mask_id: int,
    settings: coupled.LossSettings,
    params: nnx.State,
    ids: jax.Array,
    attn: jax.Array,
    t: jax.Array,
    r: jax.Array,
    old: jax.Array | None,
    ref: jax.Array | None,
    adv: jax.Array,
    cmask: jax.Array,
) -> tuple[tuple[jax.Array, dict[str, jax.Array]], nnx.State]:
    """The coupled-GRPO loss of one micro-batch, its metrics, and its gradient with respect to ``params``."""

    def loss_fn(p: nnx.State) -> tuple[jax.Array, dict[str, jax.Array]]:
        logps = coupled.coupled_logps(graphdef, p, ids, attn, t, r, mask_id)
        return coupled.grpo_loss(logps, old, ref, adv, cmask, settings)

    return jax.value_and_grad(loss_fn, has_aux=True)(params)


# The trainer's scoring and gradient programs (the parity tests run these very ones).
LOGPS = jax.jit(coupled.coupled_logps, static_argnames=("graphdef", "mask_id"))
LOSS_AND_GRAD = jax.jit(_loss_and_grad, static_argnums=(0, 1, 2))
