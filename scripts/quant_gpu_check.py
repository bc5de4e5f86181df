"""DiffuCoder-7B shapes, bf16 against int8 and int4 weights, on one accelerator; and does XLA fuse the
dequantization into the matmul?

    python scripts/quant_gpu_check.py --json OUT.json [--hlo-dir DIR] [--layers N] [--small]

(a) For bf16, int8 and int4 in turn: random bf16 weights in the published 7B shapes drawn on the device,
    quantized there (``quant.quantize_state``: the loader's rounding, layout and forward), then the
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
import gc
import json
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

FLOAT_TYPES = ("bf16", "f16", "f32")
INT_TYPES = ("s8", "s4", "u8", "u4")
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(\w+)\[([\d,]*)\]\S*\s+([\w\-]+)\(")
_COMP = re.compile(r"^\s*(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_CALLS = re.compile(
    r"(?:calls|called_computations|to_apply|body|condition)=\{?%?([\w.\-]+(?:,\s*%?[\w.\-]+)*)\}?"
)


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def parse_hlo(text: str) -> dict[str, list[tuple[str, str, tuple[int, ...], str, str]]]:
    """Computation name -> its instructions as (name, element type, dims, opcode, whole line)."""
    comps: dict[str, list] = {}
    current = None
    for line in text.splitlines():
        if current is None or line.rstrip().endswith("{") and "=" not in line.split("(")[0]:
            m = _COMP.match(line)
            if m and "=" not in line.split("(")[0]:
                current = m.group(1)
                comps[current] = []
                continue
        if line.strip() == "}":
            current = None
            continue
        m = _INSTR.match(line)
        if m and current is not None:
            dims = tuple(int(d) for d in m.group(3).split(",") if d)
            comps[current].append((m.group(1), m.group(2), dims, m.group(4), line))
    return comps


def _operand_type(line: str, types: dict[str, str]) -> str | None:
    """The element type of a convert's operand: printed inline (``convert(s8[..] %p)``) or looked up
    by the operand's name in its computation."""
    m = re.search(r"convert\((\w+)\[", line)
    if m:
        return m.group(1)
    m = re.search(r"convert\(%?([\w.\-]+)\)", line)
    return types.get(m.group(1)) if m else None


def fused_computations(comps: dict) -> set[str]:
    """Computations that run inside a fusion (named by a fusion instruction's ``calls=``, recursively)."""
    inside: set[str] = set()
    for instrs in comps.values():
        for _, _, _, op, line in instrs:
            if op == "fusion":
                m = re.search(r"calls=%?([\w.\-]+)", line)
                if m:
                    inside.add(m.group(1))
    grew = True
    while grew:  # a fusion's computation may call others (nested fusions, reductions' to_apply)
        grew = False
        for name in list(inside):
            for _, _, _, _, line in comps.get(name, []):
                for m in _CALLS.finditer(line):
                    for callee in re.split(r",\s*%?", m.group(1)):
                        if callee in comps and callee not in inside:
                            inside.add(callee)
                            grew = True
    return inside


def weight_signatures(shapes) -> set[tuple[int, ...]]:
    """The dimension multisets a weight of each shape can take in HLO: any adjacent dimensions merged
    (XLA bitcasts [D, H, E] to [D, H*E]), in any order (layouts, transposes), size-1 dimensions dropped.
    Matching these rather than element counts keeps a KV cache of the same size from passing for one."""
    out = set()
    for shape in shapes:
        n = len(shape)
        for cuts in range(1 << max(n - 1, 0)):  # which of the n-1 gaps between dimensions stay
            dims, cur = [], shape[0]
            for i in range(1, n):
                if cuts >> (i - 1) & 1:
                    dims.append(cur)
                    cur = shape[i]
                else:
                    cur *= shape[i]
            dims.append(cur)
            out.add(tuple(sorted(d for d in dims if d != 1)))
    return out


