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

import json
import math
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec

from model_runtime.errors import InputError
from model_runtime.train.loop import TrainConfig, make_optimizer, schedule
from model_runtime.train.rl import coupled, rollout
from model_runtime.train.rl.progress import Progress
from model_runtime.train.rl.tasks import Task


@dataclass(frozen=True)
class RLConfig:
    """Everything that changes the computed weights (recorded in run.json). Defaults: the published
    recipe (recipes/config_coupled_code.yaml with TRL's defaults), except ``steps`` and
    ``mask_seed_pick`` (docs/training.md says why)."""

    steps: int = 100
    prompts_per_step: int = 8  # unique prompts per rollout: 8 x 10 = 5 per device x 8 GPUs x 2 accum.
    num_generations: int = 10
    chunk: int = 5  # rows per token-level normalisation (per_device_train_batch_size)
    # Published gradient_accumulation_steps: a device group (one mask draw) is chunk x accumulation rows.
    accumulation: int = 2
    # "iteration": step s uses the masks of iteration s % num_iterations for every row. "published": the
    # published pick, made after TRL's micro-step counter has moved (see RLTrainer.iterations_at).
    mask_seed_pick: str = "iteration"
    num_iterations: int = 2
    beta: float = 0.01
    epsilon: float = 0.5
    ref_sync_steps: int = 64
    ref_mixup_alpha: float = 0.6
    learning_rate: float = 1e-6
    warmup_steps: int = 0
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    b1: float = 0.9
    b2: float = 0.99
    grad_clip: float = 0.2
    max_prompt_length: int = 200
    max_completion_length: int = 256
    diffusion_steps: int = 256
    temperature: float = 1.0
    top_p: float = 0.95
    generation_batch_size: int = 10
    # Not the recipe: "fast" samples rollouts with diffu's block-wise decoder (see rollout.py).
    rollout_decoder: str = "reference"
    block_length: int = 32
    threshold: float = 0.9
    random_masking: bool = True
    seed: int = 42

    def __post_init__(self) -> None:
        def need(cond: bool, name: str, msg: str) -> None:
            if not cond:
                raise InputError(f"{name}: {msg}, got {getattr(self, name)}")

        for name in (
            "steps",
            "prompts_per_step",
            "chunk",
            "accumulation",
            "num_iterations",
            "ref_sync_steps",
        ):
            need(getattr(self, name) >= 1, name, "must be >= 1")
        for name in (
            "max_prompt_length",
            "max_completion_length",
            "diffusion_steps",
            "generation_batch_size",
        ):
            need(getattr(self, name) >= 1, name, "must be >= 1")
        need(self.num_generations >= 2, "num_generations", "must be >= 2 (the advantage leaves one out)")
        need(self.rows % self.chunk == 0, "chunk", f"must divide the {self.rows} completions per rollout")
        need(
            self.rows % self.device_rows == 0,
            "accumulation",
            f"chunk x accumulation ({self.device_rows} rows per device group) must divide the {self.rows} "
            "completions per rollout",
        )
        need(
            self.mask_seed_pick in ("iteration", "published"),
            "mask_seed_pick",
            "must be iteration or published",
        )
        need(self.beta >= 0, "beta", "must be >= 0")
        need(0 < self.epsilon < 1, "epsilon", "must be in (0, 1)")
        need(0 <= self.ref_mixup_alpha <= 1, "ref_mixup_alpha", "must be in [0, 1]")
        need(self.learning_rate > 0, "learning_rate", "must be > 0")
        need(0 <= self.warmup_steps <= self.steps, "warmup_steps", f"must be in [0, steps={self.steps}]")
        need(self.temperature >= 0, "temperature", "must be >= 0")
        need(0 < self.top_p <= 1, "top_p", "must be in (0, 1]")
        need(self.rollout_decoder in ("reference", "fast"), "rollout_decoder", "must be reference or fast")
        need(self.block_length >= 1, "block_length", "must be >= 1")
        need(0 < self.threshold <= 1, "threshold", "must be in (0, 1]")

    @property
    def rows(self) -> int:
        return self.prompts_per_step * self.num_generations

    @property
    def device_rows(self) -> int:
        """Rows of one published device: a micro-batch (chunk) per accumulation step."""
        return self.chunk * self.accumulation

    @property
    def device_groups(self) -> int:
        """How many devices the published run would spread a rollout over (8 in the recipe)."""
        return self.rows // self.device_rows


@dataclass(frozen=True)
class Reward:
    """A reward function (TRL's signature), its name in metrics and logs, and its weight."""

    name: str
    fn: Callable[..., Sequence[float | None]]
    weight: float


