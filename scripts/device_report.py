"""The device check's report: the figures of ``scripts/device_check.py``'s results against the issue's
targets, and the tables that go into docs/performance.md and docs/quantization.md (``device_check.md``).

Apart from the measuring because it reads only the results (a dict, as ``device_check.json`` holds
them): no device time, and a report can be made again from a saved JSON.
"""

from __future__ import annotations

from typing import Any

from model_runtime import bench

# The targets (one H100, 7B shapes, batch 1): (figure, mode, bound, "max" or "min", against).
TARGETS = (
    ("block step vs bf16", "int8", 0.6, "max"),
    ("refresh vs bf16", "int8", 1.1, "max"),
    ("block step vs bf16", "int4", 0.45, "max"),
    ("fast tokens/s at batch 8 vs bf16", "int8", 1.0, "min"),
    ("block step ms", "bf16", 5.0, "max"),
)


def _figure(result: dict[str, Any], name: str, mode: str) -> float | None:
    """A figure of one mode by its table name (None where it was not measured)."""
    r = result["modes"].get(mode, {})
    p = r.get("parts", {})
    simple = {"forward ms": "forward_ms", "refresh ms": "refresh_ms", "block step ms": "block_step_ms"}
    if name in simple:
        return p.get(simple[name])
    if name.endswith(" vs bf16"):
        base_name = name[: -len(" vs bf16")]
        base_name = {"refresh": "refresh ms", "block step": "block step ms"}.get(base_name, base_name)
        mine, base = _figure(result, base_name, mode), _figure(result, base_name, "bf16")
        return None if mine is None or not base else mine / base
    if name.startswith("fast tokens/s at batch "):
        batch = name.split()[-1]
        g = r.get("batch", {}).get(batch) if batch != "1" else r.get("generation", {}).get("fast")
        return None if g is None else g["tokens_per_second"]
    if name.endswith(" tokens/s at batch 1"):
        g = r.get("generation", {}).get(name.split()[0])
        return None if g is None else g["tokens_per_second"]
    raise KeyError(name)


def targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for name, mode, bound, kind in TARGETS:
        value = _figure(result, name, mode)
        met = None if value is None else (value <= bound if kind == "max" else value >= bound)
        out.append({"figure": name, "mode": mode, "target": f"{'<=' if kind == 'max' else '>='} {bound}",
                    "value": value, "met": met})  # fmt: skip
    return out


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
    return str(v)


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(_fmt(v) for v in row) + " |" for row in rows]


def _mode_rows(result: dict[str, Any], modes: list[str]) -> list[list[Any]]:
    """The main table's rows: one figure per row, one mode per column."""
    st = result["settings"]
    names = ["forward ms", "refresh ms", "refresh vs bf16", "block step ms", "block step vs bf16"]
    names += [f"{d.name} tokens/s at batch 1" for d in bench.DECODERS]
    names += [f"fast tokens/s at batch {b}" for b in st["batches"][1:]]
    names += [f"fast tokens/s at batch {st['batches'][1]} vs bf16"]
    rows: list[list[Any]] = [[name] + [_figure(result, name, m) for m in modes] for name in names]
    build = [result["modes"][m].get("build", {}) for m in modes]
    rows.append(["weights GB"] + [b["weight_bytes"] / 1e9 if b else None for b in build])
    rows.append(["quantized products run by"] + [b.get("kernel") for b in build])
    for kind in ("refresh", "block"):
        verdicts = [result["modes"][m].get("fusion", {}).get(kind, {}).get("verdict") for m in modes]
        rows.append([f"dequantization fused, {kind} program"] + [v and v.split(":")[0] for v in verdicts])
    for d in bench.DECODERS:
        agree = [result["modes"][m].get("agreement", {}).get(d.name) for m in modes]
        cells = [a and f"{100 * a['token_agree']:.1f}% ({a['identical']}/{a['of']})" for a in agree]
        rows.append([f"{d.name}: tokens equal to bf16 (identical answers)"] + cells)
    return rows


def markdown(result: dict[str, Any]) -> str:
    """The results as the tables that go into docs/performance.md and docs/quantization.md."""
    env, st = result["environment"], result["settings"]
    modes = list(result["modes"])
    small = " (SMALL MODE: a tiny model, the figures mean nothing)" if st["small"] else ""
    lines = [
        f"# Device check: {env['device']}, JAX {env['jax']}{small}",
        "",
        f"Random bf16 weights, canvas {st['canvas']} ({st['prompt_tokens']}-token prompt, "
        f"{st['new_tokens']} new tokens), block {st['block_length']}, greedy; "
        f"{result['elapsed_seconds']:.0f} s of a {st['budget_seconds']:.0f} s budget.",
    ]
    c = result.get("ceilings")
    if c:
        lines += [
            "",
            f"Ceilings: bf16 matmul {_fmt(c['matmul_tflops'])} TFLOP/s, "
            f"copy {_fmt(c['copy_gbytes_per_s'])} GB/s (bytes read + written).",
        ]
    lines += ["", *_table(["figure", *modes], _mode_rows(result, modes))]
    lines += ["", "Targets (one H100, DiffuCoder-7B shapes, batch 1):", ""]
    t_rows = [[t["figure"], t["mode"], t["target"], t["value"], t["met"]] for t in result["targets"]]
    lines += _table(["figure", "mode", "target", "value", "met"], t_rows)
    if result.get("cost_model"):
        lines += ["", "Cost model: tokens/s measured, and predicted from the forward times at the measured "
                  "tokens per forward (TPF) and at TPF 1, 2, 3:", ""]  # fmt: skip
        keys = [
            "mode",
            "decoder",
            "measured",
            "tokens_per_forward",
            "modeled",
            "modeled_tpf1",
            "modeled_tpf2",
        ]
        keys += ["modeled_tpf3"]
        header = ["mode", "decoder", "measured", "TPF", "modeled", "TPF 1", "TPF 2", "TPF 3"]
        lines += _table(header, [[r[k] for k in keys] for r in result["cost_model"]])
    if result.get("kernels"):
        cols = ["bf16_ms", "int8_xla_ms", "int8_kernel_ms", "int4_xla_ms", "int4_kernel_ms", "w8a8_xla_ms"]
        lines += ["", "One projection alone, ms:", ""]
        rows = [
            [r["name"], f"{r['m']} x {r['k']} x {r['n']}"] + [r.get(c) for c in cols]
            for r in result["kernels"]
        ]
        lines += _table(["weight", "M x K x N", *cols], rows)
    for key in ("skipped", "errors"):
        if result.get(key):
            lines += ["", f"{key.capitalize()}:", ""]
            lines += [f"- {e if isinstance(e, str) else e['part'] + ': ' + e['error']}" for e in result[key]]
    return "\n".join(lines) + "\n"
