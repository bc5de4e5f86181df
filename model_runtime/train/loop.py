"""The training loop: AdamW with warmup + cosine decay, an EMA of the weights, orbax checkpoints with
exact resume, data parallelism over the local devices, rich progress and periodic held-out evaluation.

Exact resume rests on three things: (1) the batch of step ``s`` is a pure function of ``(seed, s)``
(``TokenShards.batch``); (2) the masking noise of step ``s`` is ``fold_in(PRNGKey(seed), s)``; (3) the
checkpoint holds every leaf of the training state (params, optimizer moments and count, EMA, step)
in float32, restored bit for bit. So a run killed after its checkpoint at step ``k`` and resumed computes
the same step ``k + 1`` as the uninterrupted run, and every step after it.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from model_runtime import compile_cache
from model_runtime.config import DreamConfig
from model_runtime.errors import InputError
from model_runtime.model import DreamModel
from model_runtime.train.checkpoints import RunCheckpoints, checkpoint_due, interruptible, last_step
from model_runtime.train.config import LoopOptions, TrainConfig
from model_runtime.train.objective import Metrics, Objective, masked_diffusion_objective
from model_runtime.train.progress import ProgressBar


class Batches(Protocol):
    """Training data: the batch of a step is a pure function of ``(seed, step)`` (exact resume).

    A batch is an array or a dict of arrays with the batch on the first axis (split across devices).
    """

    def batch(self, seed: int, step: int, batch_size: int) -> Any: ...


def schedule(cfg: TrainConfig) -> optax.Schedule:
    """Linear warmup from 0 to the peak, then cosine decay to ``min_lr_ratio`` of it at ``steps``."""
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=cfg.learning_rate,
        warmup_steps=cfg.warmup_steps,
        decay_steps=cfg.steps,
        end_value=cfg.learning_rate * cfg.min_lr_ratio,
    )


def _decay_mask(params: nnx.State) -> Any:
    # Decay matrices only: norms and biases are scales/offsets whose natural value is not 0.
    def is_matrix(path: tuple[object, ...], _: Any) -> bool:
        last = str(getattr(path[-1], "key", path[-1]))
        return last.endswith("kernel") or last in ("embed", "lm_head")

    return jax.tree_util.tree_map_with_path(is_matrix, params)


def make_optimizer(cfg: TrainConfig, params: nnx.State) -> optax.GradientTransformation:
    return optax.chain(
        optax.clip_by_global_norm(cfg.grad_clip),
        optax.adamw(
            schedule(cfg),
            b1=cfg.b1,
            b2=cfg.b2,
            weight_decay=cfg.weight_decay,
            mask=_decay_mask(params),
        ),
    )


def init_params(model_cfg: DreamConfig, seed: int) -> tuple[nnx.GraphDef, nnx.State]:
    """A fresh float32 model (normal(0.02) weights, as Qwen2's ``initializer_range``)."""
    model = DreamModel(model_cfg, dtype=jnp.float32, rngs=nnx.Rngs(seed))
    return nnx.split(model)


def ema_decay_at(step: jax.Array, decay: float) -> jax.Array:
    # Warm-up of the EMA: early on the average would be dominated by the random init, so the effective
    # decay starts near 0 and approaches ``decay`` as (1 + s) / (10 + s) grows.
    s = step.astype(jnp.float32)
    return jnp.minimum(decay, (1.0 + s) / (10.0 + s))


class Trainer:
    """Owns the training state and the compiled step; ``run`` trains to ``cfg.steps`` with resume."""

    def __init__(
        self,
        run_dir: Path,
        model_cfg: DreamConfig,
        cfg: TrainConfig,
        shards: Batches,
        *,
        graphdef: nnx.GraphDef,
        params: nnx.State,
        options: LoopOptions | None = None,
        objective: Objective | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.model_cfg = model_cfg
        self.cfg = cfg
        self.shards = shards
        self.options = options or LoopOptions()
        self.graphdef = graphdef
        # What a step minimises on a batch; pre-training's masked diffusion unless told otherwise (SFT).
        self.objective = objective or masked_diffusion_objective(model_cfg.mask_token_id, cfg.eps)
        devices = jax.devices()
        if cfg.batch_size % len(devices):
            raise InputError(
                f"batch_size {cfg.batch_size} must be a multiple of the {len(devices)} devices "
                "(the batch is split evenly across them)"
            )
        # Data parallelism: one mesh axis over every local device; the batch is split along it and the
        # parameters, optimizer state and EMA are replicated. XLA inserts the gradient all-reduce.
        self.mesh = Mesh(np.array(devices), ("data",))
        self.replicated = NamedSharding(self.mesh, PartitionSpec())
        self.data_sharding = NamedSharding(self.mesh, PartitionSpec("data"))
        self.tx = make_optimizer(cfg, params)
        params = jax.device_put(jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), params), self.replicated)
        self.state = {
            "params": params,
            "opt_state": jax.device_put(self.tx.init(params), self.replicated),
            "ema": jax.device_put(jax.tree.map(jnp.copy, params), self.replicated),
        }
        self.step = 0
        self.train_seconds = 0.0  # wall time spent in steps, summed over resumed invocations
        # The persistent compilation cache makes a resumed run (same shapes, same program) skip XLA.
        compile_cache.enable()
        self._train_step = jax.jit(self._step_fn, donate_argnums=(0,))
        self.checkpoints = RunCheckpoints(self.run_dir, self.options.keep_checkpoints)

    # -- the step ---------------------------------------------------------------------------------
    def _step_fn(self, state: dict[str, Any], batch: Any, step: jax.Array) -> tuple[dict[str, Any], Metrics]:
        cfg, graphdef = self.cfg, self.graphdef
        key = jax.random.fold_in(jax.random.PRNGKey(cfg.seed), step)  # the step's masking noise

        def loss_fn(params: nnx.State) -> tuple[jax.Array, Metrics]:
            return self.objective(nnx.merge(graphdef, params), batch, key)

        (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(state["params"])
        updates, opt_state = self.tx.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        d = ema_decay_at(step, cfg.ema_decay)
        ema = jax.tree.map(lambda e, p: d * e + (1.0 - d) * p, state["ema"], params)
        metrics = dict(aux, loss=loss, grad_norm=optax.tree.norm(grads), lr=schedule(cfg)(step))
        return {"params": params, "opt_state": opt_state, "ema": ema}, metrics

    # -- checkpoints ------------------------------------------------------------------------------
    def save(self) -> None:
        """Checkpoint the full state at ``self.step`` (blocking: a kill right after must not lose it)."""
        if not self.checkpoints.save(self.step, self.state):
            return
        timing = self._timing()
        timing[str(self.step)] = round(self.train_seconds, 3)
        (self.run_dir / "timing.json").write_text(json.dumps(timing) + "\n", encoding="utf-8")

    def _timing(self) -> dict[str, float]:
        path = self.run_dir / "timing.json"
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}

    def restore_latest(self) -> bool:
        """Load the newest checkpoint, if any; returns whether one was found."""
        restored = self.checkpoints.restore_latest(self.state, sharding=self.replicated)
        if restored is None:
            return False
        self.state, self.step = restored.state, restored.step
        self.train_seconds = float(self._timing().get(str(self.step), 0.0))
        return True

    # -- the loop ---------------------------------------------------------------------------------
    def log_record(self, record: dict[str, Any]) -> None:
        """Append one JSON line to RUN/metrics.jsonl."""
        self.checkpoints.log(record)

    def run(self) -> list[dict[str, float]]:
        """Train from ``self.step`` to ``cfg.steps`` (or ``stop_at``); returns this invocation's metrics.

        Ctrl-C or SIGTERM saves a checkpoint at the last completed step before stopping, so a resumed
        run loses nothing; a hard kill loses at most ``checkpoint_every`` steps (``checkpoints.py``).
        """
        opts, cfg = self.options, self.cfg
        history: list[dict[str, float]] = []
        last = last_step(cfg.steps, opts.stop_at)
        meter = _Throughput(self.step, cfg.batch_size * cfg.seq_len)
        with interruptible(lambda: self.state, self.save) as stop:
            with ProgressBar("train", last, self.step, enabled=opts.show_progress) as progress:
                while self.step < last:
                    m = self._one_step()
                    history.append(m)
                    if opts.on_step is not None:
                        opts.on_step(self.step, m)
                    if self.step % opts.log_every == 0 or self.step == last:
                        tps = meter.tokens_per_s(self.step)
                        self.log_record({"step": self.step, "time": time.time(), "tokens_per_s": tps, **m})
                        progress.show(_progress_info(m, tps), self.step)
                    if checkpoint_due(self.step, opts.checkpoint_every, last):
                        self.save()
                    if opts.eval_every and opts.evaluate and self.step % opts.eval_every == 0:
                        result = opts.evaluate(self.step, self.ema_params())
                        self.log_record({"step": self.step, "eval": result})
                        progress.note(f"step {self.step} eval: {_short(result)}")
                    stop.check()
        return history

    def _one_step(self) -> dict[str, float]:
        """Train ``self.step``'s batch; its metrics as floats (waiting for the step to finish)."""
        cfg = self.cfg
        t0 = time.perf_counter()
        batch = self.shards.batch(cfg.seed, self.step, cfg.batch_size)
        batch = jax.device_put(batch, self.data_sharding)
        self.state, metrics = self._train_step(self.state, batch, jnp.int32(self.step))
        self.step += 1
        m = {k: float(v) for k, v in metrics.items()}
        self.train_seconds += time.perf_counter() - t0
        if not math.isfinite(m["loss"]):
            raise FloatingPointError(
                f"the loss became {m['loss']} at step {self.step}; "
                "lower the learning rate or raise warmup_steps"
            )
        return m

    def params(self) -> nnx.State:
        return self.state["params"]

    def ema_params(self) -> nnx.State:
        return self.state["ema"]

    def close(self) -> None:
        self.checkpoints.close()


def _short(result: dict[str, Any]) -> str:
    parts = []
    for k, v in result.items():
        if isinstance(v, float):
            parts.append(f"{k}={v:.4g}")
    return " ".join(parts)


def _progress_info(m: dict[str, float], tokens_per_s: float) -> str:
    return (
        f"loss {m['loss']:.3f}  masked acc {m['masked_acc']:.3f}  lr {m['lr']:.2e}  {tokens_per_s:,.0f} tok/s"
    )


class _Throughput:
    """Tokens per second over the steps since the last reading."""

    def __init__(self, step: int, tokens_per_step: int) -> None:
        self.tokens_per_step = tokens_per_step
        self._t, self._step = time.perf_counter(), step

    def tokens_per_s(self, step: int) -> float:
        now = time.perf_counter()
        tps = (step - self._step) * self.tokens_per_step / max(now - self._t, 1e-9)
        self._t, self._step = now, step
        return tps


def run_config_dict(model_cfg: dict[str, Any], cfg: TrainConfig, **extra: Any) -> dict[str, Any]:
    """What ``run.json`` records: a resumed run must match it exactly."""
    return {"model": model_cfg, "train": asdict(cfg), **extra}
