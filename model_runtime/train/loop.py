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
import signal
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
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
from model_runtime.train.objective import DEFAULT_EPS, Objective, masked_diffusion_objective


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings. Everything that changes the computed weights is here (and in run.json)."""

    steps: int = 1000
    batch_size: int = 16
    seq_len: int = 256
    learning_rate: float = 1e-3
    warmup_steps: int = 100
    min_lr_ratio: float = 0.1  # cosine decays to learning_rate * min_lr_ratio
    weight_decay: float = 0.1
    b1: float = 0.9
    b2: float = 0.95
    grad_clip: float = 1.0
    ema_decay: float = 0.995
    eps: float = DEFAULT_EPS
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "seq_len"):
            if getattr(self, name) < 1:
                raise InputError(f"{name}: must be >= 1, got {getattr(self, name)}")
        if self.seq_len < 2:
            raise InputError("seq_len: must be >= 2 (position 0 is never a target)")
        if not 0 <= self.warmup_steps <= self.steps:
            raise InputError(f"warmup_steps: must be in [0, steps={self.steps}], got {self.warmup_steps}")
        if not self.learning_rate > 0:
            raise InputError(f"learning_rate: must be > 0, got {self.learning_rate}")
        if not 0 <= self.ema_decay < 1:
            raise InputError(f"ema_decay: must be in [0, 1), got {self.ema_decay}")
        if not 0 < self.eps < 1:
            raise InputError(f"eps: must be in (0, 1), got {self.eps}")


def default_warmup(steps: int) -> int:
    """Warm-up steps when none are asked for: 10% of the run, at most 100 (the old fixed default), so a
    short run (``--steps 50``) gets a warm-up it can hold instead of an error."""
    return min(100, steps // 10)


class Batches(Protocol):
    """Training data: the batch of a step is a pure function of ``(seed, step)`` (exact resume).

    A batch is an array or a dict of arrays with the batch on the first axis (split across devices).
    """

    def batch(self, seed: int, step: int, batch_size: int) -> Any: ...


@dataclass
class LoopOptions:
    """How the loop runs (not what it computes): changing these never changes the weights."""

    checkpoint_every: int = 200
    keep_checkpoints: int = 2
    eval_every: int = 0  # 0: only the caller's final evaluation
    # Stop after this step of the ``steps`` schedule (a time-boxed run); the same command without it
    # resumes towards ``steps``. None: train to the end.
    stop_at: int | None = None
    log_every: int = 10
    show_progress: bool = True
    # Called after every step with (step, metrics); tests use it to record losses or stop a run.
    on_step: Callable[[int, dict[str, float]], None] | None = None
    # Called every eval_every steps with (step, ema params); returns metrics to log.
    evaluate: Callable[[int, nnx.State], dict[str, Any]] | None = None


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
    def is_matrix(path: tuple, _: Any) -> bool:
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
        self._manager = None

    # -- the step ---------------------------------------------------------------------------------
    def _step_fn(self, state: dict, batch: Any, step: jax.Array) -> tuple[dict, dict]:
        cfg, graphdef = self.cfg, self.graphdef
        key = jax.random.fold_in(jax.random.PRNGKey(cfg.seed), step)  # the step's masking noise

        def loss_fn(params: nnx.State) -> tuple[jax.Array, dict]:
            return self.objective(nnx.merge(graphdef, params), batch, key)

        (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(state["params"])
        updates, opt_state = self.tx.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        d = ema_decay_at(step, cfg.ema_decay)
        ema = jax.tree.map(lambda e, p: d * e + (1.0 - d) * p, state["ema"], params)
        metrics = dict(aux, loss=loss, grad_norm=optax.tree.norm(grads), lr=schedule(cfg)(step))
        return {"params": params, "opt_state": opt_state, "ema": ema}, metrics

    # -- checkpoints ------------------------------------------------------------------------------
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
        """Checkpoint the full state at ``self.step`` (blocking: a kill right after must not lose it)."""
        import orbax.checkpoint as ocp

        # The state is saved as its flat list of leaves: the tree structure (optax namedtuples, NNX
        # State with integer layer keys) is rebuilt from the live state on restore, never from disk.
        leaves = jax.tree.leaves(self.state)
        if self.step in self.manager.all_steps():
            return
        self.manager.save(self.step, args=ocp.args.StandardSave(leaves))
        self.manager.wait_until_finished()
        timing = self._timing()
        timing[str(self.step)] = round(self.train_seconds, 3)
        (self.run_dir / "timing.json").write_text(json.dumps(timing) + "\n", encoding="utf-8")

    def _timing(self) -> dict[str, float]:
        path = self.run_dir / "timing.json"
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}

    def restore_latest(self) -> bool:
        """Load the newest checkpoint, if any; returns whether one was found."""
        import orbax.checkpoint as ocp

        step = self.manager.latest_step()
        if step is None:
            return False
        leaves, treedef = jax.tree.flatten(self.state)
        abstract = [jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=self.replicated) for x in leaves]
        restored = self.manager.restore(step, args=ocp.args.StandardRestore(abstract))
        self.state = jax.tree.unflatten(treedef, list(restored))
        self.step = int(step)
        self.train_seconds = float(self._timing().get(str(self.step), 0.0))
        return True

    # -- the loop ---------------------------------------------------------------------------------
    def log_record(self, record: dict[str, Any]) -> None:
        """Append one JSON line to RUN/metrics.jsonl."""
        with (self.run_dir / "metrics.jsonl").open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")

    def run(self) -> list[dict[str, float]]:
        """Train from ``self.step`` to ``cfg.steps`` (or ``stop_at``); returns this invocation's metrics.

        Ctrl-C or SIGTERM saves a checkpoint at the last completed step before stopping, so a resumed
        run loses nothing; a hard kill loses at most ``checkpoint_every`` steps.
        """
        opts, cfg = self.options, self.cfg
        history: list[dict[str, float]] = []
        # SIGTERM and the first Ctrl-C only set a flag: raising inside the jitted step would leave the
        # donated state deleted and nothing to save. The loop checkpoints and stops after the step.
        self._stop_signal: int | None = None
        previous = {}
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                previous[sig] = signal.signal(sig, self._request_stop)
            except ValueError:  # not the main thread: whoever owns the signals handles them
                pass
        last = min(cfg.steps, opts.stop_at) if opts.stop_at is not None else cfg.steps
        progress = _Progress(last, self.step, enabled=opts.show_progress)
        tokens_per_step = cfg.batch_size * cfg.seq_len
        try:
            with progress:
                t_last, n_last = time.perf_counter(), self.step
                while self.step < last:
                    t0 = time.perf_counter()
                    batch = self.shards.batch(cfg.seed, self.step, cfg.batch_size)
                    batch = jax.device_put(batch, self.data_sharding)
                    self.state, metrics = self._train_step(self.state, batch, jnp.int32(self.step))
                    self.step += 1
                    m = {k: float(v) for k, v in metrics.items()}  # waits for the step to finish
                    self.train_seconds += time.perf_counter() - t0
                    if not math.isfinite(m["loss"]):
                        raise FloatingPointError(
                            f"the loss became {m['loss']} at step {self.step}; "
                            "lower the learning rate or raise warmup_steps"
                        )
                    history.append(m)
                    if opts.on_step is not None:
                        opts.on_step(self.step, m)
                    if self.step % opts.log_every == 0 or self.step == last:
                        now = time.perf_counter()
                        tps = (self.step - n_last) * tokens_per_step / max(now - t_last, 1e-9)
                        t_last, n_last = now, self.step
                        self.log_record({"step": self.step, "time": time.time(), "tokens_per_s": tps, **m})
                        progress.update(self.step, m, tps)
                    if self.step % opts.checkpoint_every == 0 or self.step == last:
                        self.save()
                    if opts.eval_every and opts.evaluate and self.step % opts.eval_every == 0:
                        result = opts.evaluate(self.step, self.ema_params())
                        self.log_record({"step": self.step, "eval": result})
                        progress.note(f"step {self.step} eval: {_short(result)}")
                    if self._stop_signal is not None:
                        raise KeyboardInterrupt(f"signal {self._stop_signal}")
        except KeyboardInterrupt:
            # The state is whole unless the interrupt hit inside the step (a second Ctrl-C): then the
            # donated buffers are gone and the last periodic checkpoint is what a resume gets.
            if not any(x.is_deleted() for x in jax.tree.leaves(self.state)):
                self.save()
            raise
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return history

    def _request_stop(self, signum: int, frame: Any) -> None:
        if self._stop_signal is not None:
            raise KeyboardInterrupt(f"signal {signum}")  # asked twice: stop now
        self._stop_signal = signum

    def params(self) -> nnx.State:
        return self.state["params"]

    def ema_params(self) -> nnx.State:
        return self.state["ema"]

    def close(self) -> None:
        if self._manager is not None:
            self._manager.close()
            self._manager = None


def _short(result: dict[str, Any]) -> str:
    parts = []
    for k, v in result.items():
        if isinstance(v, float):
            parts.append(f"{k}={v:.4g}")
    return " ".join(parts)


class _Progress:
    """A rich progress bar with the running loss, or nothing (tests, non-interactive logs)."""

    def __init__(self, total: int, start: int, *, enabled: bool) -> None:
        self.enabled = enabled
        self.total, self.start = total, start
        self._p = None

    def __enter__(self) -> _Progress:
        if self.enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self._p = Progress(
                TextColumn("[bold]train"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[info]}"),
                TimeRemainingColumn(),
            )
            self._p.__enter__()
            self._task = self._p.add_task("train", total=self.total, completed=self.start, info="")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._p is not None:
            self._p.__exit__(*exc)

    def update(self, step: int, m: dict[str, float], tokens_per_s: float) -> None:
        if self._p is not None:
            info = (
                f"loss {m['loss']:.3f}  masked acc {m['masked_acc']:.3f}  lr {m['lr']:.2e}  "
                f"{tokens_per_s:,.0f} tok/s"
            )
            self._p.update(self._task, completed=step, info=info)

    def note(self, text: str) -> None:
        if self._p is not None:
            self._p.console.print(text)


def run_config_dict(model_cfg: dict[str, Any], cfg: TrainConfig, **extra: Any) -> dict[str, Any]:
    """What ``run.json`` records: a resumed run must match it exactly."""
    return {"model": model_cfg, "train": asdict(cfg), **extra}
