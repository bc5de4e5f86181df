"""DiffuCoder-7B shapes on one accelerator: random bfloat16 weights, our decoders, against the floor.

    python scripts/bench_7b_shapes.py [--json OUT.json] [--check] [--quantize int8|int4] [--layers N]

No checkpoint is read: the weights are drawn on the device in the published config's shapes (28 layers,
hidden 3584, MLP 18944, 28 query / 4 KV heads, vocabulary 152064), which is all that speed depends on.
It measures the device's own ceilings (a bf16 matmul and a device-to-device copy), then

- one full forward at canvas 512 and 1024 (batch 1), against the floor: the larger of weight bytes over
  the measured bandwidth and FLOPs over the measured matmul rate (docs/performance.md);
- the fast decoder's refresh (full forward that keeps K/V) and block step (32-token forward over the cache);
- generation tokens/s at batch 1 for the reference and the fast decoder (256-token prompt, 256 new tokens;
  reference: 256 steps). On random weights almost nothing is confident, so the fast decoder commits about
  one token per forward: its tokens/s here is the TPF = 1 worst case; the table adds the DualCache model
  ``32 / (t_refresh + ceil(31 / TPF) * t_step)`` at TPF 2 from the measured times.

``--quantize int8|int4`` quantizes the random weights on the device (``quant.quantize_state``, the
loader's rounding and layout) before timing; the bandwidth floor then counts the quantized bytes.
``--layers N`` keeps the 7B widths with fewer layers. ``--check`` runs a 2-layer, 256-wide model with
the 7B vocabulary instead: a quick run of the script itself on a CPU, whose figures mean nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROMPT_TOKENS = 256
NEW_TOKENS = 256
BLOCK = 32


def _timed(fn, repeat: int) -> float:
    import jax

    jax.block_until_ready(fn())
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def ceilings(repeat: int, *, small: bool = False) -> dict[str, float]:
    """bf16 matmul TFLOP/s (8192^3) and device copy bandwidth (bytes read + written per second)."""
    import jax
    import jax.numpy as jnp

    n = 1024 if small else 8192
    k1, k2 = jax.random.split(jax.random.key(0))
    a = jax.random.normal(k1, (n, n), jnp.bfloat16)
    b = jax.random.normal(k2, (n, n), jnp.bfloat16)
    mm = jax.jit(lambda a, b: a @ b)
    t_mm = _timed(lambda: mm(a, b), repeat)
    big = jax.random.normal(k1, (1 << (24 if small else 29),), jnp.bfloat16)  # 1 GiB
    cp = jax.jit(lambda x: x * jnp.bfloat16(1.0001))  # a read and a write of every element
    t_cp = _timed(lambda: cp(big), repeat)
    return {"matmul_tflops": 2 * n**3 / t_mm / 1e12, "copy_gbytes_per_s": 2 * big.nbytes / t_cp / 1e9}


def _published_ids_tokenizer(first_special: int) -> Path:
    """The bundled BPE with its special tokens moved to the published ids (``<|endoftext|>`` = 151643,
    ``<|mask|>`` = 151666, ...): any byte-level BPE encodes a prompt; the ids must match the config."""
    import tempfile

    from model_runtime.bundled import bundled_model_dir

    src = bundled_model_dir()
    added = json.loads((src / "added_tokens.json").read_text())
    base = min(added.values())
    vocab = {t: i for t, i in json.loads((src / "vocab.json").read_text()).items() if t not in added}
    out = Path(tempfile.mkdtemp(prefix="diffu-7b-tok-"))
    (out / "vocab.json").write_text(json.dumps(vocab))
    (out / "added_tokens.json").write_text(
        json.dumps({t: i - base + first_special for t, i in added.items()})
    )
    for name in ("merges.txt", "tokenizer_config.json"):
        (out / name).write_bytes((src / name).read_bytes())
    return out


def random_runtime(check: bool, quantize: str | None = None, layers: int | None = None):
    """A Runtime with DiffuCoder-7B shapes and random bf16 weights drawn on the device, optionally
    quantized there (int8 / int4)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from model_runtime.config import DIFFUCODER_7B, DreamConfig
    from model_runtime.model import DreamModel
    from model_runtime.runtime import Runtime
    from model_runtime.tokenizer import load_tokenizer

    raw = dict(DIFFUCODER_7B)
    if check:
        raw.update(
            num_hidden_layers=2, max_window_layers=2, hidden_size=256, intermediate_size=512,
            num_attention_heads=4, num_key_value_heads=2,
        )  # fmt: skip
    if layers is not None:
        raw.update(num_hidden_layers=layers, max_window_layers=layers)
    cfg = DreamConfig.from_dict(raw)
    abstract = nnx.eval_shape(lambda: DreamModel(cfg, dtype=jnp.bfloat16, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    leaves, treedef = jax.tree.flatten(state)
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(state)[0]]

    fills: dict = {}  # one compiled fill per distinct shape (28 layers repeat the same dozen)

    def draw(i: int, leaf, path: str):
        if "norm" in path:
            return jnp.ones(leaf.shape, leaf.dtype)  # RMSNorm scales: 1, as trained models roughly are
        key = (leaf.shape, leaf.dtype)
        if key not in fills:
            shape, dtype = key
            fills[key] = jax.jit(lambda k: (0.02 * jax.random.normal(k, shape, jnp.float32)).astype(dtype))
        return fills[key](jax.random.key(i))

    state = jax.tree.unflatten(
        treedef, [draw(i, x, p) for i, (x, p) in enumerate(zip(leaves, paths, strict=True))]
    )
    qspec = None
    if quantize:
        from model_runtime import quant

        qspec = quant.QuantSpec(quantize)
        from model_runtime.loader import quantize_state

        graphdef, state = quantize_state(state, cfg, qspec)
    tok = load_tokenizer(
        _published_ids_tokenizer(cfg.eos_token_id),
        mask_id=cfg.mask_token_id,
        pad_id=cfg.pad_token_id,
        eos_id=cfg.eos_token_id,
    )
    rt = Runtime(
        cfg,
        tok,
        graphdef,
        state,
        model_name=f"random bf16 weights{', ' + quantize if quantize else ''}, DiffuCoder-7B shapes "
        f"({cfg.num_hidden_layers} layers)",
        model_dir=ROOT,
        dtype=jnp.bfloat16,
        length_buckets=(512, 1024),
        batch_buckets=(1,),
        quantize=qspec,
    )
    return rt


def fast_parts(rt, prompt: list[int], repeat: int) -> dict[str, float]:
    """Median seconds of one refresh and of one block step (a block's loop time over its forwards)."""
    import dataclasses

    import jax
    import jax.numpy as jnp

    from model_runtime import fast
    from model_runtime.batch import PlacedBatch
    from model_runtime.params import SamplingParams
    from model_runtime.sampling import SamplerSpec

    params = SamplingParams(max_new_tokens=NEW_TOKENS, decoder="fast")
    row = rt.make_row(prompt, NEW_TOKENS, chat=False)
    shape = rt.bucket_for(1, len(row.ids))
    batch = PlacedBatch.of([row], shape, rt.config.pad_token_id)
    x_host, attn_host = batch.x, batch.attn
    start = batch.offsets[0] + row.region[0]
    fspec = fast.FastSpec(
        sampler=dataclasses.replace(SamplerSpec.from_params(params), alg="maskgit_plus", use_alg_temp=False),
        block_length=BLOCK,
    )
    (refresh, block), _, _, _ = rt._programs.fast(shape, fspec)
    key, f0 = jax.random.key(0), jnp.float32(0.0)
    attn = jnp.asarray(attn_host)
    args = (jnp.int32(start), key, f0, jnp.float32(1.0))
    t_refresh = _timed(lambda: refresh(rt.state, jnp.asarray(x_host), attn, *args), repeat)
    x, caches = refresh(rt.state, jnp.asarray(x_host), attn, *args)
    thr = (jnp.float32(0.9), jnp.float32(1.0))

    def one_block():
        return block(rt.state, jnp.array(x), attn, caches, jnp.int32(start), key, f0, jnp.float32(1.0), *thr)

    t_block = _timed(one_block, repeat)
    forwards = int(one_block()[1])
    return {
        "canvas": shape[1],
        "refresh_ms": 1e3 * t_refresh,
        "block_ms": 1e3 * t_block,
        "block_forwards": forwards,
        "block_step_ms": 1e3 * t_block / max(forwards, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--check", action="store_true", help="a tiny model, to try the script on a CPU")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--quantize", choices=("int8", "int4"), default=None)
    parser.add_argument("--layers", type=int, default=None, help="fewer layers, same widths")
    args = parser.parse_args()

    import jax

    from model_runtime import bench
    from model_runtime.params import SamplingParams
    from model_runtime.sharding import weight_bytes_per_device

    def say(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    result: dict = {"environment": bench.environment()}
    say(f"devices: {jax.devices()}")
    result["ceilings"] = ceil = ceilings(args.repeat, small=args.check)
    say(f"ceilings: {ceil}")
    t0 = time.perf_counter()
    rt = random_runtime(args.check, args.quantize, args.layers)
    jax.block_until_ready(rt.state)
    result["init_seconds"] = time.perf_counter() - t0
    cfg = rt.config
    weight_bytes = (
        weight_bytes_per_device(cfg, 1, quantize=rt.quantize) - 2 * cfg.vocab_size * cfg.hidden_size
    )  # embedding (never quantized here): a gather
    result["model"] = {
        "name": rt.model_name,
        "parameters": cfg.param_count(),
        "weight_bytes_read": weight_bytes,
        "quantize": args.quantize,
    }
    say(f"weights ready in {result['init_seconds']:.1f}s: {cfg.param_count() / 1e9:.2f}B parameters")

    result["forward"] = []
    for length in (512, 1024):
        f = bench.forward_latency(rt, 1, length, repeat=args.repeat)
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
        result["forward"].append(f)
        say(
            f"forward 1 x {length}: {f['ms']:.2f} ms (floor {f['floor_ms']:.2f} ms), "
            f"{f['tflops']:.0f} TFLOP/s"
        )

    text = "def parse_config(path):\n    " * 64
    new_tokens = 32 if args.check else NEW_TOKENS
    prompt = rt.tokenizer.encode(text)[:PROMPT_TOKENS]
    result["fast_parts"] = parts = fast_parts(rt, prompt, args.repeat)
    say(f"fast decoder parts: {parts}")
    for tpf in (1, 2, 3):
        t = parts["refresh_ms"] + math.ceil((BLOCK - 1) / tpf) * parts["block_step_ms"]
        parts[f"modeled_tokens_per_s_tpf{tpf}"] = 1e3 * BLOCK / t

    result["generation"] = []
    for decoder in ("reference", "fast"):
        p = SamplingParams(max_new_tokens=new_tokens, steps=new_tokens, decoder=decoder)
        g = bench.generation(rt, [prompt], p, repeat=3)
        g.pop("generated")
        g["tokens_per_forward"] = new_tokens / g["forwards"]
        result["generation"].append(g)
        say(
            f"generate {decoder}: {g['tokens_per_second']:.1f} tok/s, {g['forwards']} forwards, "
            f"{1e3 * g['seconds_per_forward']:.2f} ms per forward, compile {g['compile_seconds']:.1f}s"
        )

    out = json.dumps(result, indent=2)
    if args.json:
        args.json.write_text(out + "\n")
    print(out)
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
