"""Benchmarks of the runtime: load, compile, forward latency/throughput, generation speed, batch scaling.

Every figure is a median over repeats after a warm-up call, so compile time never leaks into a speed
figure; compile time is reported on its own. FLOP counts are analytic (matmuls and attention of one
full-canvas forward), so "GFLOP/s" can be set against the machine's own dense matmul rate.

The accelerator scripts (``scripts/device_check.py``, ``bench_7b_shapes.py``, ``quant_gpu_check.py``)
build on the public pieces here and on runtimes with random weights (``random_weights.py``): the
fast decoder's refresh and block step timed through the runtime's own calls (``fast_parts``), the table
of decoder settings every decoder benchmark measures (``DECODERS``), whose decoders' cost models
(``Decoder.cost``) predict their speed from those timings. Their tiny modes run in the test suite, so a change
here or in the runtime that breaks them breaks a test.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from model_runtime import decoders
from model_runtime.config import DreamConfig
from model_runtime.decoders.fast import FAST
from model_runtime.params import SamplingParams
from model_runtime.runtime import Runtime
from model_runtime.weights import by_path

Tick = Callable[[str], None]


def environment() -> dict[str, Any]:
    """Where the figures were measured: device, software versions, processor."""
    import flax

    devices = jax.devices()
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    return {
        "backend": jax.default_backend(),
        "device": f"{devices[0].device_kind} x{len(devices)}",
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "jax": jax.__version__,
        "flax": flax.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
    }


def _layer_flops(cfg: DreamConfig, length: int) -> tuple[int, int, int, int]:
    """FLOPs per position and layer (2 per multiply-add): query and output projections, key and value
    projections, the MLP, and attention (scores and mixing) of one query over ``length`` keys."""
    d, f, h, k, e = (
        cfg.hidden_size,
        cfg.intermediate_size,
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.head_dim,
    )
    return 2 * 2 * d * h * e, 2 * 2 * d * k * e, 2 * 3 * d * f, 2 * 2 * length * h * e


def forward_flops(cfg: DreamConfig, batch: int, length: int, *, logits_rows: int | None = None) -> float:
    """FLOPs of one forward over a ``[batch, length]`` canvas (2 per multiply-add).

    Projections, MLP and ``lm_head`` (on ``logits_rows`` positions, default all) plus attention scores
    and mixing; norms, RoPE and softmax are left out (a few percent at most).
    """
    per_token = sum(_layer_flops(cfg, length)) * cfg.num_hidden_layers
    head = 2 * batch * (length if logits_rows is None else logits_rows) * cfg.hidden_size * cfg.vocab_size
    return float(per_token * batch * length + head)


def reference_step_flops(cfg: DreamConfig, batch: int, length: int, rows: int) -> float:
    """FLOPs one reference-decoder step executes when it gathers ``rows`` positions per row for the last
    layer, ``lm_head`` and the sampler (``kernels._sample_masked``): a forward with logits for those rows,
    less the last layer's queries, attention, output and MLP for the other positions (every position
    still gives keys and values). ``rows == length`` is ``forward_flops``."""
    q_o, _, mlp, attention = _layer_flops(cfg, length)
    skipped = (q_o + mlp + attention) * batch * (length - rows)
    return forward_flops(cfg, batch, length, logits_rows=rows) - skipped


def median_seconds(fn: Callable[[], Any], repeat: int) -> tuple[float, list[float]]:
    """The median and all of ``repeat`` timed calls of ``fn``, after one untimed call (which compiles)."""
    jax.block_until_ready(fn())  # warm-up (and compile, if needed)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times


def matmul_gflops(n: int = 2048, repeat: int = 10) -> float:
    """The machine's dense float32 matmul rate through XLA: the ceiling for compute-bound steps."""
    a = jnp.asarray(np.random.default_rng(0).standard_normal((n, n)), jnp.float32)
    f = jax.jit(lambda a: a @ a)
    seconds, _ = median_seconds(lambda: f(a), repeat)
    return 2 * n**3 / seconds / 1e9


