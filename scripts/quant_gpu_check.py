"""DiffuCoder-7B shapes, bf16 against int8 and int4 weights, on one accelerator; and does XLA fuse the
dequantization into the matmul?

    python scripts/quant_gpu_check.py --json OUT.json [--hlo-dir DIR] [--layers N] [--small]

(a) For bf16, int8 and int4 in turn: random bf16 weights in the published 7B shapes drawn on the device,
    quantized there (``loader.quantize_state``: the loader's rounding, layout and forward), then the
    weight bytes (by the loader's rules, and the device's own bytes-in-use where it reports them), one
    full forward (batch 1, canvas 512), the fast decoder's refresh and block step (canvas 512, block 32).
(b) The optimized HLO of one quantized projection (``[1, 32, 3584] x [3584, 18944]``, the MLP's gate,
    the block step's shape), of a one-layer forward and of the fast decoder's own refresh and block-step
    programs (the 28-layer ones timed in (a)), for int8 and int4: does any computation outside
    a fusion produce a float tensor the size of a quantized weight? If none does and a fusion converts
    the integer weight and feeds a dot, the dequantization is fused into the matmul: the verdict says
    which. The HLO texts are written under ``--hlo-dir``.

Runs in about 4-5 minutes on one H100. ``--small`` (256 wide, 2 layers unless ``--layers``) runs it on
a CPU in a minute to check the script itself; its timings and verdicts say nothing about a GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from model_runtime import bench, compile_cache, hlo, quant, random_weights  # noqa: E402
from model_runtime.config import DIFFUCODER_7B, DreamConfig  # noqa: E402
from model_runtime.loader import quantize_state  # noqa: E402
from model_runtime.model import DreamModel  # noqa: E402
from model_runtime.sharding import weight_bytes_per_device  # noqa: E402
from model_runtime.weights import by_path  # noqa: E402

PROMPT = "def parse_config(path):\n    " * 64


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def hlo_text(compiled: jax.stages.Compiled) -> str:
    """A compiled program's HLO text (what the fusion verdict reads)."""
    text = compiled.as_text()
    if text is None:
        raise RuntimeError("this backend prints no HLO text for a compiled program")
    return text


def hlo_checks(cfg: DreamConfig, kernel: str, hlo_dir: Path | None) -> dict[str, Any]:
    """Compile one quantized projection (the MLP's gate at the block step's 32 rows) and a one-layer
    forward per mode; the verdict on each."""
    out = {}
    spec = by_path(cfg)[("layers", 0, "mlp", "gate_kernel")]
    d, f = spec.shape
    for mode in quant.MODES:
        q = quant.QuantSpec(mode, group=min(quant.DEFAULT_GROUP, d), kernel=kernel).resolved(1)
        w = jax.random.normal(jax.random.key(0), spec.shape, jnp.bfloat16) * 0.02
        qw = jax.jit(lambda w, q=q: quant.stored(*quant.quantize_device(w, spec, q), spec, q))(w)
        x = jax.random.normal(jax.random.key(1), (1, 32, d), jnp.bfloat16)
        proj = jax.jit(lambda x, qw: quant.dense("bld,df->blf", x, qw))
        text = hlo_text(proj.lower(x, qw).compile())
        exact = jnp.einsum("bld,df->blf", x, w)
        err = float(jnp.max(jnp.abs(proj(x, qw) - exact)) / jnp.max(jnp.abs(exact)))
        res = {"projection": f"[1, 32, {d}] x [{d}, {f}] {mode}", "kernel": q.kernel, "rel_err_vs_bf16": err}
        res |= hlo.fusion_verdict(text, {spec.shape})
        if hlo_dir:
            (hlo_dir / f"projection_{mode}.hlo.txt").write_text(text)
        out[f"projection_{mode}"] = res
        say(f"HLO projection {mode}: {res['verdict']}")

        # A one-layer forward at the block step's shape: every projection and lm_head quantized.
        one = dataclasses.replace(cfg, num_hidden_layers=1)
        abstract = nnx.eval_shape(lambda one=one: DreamModel(one, dtype=jnp.bfloat16, rngs=nnx.Rngs(0)))
        _, state = nnx.split(abstract)
        state = jax.tree.map(lambda a: jnp.full(a.shape, 0.01, a.dtype), state)
        qgraph, qstate = quantize_state(state, one, q)
        ids = jnp.asarray(np.arange(32)[None] % 1000, jnp.int32)
        fwd = jax.jit(lambda s, x, g=qgraph: nnx.merge(g, s)(x))
        text = hlo_text(fwd.lower(qstate, ids).compile())
        shapes = {s.shape for s in by_path(one).values() if q.applies(s)}
        res = {"forward": f"1 layer + lm_head, [1, 32] {mode}"} | hlo.fusion_verdict(text, shapes)
        if hlo_dir:
            (hlo_dir / f"forward_{mode}.hlo.txt").write_text(text)
        out[f"forward_{mode}"] = res
        say(f"HLO one-layer forward {mode}: {res['verdict']}")
        del state, qstate
    return out


def bytes_in_use() -> int | None:
    stats = jax.devices()[0].memory_stats() or {}
    return stats.get("bytes_in_use")


