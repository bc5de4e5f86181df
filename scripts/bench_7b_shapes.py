"""DiffuCoder-7B shapes on one accelerator: random bfloat16 weights, our decoders, against the floor.

    python scripts/bench_7b_shapes.py [--json OUT.json] [--check] [--quantize int8|int4] [--layers N]

No checkpoint is read: the weights are drawn on the device in the published config's shapes (28 layers,
hidden 3584, MLP 18944, 28 query / 4 KV heads, vocabulary 152064), which is all that speed depends on.
It measures the device's own ceilings (a bf16 matmul and a device-to-device copy), then

- one full forward at canvas 512 and 1024 (batch 1), against the floor: the larger of weight bytes over
  the measured bandwidth and FLOPs over the measured matmul rate (docs/performance.md);
- the fast decoder's refresh (full forward that keeps K/V) and block step (32-token forward over the cache);
- generation tokens/s at batch 1 for every decoder of ``bench.DECODERS`` (256-token prompt, 256 new
  tokens; reference: 256 steps, its fused loop). On random weights almost nothing is confident, so the
  fast decoder commits about one token per forward: its tokens/s here is the TPF = 1 worst case; the
  DualCache cost model (the fast decoder's ``Decoder.cost``) gives it at TPF 1, 2 and 3 from the
  measured times.

``--quantize int8|int4`` quantizes the random weights on the device (``loader.quantize_state``, the
loader's rounding and layout; the Pallas kernels on one GPU) before timing; the bandwidth floor then
counts the quantized bytes. ``--layers N`` keeps the 7B widths with fewer layers. ``--check`` runs the
same code on a 1-layer, 64-wide model (``random_weights.small_config``, canvas 32 and 64; the reference
decoder streamed, its programs compiled rather than warmed up by a run): a quick run of the script
itself on a CPU, whose figures mean nothing (the test suite runs it). ``scripts/device_check.py``
measures all of this and more for bf16, int8 and int4 in one run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import jax  # noqa: E402

from model_runtime import bench, compile_cache, quant, random_weights  # noqa: E402
from model_runtime.config import DIFFUCODER_7B, DreamConfig  # noqa: E402
from model_runtime.sharding import weight_bytes_per_device  # noqa: E402

PROMPT = "def parse_config(path):\n    " * 64


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def config(check: bool, layers: int | None) -> DreamConfig:
    cfg = random_weights.small_config() if check else DreamConfig.from_dict(DIFFUCODER_7B)
    if layers is not None:
        cfg = dataclasses.replace(cfg, num_hidden_layers=layers)
    return cfg


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--check", action="store_true", help="a tiny model, to try the script on a CPU")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--quantize", choices=quant.MODES, default=None)
    parser.add_argument("--layers", type=int, default=None, help="fewer layers, same widths")
    args = parser.parse_args(argv)
    compile_cache.enable()
    prompt_tokens = new_tokens = 16 if args.check else 256
    canvas = prompt_tokens + new_tokens
    lengths = (canvas, 2 * canvas)

    result: dict[str, Any] = {"environment": bench.environment()}
    say(f"devices: {jax.devices()}")
    result["ceilings"] = ceil = bench.device_ceilings(256, 1 << 16) if args.check else bench.device_ceilings()
    say(f"ceilings: {ceil}")
    cfg = config(args.check, args.layers)
    qspec = quant.QuantSpec(args.quantize) if args.quantize else None
    t0 = time.perf_counter()
    rt = random_weights.random_runtime(cfg, quantize=qspec, length_buckets=lengths)
    jax.block_until_ready(rt.state)
    result["init_seconds"] = time.perf_counter() - t0
    # The embedding is a gather, not read whole: the bytes a forward reads are the rest.
    weight_bytes = (
        weight_bytes_per_device(cfg, 1, quantize=rt.quantize) - 2 * cfg.vocab_size * cfg.hidden_size
    )
    result["model"] = {
        "name": rt.info.model_name,
        "parameters": cfg.param_count(),
        "weight_bytes_read": weight_bytes,
        "quantize": args.quantize,
        "kernel": rt.quantize.kernel if rt.quantize else None,
    }
    say(f"weights ready in {result['init_seconds']:.1f}s: {cfg.param_count() / 1e9:.2f}B parameters")

    result["forward"] = [forward(rt, cfg, length, weight_bytes, ceil, args.repeat) for length in lengths]

    prompt = rt.rows.tokenizer.encode(PROMPT)[:prompt_tokens]
    cases = {c.name: c for c in bench.DECODERS}
    fast = cases["fast"].params(new_tokens)
    result["fast_parts"] = parts = bench.fast_parts(rt, [prompt], fast, args.repeat)
    parts["forward_ms"] = result["forward"][0]["ms"]
    say(f"fast decoder parts: {parts}")

    result["generation"] = [
        generation(rt, case, prompt, parts, new_tokens, args.check) for case in bench.DECODERS
    ]

    out = json.dumps(result, indent=2)
    if args.json:
        args.json.write_text(out + "\n")
    print(out)
    summary(result, parts)
    return 0


def forward(
    rt: Any, cfg: DreamConfig, length: int, weight_bytes: int, ceil: dict[str, Any], repeat: int
) -> dict[str, Any]:
    """One forward of batch 1 at ``length``: its time beside the floors of the device's ceilings."""
    f = bench.forward_latency(rt, 1, length, repeat=repeat)
    flops = bench.forward_flops(cfg, 1, length)
    floor_bw = weight_bytes / (ceil["copy_gbytes_per_s"] * 1e9)
    floor_fl = flops / (ceil["matmul_tflops"] * 1e12)
    f |= {
        "ms": 1e3 * f["median_seconds"],
        "floor_ms": 1e3 * max(floor_bw, floor_fl),
        "floor_bandwidth_ms": 1e3 * floor_bw,
        "floor_compute_ms": 1e3 * floor_fl,
        "tflops": flops / f["median_seconds"] / 1e12,
    }
    say(f"forward 1 x {length}: {f['ms']:.2f} ms (floor {f['floor_ms']:.2f} ms), {f['tflops']:.1f} TFLOP/s")
    return f