def device_ceilings(matmul_n: int = 8192, copy_elements: int = 1 << 29, repeat: int = 5) -> dict[str, float]:
    """The default device's bf16 matmul rate (``matmul_n``^3, TFLOP/s) and copy bandwidth (an elementwise
    pass over ``copy_elements`` bf16 values, 1 GiB by default: bytes read plus written per second)."""
    k1, k2 = jax.random.split(jax.random.key(0))
    a = jax.random.normal(k1, (matmul_n, matmul_n), jnp.bfloat16)
    b = jax.random.normal(k2, (matmul_n, matmul_n), jnp.bfloat16)
    mm = jax.jit(jnp.matmul)
    t_mm, _ = median_seconds(lambda: mm(a, b), repeat)
    big = jax.random.normal(k1, (copy_elements,), jnp.bfloat16)
    copy = jax.jit(lambda x: x * jnp.bfloat16(1.0001))  # one read and one write of every element
    t_cp, _ = median_seconds(lambda: copy(big), repeat)
    return {"matmul_tflops": 2 * matmul_n**3 / t_mm / 1e12, "copy_gbytes_per_s": 2 * big.nbytes / t_cp / 1e9}


def forward_latency(rt, batch: int, length: int, repeat: int = 5) -> dict[str, float]:
    """Median seconds of one full forward (what each reference step costs) and its throughput."""
    model_fn = jax.jit(lambda state, x, attn: nnx.merge(rt.graphdef, state)(x, attn))
    x = jnp.asarray(np.random.default_rng(1).integers(0, rt.config.vocab_size, (batch, length)), jnp.int32)
    attn = jnp.ones((batch, length), bool)
    t0 = time.perf_counter()
    jax.block_until_ready(model_fn(rt.state, x, attn))
    first = time.perf_counter() - t0
    seconds, _ = median_seconds(lambda: model_fn(rt.state, x, attn), repeat)
    flops = forward_flops(rt.config, batch, length)
    return {
        "batch": batch,
        "length": length,
        "compile_seconds": first - seconds,
        "median_seconds": seconds,
        "tokens_per_second": batch * length / seconds,
        "gflops_per_second": flops / seconds / 1e9,
    }


def generation(
    rt,
    prompts: Sequence[Sequence[int]],
    params: SamplingParams,
    *,
    chat: bool = False,
    repeat: int = 3,
    stream: bool = False,
    compile_first: bool = False,
) -> dict[str, Any]:
    """Median wall time of whole generations, after one warm-up run that compiles (or, with
    ``compile_first``, after compiling the programs without running them: half the time on a device
    where a generation takes seconds). ``stream``: one host sync per forward, as a streaming client
    gets it (the reference decoder then runs its one-step program, not the fused loop)."""
    t0 = time.perf_counter()
    if compile_first:
        rows = [rt.rows.make_row(p, params.max_new_tokens, chat=chat) for p in prompts]
        compile_seconds = rt.compile(rows, params, stream=stream).seconds
    else:
        warm = list(rt.generate(prompts, params, chat=chat, stream=stream))[-1]
        compile_seconds = warm.stats.compile_seconds
    first = time.perf_counter() - t0
    runs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        done = list(rt.generate(prompts, params, chat=chat, stream=stream))[-1]
        runs.append(time.perf_counter() - t0)
    median = statistics.median(runs)
    new_tokens = done.stats.new_tokens
    out = {
        "decoder": params.decoder,
        "stream": stream,
        "batch": len(prompts),
        "max_new_tokens": params.max_new_tokens,
        "steps": params.steps,
        "forwards": done.stats.steps,
        "bucket": list(done.stats.bucket),
        "median_seconds": median,
        "seconds": runs,
        "tokens_per_second": new_tokens / median,
        "compile_seconds": compile_seconds,
        "first_run_seconds": first,
        "seconds_per_forward": median / max(done.stats.steps, 1),
        "generated": done.generated,
    }
    if decoders.get(params.decoder).full_forwards:
        length = done.stats.bucket[1]
        out["gflops_per_second"] = (
            params.steps * forward_flops(rt.config, done.stats.bucket[0], length) / median / 1e9
        )
    return out