def fusion_verdict(text: str, weight_shapes) -> dict:
    """Whether the dequantization of integer weights (of the given shapes) is fused into the matmuls of
    this optimized HLO module; see the module docstring."""
    comps = parse_hlo(text)
    inside = fused_computations(comps)
    signatures = weight_signatures(weight_shapes)
    materialized, fused_dots, gemm_calls = [], [], []

    def from_integers(op: str, line: str, types: dict[str, str]) -> bool:
        """A weight-shaped float made from integers: a convert of one, or a fusion whose computation
        converts one (a float weight merely copied, like the embedding, is not a dequantization)."""
        if op == "convert":
            return _operand_type(line, types) in INT_TYPES
        m = re.search(r"calls=%?([\w.\-]+)", line) if op == "fusion" else None
        body = comps.get(m.group(1), []) if m else []
        inner = {n: t for n, t, *_ in body}
        return any(o == "convert" and _operand_type(ln, inner) in INT_TYPES for *_, o, ln in body)

    for name, instrs in comps.items():
        types = {iname: ty for iname, ty, *_ in instrs}
        for iname, ty, dims, op, line in instrs:
            if name not in inside:
                if (
                    ty in FLOAT_TYPES
                    and tuple(sorted(d for d in dims if d != 1)) in signatures
                    and from_integers(op, line, types)
                ):
                    materialized.append(f"{name}: {iname} = {ty}{list(dims)} {op}")
                if op == "custom-call" and ("gemm" in line or "matmul" in line or "cublas" in line):
                    gemm_calls.append(f"{name}: {iname} {ty}{list(dims)}")
        if name in inside:
            ops = {op for _, _, _, op, _ in instrs}
            int_convert = any(
                op == "convert" and _operand_type(line, types) in INT_TYPES for *_, op, line in instrs
            )
            if int_convert and ("dot" in ops or "custom-call" in ops):
                fused_dots.append(name)
    # A fusion whose computation converts an integer operand and contains the dot; or a gemm custom
    # call reading the integer weight directly.
    int_gemm = [g for g in gemm_calls if re.search(r"\b(s8|s4)\[", g)]
    # Loop bodies (a while's result is a tuple, which the instruction pattern skips: read the raw text).
    bodies = set(re.findall(r"body=%?([\w.\-]+)", text))
    hoisted = bool(bodies) and any(m.split(":")[0] not in bodies for m in materialized)
    if materialized:
        verdict = "NOT FUSED: a float copy of a quantized weight is materialised before the matmul"
        if hoisted:
            verdict += " (some outside the decoding loop: hoisted, alive for the whole block)"
    elif fused_dots:
        verdict = "FUSED: the integer weight is converted inside the fusion that does the matmul"
    else:
        verdict = "INCONCLUSIVE: no weight-sized float buffer, but no fusion with an int convert and a dot"
    return {
        "verdict": verdict,
        "fused": bool(fused_dots) and not materialized,
        "hoisted_out_of_loop": hoisted,
        "materialized_weight_buffers": materialized[:20],
        "fusions_with_int_convert_and_dot": fused_dots[:20],
        "gemm_custom_calls": gemm_calls[:20],
        "int_gemm_custom_calls": int_gemm[:20],
    }


def hlo_checks(cfg, hlo_dir: Path | None) -> dict:
    """Compile one quantized projection and a one-layer forward per mode; verdict on each."""
    import dataclasses

    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from model_runtime import quant
    from model_runtime.weights import by_path

    out = {}
    spec = by_path(cfg)[("layers", 0, "mlp", "gate_kernel")]
    d, f = spec.shape
    for mode in ("int8", "int4"):
        q = quant.QuantSpec(mode)
        w = jax.random.normal(jax.random.key(0), spec.shape, jnp.bfloat16) * 0.02
        values, scale = jax.jit(lambda w, q=q: quant.quantize_device(w, spec, q))(w)
        x = jax.random.normal(jax.random.key(1), (1, 32, d), jnp.bfloat16)
        proj = jax.jit(lambda x, v, s: quant.dense("bld,df->blf", x, v, s))
        text = proj.lower(x, values, scale).compile().as_text()
        err = float(
            jnp.max(jnp.abs(proj(x, values, scale) - jnp.einsum("bld,df->blf", x, w)))
            / jnp.max(jnp.abs(jnp.einsum("bld,df->blf", x, w)))
        )
        res = {"projection": f"[1, 32, {d}] x [{d}, {f}] {mode}", "rel_err_vs_bf16": err}
        res |= fusion_verdict(text, {spec.shape})
        if hlo_dir:
            (hlo_dir / f"projection_{mode}.hlo.txt").write_text(text)
        out[f"projection_{mode}"] = res
        say(f"HLO projection {mode}: {res['verdict']}")

        # A one-layer forward at the block step's shape: every projection and lm_head quantized.
        one = dataclasses.replace(cfg, num_hidden_layers=1)
        from model_runtime.model import DreamModel

        abstract = nnx.eval_shape(lambda one=one: DreamModel(one, dtype=jnp.bfloat16, rngs=nnx.Rngs(0)))
        graphdef, state = nnx.split(abstract)
        state = jax.tree.map(lambda a: jnp.full(a.shape, 0.01, a.dtype), state)
        from model_runtime.loader import quantize_state

        qgraph, qstate = quantize_state(state, one, q)
        ids = jnp.asarray(np.arange(32)[None] % 1000, jnp.int32)
        fwd = jax.jit(lambda s, x, g=qgraph: nnx.merge(g, s)(x))
        text = fwd.lower(qstate, ids).compile().as_text()
        shapes = {s.shape for s in by_path(one).values() if q.applies(s)}
        res = {"forward": f"1 layer + lm_head, [1, 32] {mode}"} | fusion_verdict(text, shapes)
        if hlo_dir:
            (hlo_dir / f"forward_{mode}.hlo.txt").write_text(text)
        out[f"forward_{mode}"] = res
        say(f"HLO one-layer forward {mode}: {res['verdict']}")
        del state, qstate
    return out