def generation(
    rt: Any, case: Any, prompt: list[int], parts: dict[str, Any], new_tokens: int, check: bool
) -> dict[str, Any]:
    """One decoder's generation at batch 1, with what its cost model predicts at the measured tokens per
    forward and at 1, 2 and 3."""
    p = case.params(new_tokens)
    # A decoder of full forwards runs its one-step program in the check (its fused loop of every step is
    # one more long compile the check does not need).
    stream = check and case.decoder.full_forwards
    g = bench.generation(rt, [prompt], p, repeat=1 if check else 3, stream=stream, compile_first=check)
    g.pop("generated")
    g["tokens_per_forward"] = tpf = new_tokens / g["forwards"]
    g["modeled_tokens_per_second"] = {
        str(t): bench.modeled_tokens_per_second(case, parts, parts["block_length"], t) for t in (tpf, 1, 2, 3)
    }
    say(
        f"generate {case.name}: {g['tokens_per_second']:.1f} tok/s, {g['forwards']} forwards, "
        f"{1e3 * g['seconds_per_forward']:.2f} ms per forward, compile {g['compile_seconds']:.1f}s"
    )
    return g


def summary(result: dict[str, Any], parts: dict[str, Any]) -> None:
    print("\nsummary", file=sys.stderr)
    for f in result["forward"]:
        print(f"  forward L={f['length']}: {f['ms']:.2f} ms vs floor {f['floor_ms']:.2f} ms", file=sys.stderr)
    print(
        f"  refresh {parts['refresh_ms']:.2f} ms, block step {parts['block_step_ms']:.2f} ms "
        f"(canvas {parts['canvas']})",
        file=sys.stderr,
    )
    for g in result["generation"]:
        print(f"  {g['decoder']}: {g['tokens_per_second']:.1f} tok/s at batch 1", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