def suite(
    rt,
    *,
    batches: Sequence[int] = (1, 2, 4, 8),
    lengths: Sequence[int] = (128, 256, 512),
    generate: Sequence[tuple[int, int]] = ((128, 128),),
    repeat: int = 3,
    tick: Tick | None = None,
    load_seconds: float | None = None,
) -> dict[str, Any]:
    """The whole benchmark: forward grid, generation for both decoders, batch scaling, matmul ceiling."""
    tick = tick or (lambda label: None)
    result: dict[str, Any] = {
        "environment": environment(),
        "model": rt.info.model_name,
        "dtype": rt.info.dtype,
        "quantize": rt.info.quantize_mode,
        "config": {k: v for k, v in rt.config.to_dict().items() if isinstance(v, int | float)},
    }
    if load_seconds is not None:
        result["load_seconds"] = load_seconds
    tick("matmul ceiling")
    result["matmul_gflops"] = matmul_gflops()
    result["forward"] = []
    for length in lengths:
        for batch in batches:
            tick(f"forward batch {batch} x {length}")
            result["forward"].append(forward_latency(rt, batch, length, repeat))
    prompt = rt.rows.tokenizer.encode("def fibonacci(n):\n")
    result["generation"] = []
    result["compile"] = []
    for new, steps in generate:
        for name in ("reference", "fast"):  # the decoders `diffu bench` has always reported
            params = SamplingParams(max_new_tokens=new, steps=steps, decoder=name)
            tick(f"generate {new} tokens / {steps} steps, {name} decoder")
            g = generation(rt, [prompt], params, repeat=repeat)
            g.pop("generated")
            result["generation"].append(g)
            result["compile"].append(
                {"bucket": g["bucket"], "decoder": name, "seconds": g["compile_seconds"]}
            )
    result["batch_scaling"] = []
    new, steps = generate[0]
    for batch in batches:
        tick(f"batch scaling {batch}")
        g = generation(rt, [prompt] * batch, SamplingParams(max_new_tokens=new, steps=steps), repeat=repeat)
        g.pop("generated")
        result["batch_scaling"].append(g)
    return result


def fast_parts(
    rt: Runtime, prompts: Sequence[Sequence[int]], params: SamplingParams, repeat: int = 5
) -> dict[str, Any]:
    """Median milliseconds of the fast decoder's first refresh and of its first block (the whole loop,
    one call) for ``prompts``, through the decoder's own calls (``decoders.fast.FAST.calls``); the block step
    is the block's time over its forwards. Both programs donate their inputs: every call gets copies,
    made outside the timed region."""
    rows = [rt.rows.make_row(p, params.max_new_tokens, chat=False) for p in prompts]
    calls = FAST.calls(rt, rows, params, rt.checked_shape(rows, params))

    def timed(make: Callable[[], tuple[Any, ...]], run: Callable[..., Any]) -> tuple[float, Any]:
        times, out = [], None
        for i in range(repeat + 1):  # the first call is a warm-up
            args = jax.block_until_ready(make())
            t0 = time.perf_counter()
            out = jax.block_until_ready(run(*args))
            if i:
                times.append(time.perf_counter() - t0)
        return statistics.median(times), out

    t_refresh, (x, caches) = timed(lambda: (calls.canvas(),), lambda x: calls.refresh(x, 0))
    t_block, out = timed(
        lambda: (jnp.copy(x), jax.tree.map(jnp.copy, caches)),
        lambda x, c: calls.block(x, c, 0, 0, calls.size),
    )
    forwards = int(out[2])
    return {
        "batch": calls.batch.x.shape[0],
        "canvas": calls.batch.x.shape[1],
        "block_length": calls.size,
        "refresh_ms": 1e3 * t_refresh,
        "block_ms": 1e3 * t_block,
        "block_forwards": forwards,
        "block_step_ms": 1e3 * t_block / max(forwards, 1),
    }