@dataclass
class RLOptions:
    """How the loop runs (never what it computes)."""

    checkpoint_every: int = 10
    keep_checkpoints: int = 2
    micro_batch: int | None = None  # rows per forward/backward (a multiple of chunk); None: all at once
    show_progress: bool = True
    log: Callable[[str], None] = print
    on_step: Callable[[int, dict[str, Any]], None] | None = None
    stop_at: int | None = None  # end this invocation after this step (checkpointed), short of cfg.steps


class RLTrainer:
    """Owns the policy, optimizer and reference state, the current rollout and the compiled programs."""

    def __init__(
        self,
        run_dir: Path,
        rt: Any,  # model_runtime.runtime.Runtime loaded in float32: its weights are the starting policy
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
        self.buffer: dict[str, np.ndarray] | None = None
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
        graphdef = rt.graphdef
        self._logps = jax.jit(partial(coupled.coupled_logps, graphdef, mask_id=self.mask_id))
        self._grad = jax.jit(partial(_loss_and_grad, graphdef, self.mask_id, self.settings))
        self._apply = jax.jit(self._apply_fn, donate_argnums=(0,))
        alpha = cfg.ref_mixup_alpha
        self._mix = jax.jit(lambda ref, p: jax.tree.map(lambda a, b: (1 - alpha) * a + alpha * b, ref, p))
        # Summing micro-batch gradients and their norm are one program each, not one per parameter: on a
        # mesh every per-leaf norm is a collective, and dozens of them queued at once can deadlock XLA:CPU's
        # virtual devices (each device allows 32 programs in flight).
        self._add = jax.jit(lambda a, b: jax.tree.map(jnp.add, a, b))
        self._mean = jax.jit(lambda g, parts: jax.tree.map(lambda x: x / parts, g), static_argnums=1)
        self._norm = jax.jit(optax.tree.norm)
        self._manager = None

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

    def _apply_fn(self, state: dict, grads: Any) -> dict:
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

    def _attention_mask(self, buf: dict[str, np.ndarray]) -> np.ndarray:
        """The rollout's ``[B, L]`` scoring mask: each row's own prompt and completion, not its padding."""
        t_len = self.cfg.max_completion_length
        return rollout.attention_mask(buf["prompt_lengths"], buf["ids"].shape[1] - t_len, t_len)

    def _score(self, params: Any, ids: np.ndarray, attn: np.ndarray, seed: int) -> np.ndarray:
        """Coupled log-probs ``[B, T]`` of every row under mask seed ``seed``, micro-batch by micro-batch."""
        t, r = self.masks(seed)
        out = []
        for lo in range(0, len(ids), self.micro):
            sl = slice(lo, lo + self.micro)
            args = (self._put(ids[sl]), self._put(attn[sl]), self._put(t[sl]), self._put(r[sl]))
            out.append(np.asarray(self._logps(params, *args)))
        return np.concatenate(out)

    def rewards_of(self, tasks: Sequence[Task], texts: Sequence[str], step: int) -> tuple[np.ndarray, int]:
        """``[B, F]`` rewards (NaN where a function gave None or failed) and the number of failures.

        A reward function that raises, or returns the wrong number of values, counts 0 for the whole
        batch; the error is logged with the tasks it was scoring. The run goes on.
        """
        prompts = [t.messages() for t in tasks]
        completions = [[{"role": "assistant", "content": text}] for text in texts]
        columns: dict[str, list] = {}
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
        buffer = {
            "rollout": np.int64(r),
            "ids": ids,
            "prompt_lengths": ro.prompt_lengths,
            "completion_mask": ro.completion_mask,
            "advantages": coupled.leave_one_out(total, cfg.num_generations),
            "mask_seeds": seeds,
        }
        attn = self._attention_mask(buffer)
        if cfg.num_iterations > 1:
            buffer["old"] = np.stack([self._score(params, ids, attn, s) for s in seeds])  # [I, B, T]
        if cfg.beta != 0.0:
            buffer["ref"] = np.stack([self._score(self.state["ref"], ids, attn, s) for s in seeds])
        self.buffer = buffer
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
        draws = [self.masks(s) for s in buf["mask_seeds"]]
        t = np.stack([d[0] for d in draws])[ks, rows]  # [B]
        r = np.stack([d[1] for d in draws])[ks, rows]  # [B, T]
        old = None if "old" not in buf else buf["old"][ks, rows]
        ref = None if "ref" not in buf else buf["ref"][ks, rows]
        attn = self._attention_mask(buf)
        parts = len(buf["ids"]) // self.micro
        grads, sums = None, {}
        for lo in range(0, len(buf["ids"]), self.micro):
            sl = slice(lo, lo + self.micro)
            (loss, metrics), g = self._grad(
                self.state["params"],
                self._put(buf["ids"][sl]),
                self._put(attn[sl]),
                self._put(t[sl]),
                self._put(r[sl]),
                None if old is None else self._put(old[sl]),
                None if ref is None else self._put(ref[sl]),
                self._put(buf["advantages"][sl]),
                self._put(buf["completion_mask"][sl]),
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
    @property
    def manager(self) -> Any:
        if self._manager is None:
            import orbax.checkpoint as ocp

            self._manager = ocp.CheckpointManager(
                (self.run_dir / "checkpoints").absolute(),
                options=ocp.CheckpointManagerOptions(max_to_keep=self.options.keep_checkpoints, create=True),
            )
        return self._manager

    def save(self) -> None:
        """The whole state and the current rollout at ``self.step`` (blocking)."""
        import orbax.checkpoint as ocp

        if self.step in self.manager.all_steps() or self.buffer is None:
            return
        # Leaves only: the tree structure (optax tuples, NNX State) is rebuilt from the live state.
        args = ocp.args.Composite(
            state=ocp.args.StandardSave(jax.tree.leaves(self.state)),
            rollout=ocp.args.StandardSave(self.buffer),
        )
        self.manager.save(self.step, args=args)
        self.manager.wait_until_finished()

    def restore_latest(self) -> bool:
        import orbax.checkpoint as ocp

        step = self.manager.latest_step()
        if step is None:
            return False
        leaves, treedef = jax.tree.flatten(self.state)
        abstract = [jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding) for x in leaves]
        out = self.manager.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract), rollout=ocp.args.StandardRestore()
            ),
        )
        self.state = jax.tree.unflatten(treedef, list(out.state))
        self.buffer = {k: np.asarray(v) for k, v in out.rollout.items()}
        self.step = int(step)
        # Steps logged after this checkpoint (a kill before the next one) are computed again: drop them.
        path = self.run_dir / "metrics.jsonl"
        if path.is_file():
            lines = path.read_text(encoding="utf-8").splitlines()
            kept = [x for x in lines if json.loads(x)["step"] <= self.step]
            path.write_text("".join(x + "\n" for x in kept), encoding="utf-8")
        return True

    def close(self) -> None:
        if self._manager is not None:
            self._manager.close()
            self._manager = None

    # -- the loop -----------------------------------------------------------------------------------
    def run(self) -> list[dict[str, Any]]:
        """Train from ``self.step`` to ``cfg.steps`` (or ``stop_at``); one metrics.jsonl line per step.
        Ctrl-C or SIGTERM checkpoints after the step in progress and stops (KeyboardInterrupt)."""
        cfg, opts = self.cfg, self.options
        # stop_at cuts this invocation short without touching the schedule (cfg.steps sets the LR decay).
        last = cfg.steps if opts.stop_at is None else min(cfg.steps, opts.stop_at)
        history: list[dict[str, Any]] = []
        self._stop: int | None = None
        previous = {}
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                previous[sig] = signal.signal(sig, self._request_stop)
            except ValueError:  # not the main thread
                pass
        try:
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
                    self._log(record)
                    history.append(record)
                    progress.update(self.step, record)
                    if opts.on_step is not None:
                        opts.on_step(self.step, record)
                    if self.step % opts.checkpoint_every == 0 or self.step == last:
                        self.save()
                    if self._stop is not None:
                        self.save()
                        raise KeyboardInterrupt(f"signal {self._stop}")
        except KeyboardInterrupt:
            # Whole unless the interrupt hit inside the update (a second Ctrl-C): then the donated state
            # is gone and the last periodic checkpoint is what a resume gets.
            if not any(x.is_deleted() for x in jax.tree.leaves(self.state)):
                self.save()
            raise
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return history

    def _request_stop(self, signum: int, frame: Any) -> None:
        if self._stop is not None:
            raise KeyboardInterrupt(f"signal {signum}")
        self._stop = signum

    def _log(self, record: dict[str, Any]) -> None:
        with (self.run_dir / "metrics.jsonl").open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")


def rate_of(reward_name: str) -> str | None:
    """``pass_rate`` for a reward function named ``code`` (built in, or ``pkg.mod:code``), ``format_rate``
    for ``code_format``: the share of completions scoring 1.0 is then every assert passed / a well-formed
    block."""
    short = reward_name.rsplit(":", 1)[-1].rsplit(".", 1)[-1]
    return {"code": "pass_rate", "code_format": "format_rate"}.get(short)


def _loss_and_grad(graphdef, mask_id, settings, params, ids, attn, t, r, old, ref, adv, cmask):
    def loss_fn(p: Any) -> tuple[jax.Array, dict]:
        logps = coupled.coupled_logps(graphdef, p, ids, attn, t, r, mask_id)
        return coupled.grpo_loss(logps, old, ref, adv, cmask, settings)

    return jax.value_and_grad(loss_fn, has_aux=True)(params)