def timings(cfg: DreamConfig, mode: str | None, args: argparse.Namespace) -> dict[str, Any]:
    """One mode: weight bytes, forward, the fast decoder's refresh and block step, and the HLO verdict on
    the refresh and block programs the runtime runs."""
    gc.collect()
    before = bytes_in_use()
    t0 = time.perf_counter()
    q = quant.QuantSpec(mode, kernel=args.kernel) if mode else None
    rt = random_weights.random_runtime(cfg, quantize=q, length_buckets=(args.length,))
    jax.block_until_ready(rt.state)
    after = bytes_in_use()
    res: dict[str, Any] = {
        "mode": mode or "bf16",
        "kernel": rt.quantize.kernel if rt.quantize else None,
        "build_seconds": time.perf_counter() - t0,
        "weight_bytes": weight_bytes_per_device(cfg, 1, quantize=rt.quantize),
        "device_bytes_in_use": None if after is None or before is None else after - before,
    }
    f = bench.forward_latency(rt, 1, args.length, repeat=args.repeat)
    res["forward_ms"] = 1e3 * f["median_seconds"]
    prompts = [rt.rows.tokenizer.encode(PROMPT)[: args.length // 2]]
    fast = next(c for c in bench.DECODERS if c.name == "fast").params(args.length // 2)
    parts = bench.fast_parts(rt, prompts, fast, args.repeat)
    res |= {k: parts[k] for k in ("canvas", "refresh_ms", "block_step_ms", "block_forwards")}
    if mode:
        # The real programs (compiled above): their loop must neither dequantize weights outside a
        # fusion nor hoist a dequantized copy out of the loop.
        for kind, text in bench.fast_program_texts(rt, prompts, fast).items():
            if args.hlo_dir:
                (args.hlo_dir / f"{kind}_{mode}.hlo.txt").write_text(text)
            res[f"{kind}_hlo"] = hlo.fusion_verdict(text, bench.quantized_shapes(rt))
            say(f"HLO {kind} program {mode}: {res[f'{kind}_hlo']['verdict']}")
    say(f"{res['mode']}: {res}")
    del rt
    gc.collect()
    return res


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", type=Path, required=True, help="where to write the results")
    parser.add_argument("--hlo-dir", type=Path, default=None, help="write the optimized HLO texts here")
    parser.add_argument("--layers", type=int, default=None, help="fewer layers than 28 (same widths)")
    parser.add_argument("--small", action="store_true", help="a tiny model: check the script on a CPU")
    parser.add_argument("--length", type=int, default=None, help="canvas length (default 512; small: 32)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--kernel", choices=quant.KERNELS, default="auto", help="how quantized products run")
    parser.add_argument("--skip-timings", action="store_true", help="only the HLO check")
    args = parser.parse_args(argv)
    args.length = args.length or (32 if args.small else 512)
    compile_cache.enable()
    if args.hlo_dir:
        args.hlo_dir.mkdir(parents=True, exist_ok=True)
    result: dict = {"environment": bench.environment(), "args": {k: str(v) for k, v in vars(args).items()}}
    say(f"devices: {jax.devices()}")
    cfg = random_weights.small_config() if args.small else DreamConfig.from_dict(DIFFUCODER_7B)
    if args.layers is not None:
        cfg = dataclasses.replace(cfg, num_hidden_layers=args.layers)
    result["hlo"] = hlo_checks(cfg, args.kernel, args.hlo_dir)
    if not args.skip_timings:
        result["timings"] = [timings(cfg, mode, args) for mode in (None, *quant.MODES)]
        base = result["timings"][0]
        for row in result["timings"][1:]:
            row["block_step_vs_bf16"] = row["block_step_ms"] / base["block_step_ms"]
            row["refresh_vs_bf16"] = row["refresh_ms"] / base["refresh_ms"]
            row["forward_vs_bf16"] = row["forward_ms"] / base["forward_ms"]
            row["weight_bytes_vs_bf16"] = row["weight_bytes"] / base["weight_bytes"]
    args.json.write_text(json.dumps(result, indent=2) + "\n")

    print("\nsummary", file=sys.stderr)
    for key, res in result["hlo"].items():
        print(f"  {key}: {res['verdict']}", file=sys.stderr)
    for row in result.get("timings", []):
        for kind in ("refresh", "block"):
            if f"{kind}_hlo" in row:
                print(f"  {kind} program {row['mode']}: {row[f'{kind}_hlo']['verdict']}", file=sys.stderr)
    for row in result.get("timings", []):
        ratios = (
            f" (block step x{row['block_step_vs_bf16']:.2f}, refresh x{row['refresh_vs_bf16']:.2f}, "
            f"forward x{row['forward_vs_bf16']:.2f} of bf16)"
            if "block_step_vs_bf16" in row
            else ""
        )
        print(
            f"  {row['mode']}: weights {row['weight_bytes'] / 1e9:.2f} GB, "
            f"forward {row['forward_ms']:.2f} ms, "
            f"refresh {row['refresh_ms']:.2f} ms, block step {row['block_step_ms']:.2f} ms{ratios}",
            file=sys.stderr,
        )
    print(f"  written to {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