def fast_program_texts(
    rt: Runtime, prompts: Sequence[Sequence[int]], params: SamplingParams
) -> dict[str, str]:
    """The optimized HLO of the fast decoder's refresh and block programs for ``prompts`` (compiled
    if they are not yet), for reading what XLA made of them (``hlo.fusion_verdict``)."""
    rows = [rt.rows.make_row(p, params.max_new_tokens, chat=False) for p in prompts]
    calls = FAST.calls(rt, rows, params, rt.checked_shape(rows, params))
    programs: dict[str, Any] = {"refresh": calls.refresh_program, "block": calls.block_program}
    # On a mesh the program is wrapped (placement.Placed); its compiled form is the one XLA wrote.
    return {kind: getattr(p, "compiled", p).as_text() for kind, p in programs.items()}


def quantized_shapes(rt: Runtime) -> set[tuple[int, ...]]:
    """The shapes (our layout) of the runtime's quantized weights."""
    q = rt.quantize
    return set() if q is None else {s.shape for s in by_path(rt.config).values() if q.applies(s)}


# -- decoders and their cost models --------------------------------------------------------------------


@dataclass(frozen=True)
class DecoderCase:
    """One decoder setting the benchmarks measure: its name in the tables and the ``SamplingParams`` fields
    that make it (beyond ``max_new_tokens``; ``steps`` defaults to one token per step). Its decoder's cost
    model (``Decoder.cost``) predicts its tokens/s from the measured forward times."""

    name: str
    settings: Mapping[str, Any] = field(default_factory=dict)

    def params(self, new_tokens: int) -> SamplingParams:
        return SamplingParams(**{"max_new_tokens": new_tokens, "steps": new_tokens, **self.settings})

    @property
    def decoder(self) -> decoders.Decoder:
        return decoders.get(self.params(1).decoder)


# Every decoder the device check and the accelerator benchmarks measure, by the same code: a new decoder
# is one more row.
DECODERS: tuple[DecoderCase, ...] = (
    DecoderCase("reference", {"decoder": "reference"}),
    DecoderCase("fast", {"decoder": "fast"}),
    DecoderCase("sliding", {"decoder": "sliding", "window": 8}),
)


def modeled_tokens_per_second(case: DecoderCase, parts: Mapping[str, float], block: int, tpf: float) -> float:
    """Tokens/s ``case``'s cost model predicts from the forward times in ``parts`` (``forward_ms``,
    ``refresh_ms``, ``block_step_ms``: seconds per generated token from them, the block length and
    ``tpf``, tokens per forward: generated tokens over all the forwards the decoder ran)."""
    return 1.0 / case.decoder.cost(parts, block, tpf)


def plot(result: dict[str, Any], path: str) -> None:
    """Forward throughput per canvas length and batch, and generation tokens/s per batch size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    lengths = sorted({f["length"] for f in result["forward"]})
    for length in lengths:
        rows = [f for f in result["forward"] if f["length"] == length]
        ax1.plot(
            [r["batch"] for r in rows],
            [r["gflops_per_second"] for r in rows],
            marker="o",
            label=f"L={length}",
        )
    ax1.axhline(result["matmul_gflops"], color="grey", linestyle="--", label="matmul ceiling")
    ax1.set_xlabel("batch")
    ax1.set_ylabel("GFLOP/s (forward)")
    ax1.legend()
    scaling = result["batch_scaling"]
    ax2.plot([g["batch"] for g in scaling], [g["tokens_per_second"] for g in scaling], marker="o")
    ax2.set_xlabel("batch")
    ax2.set_ylabel("generated tokens/s (reference decoder)")
    fig.suptitle(f"{result['model']} on {result['environment']['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