def bytes_in_use() -> int | None:
    import jax

    stats = jax.devices()[0].memory_stats() or {}
    return stats.get("bytes_in_use")


def timings(mode: str | None, args) -> dict:
    import bench_7b_shapes as b7
    import jax

    from model_runtime import bench
    from model_runtime.sharding import weight_bytes_per_device

    gc.collect()
    before = bytes_in_use()
    t0 = time.perf_counter()
    rt = b7.random_runtime(args.small, mode, args.layers)
    jax.block_until_ready(rt.state)
    after = bytes_in_use()
    cfg = rt.config
    res = {
        "mode": mode or "bf16",
        "build_seconds": time.perf_counter() - t0,
        "weight_bytes": weight_bytes_per_device(cfg, 1, quantize=rt.quantize),
        "device_bytes_in_use": None if after is None or before is None else after - before,
    }
    f = bench.forward_latency(rt, 1, args.length, repeat=args.repeat)
    res["forward_ms"] = 1e3 * f["median_seconds"]
    prompt = rt.tokenizer.encode("def parse_config(path):\n    " * 64)[: args.length // 2]
    parts = b7.fast_parts(rt, prompt, args.repeat)
    res |= {k: parts[k] for k in ("canvas", "refresh_ms", "block_step_ms", "block_forwards")}
    if mode:
        # The real block step (already compiled above): its while loop must neither dequantize weights
        # outside a fusion nor hoist a dequantized copy out of the loop.
        from model_runtime.weights import by_path

        shapes = {s.shape for s in by_path(cfg).values() if rt.quantize.applies(s)}
        for (kind, *_), program in rt._programs.items():
            if kind in ("block", "refresh"):
                text = getattr(program, "compiled", program).as_text()
                if args.hlo_dir:
                    (args.hlo_dir / f"{kind}_{mode}.hlo.txt").write_text(text)
                res[f"{kind}_hlo"] = fusion_verdict(text, shapes)
                say(f"HLO {kind} program {mode}: {res[f'{kind}_hlo']['verdict']}")
    say(f"{res['mode']}: {res}")
    del rt
    gc.collect()
    return res


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", type=Path, required=True, help="where to write the results")
    parser.add_argument("--hlo-dir", type=Path, default=None, help="write the optimized HLO texts here")
    parser.add_argument("--layers", type=int, default=None, help="fewer layers than 28 (same widths)")
    parser.add_argument("--small", action="store_true", help="256-wide model: check the script on a CPU")
    parser.add_argument("--length", type=int, default=512, help="canvas length (default 512)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--skip-timings", action="store_true", help="only the HLO check")
    args = parser.parse_args()

    import bench_7b_shapes as b7
    import jax

    from model_runtime import bench
    from model_runtime.config import DIFFUCODER_7B, DreamConfig

    if args.hlo_dir:
        args.hlo_dir.mkdir(parents=True, exist_ok=True)
    b7.PROMPT_TOKENS = args.length // 2
    b7.NEW_TOKENS = args.length // 2
    result: dict = {"environment": bench.environment(), "args": {k: str(v) for k, v in vars(args).items()}}
    say(f"devices: {jax.devices()}")
    raw = dict(DIFFUCODER_7B)
    if args.small:
        raw.update(
            num_hidden_layers=2, max_window_layers=2, hidden_size=256, intermediate_size=512,
            num_attention_heads=4, num_key_value_heads=2,
        )  # fmt: skip
    cfg = DreamConfig.from_dict(raw)
    result["hlo"] = hlo_checks(cfg, args.hlo_dir)
    if not args.skip_timings:
        result["timings"] = [timings(mode, args) for mode in (None, "int8", "int4")]
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
