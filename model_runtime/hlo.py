"""Reading an optimized HLO module: is the dequantization of quantized weights fused into the matmuls?

A quantized product is *fused* when no computation outside a fusion produces a float tensor the size
of a quantized weight from its integers, and either a fusion converts the integer weight and feeds a
dot (XLA's own fused GEMM), or a kernel custom call (the Pallas kernels of ``qmatmul.py``, lowered
through Triton or Mosaic) reads the integer weight directly. *Not fused* when such a float copy is
materialised before the matmul; *hoisted* when that happens outside the decoding loop (a float copy
alive for the whole block). ``scripts/quant_gpu_check.py`` and ``scripts/device_check.py`` print the
verdict for the runtime's own programs.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

FLOAT_TYPES = ("bf16", "f16", "f32")
INT_TYPES = ("s8", "s4", "u8", "u4")
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(\w+)\[([\d,]*)\]\S*\s+([\w\-]+)\(")
_COMP = re.compile(r"^\s*(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_CALLS = re.compile(
    r"(?:calls|called_computations|to_apply|body|condition)=\{?%?([\w.\-]+(?:,\s*%?[\w.\-]+)*)\}?"
)
# Custom-call targets of kernels written in Pallas (GPU: Triton or Mosaic GPU; TPU: Mosaic).
_KERNEL_TARGETS = ("triton", "mosaic", "tpu_custom_call")

Instr = tuple[str, str, tuple[int, ...], str, str]  # name, element type, dims, opcode, whole line


def parse_hlo(text: str) -> dict[str, list[Instr]]:
    """Computation name -> its instructions."""
    comps: dict[str, list[Instr]] = {}
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


def fused_computations(comps: dict[str, list[Instr]]) -> set[str]:
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


def weight_signatures(shapes: Iterable[tuple[int, ...]]) -> set[tuple[int, ...]]:
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


def fusion_verdict(text: str, weight_shapes: Iterable[tuple[int, ...]]) -> dict[str, Any]:
    """Whether the dequantization of integer weights (of the given shapes) is fused into the matmuls of
    this optimized HLO module; see the module docstring."""
    comps = parse_hlo(text)
    inside = fused_computations(comps)
    signatures = weight_signatures(weight_shapes)
    materialized: list[str] = []
    fused_dots: list[str] = []
    gemm_calls: list[str] = []
    kernel_calls: list[str] = []

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
            if op == "custom-call" and any(t in line for t in _KERNEL_TARGETS) and re.search(r"\bs8\[", line):
                kernel_calls.append(f"{name}: {iname} {ty}{list(dims)}")
        if name in inside:
            ops = {op for _, _, _, op, _ in instrs}
            int_convert = any(
                op == "convert" and _operand_type(line, types) in INT_TYPES for *_, op, line in instrs
            )
            if int_convert and ("dot" in ops or "custom-call" in ops):
                fused_dots.append(name)
    # A gemm custom call reading the integer weight directly.
    int_gemm = [g for g in gemm_calls if re.search(r"\b(s8|s4)\[", g)]
    # Loop bodies (a while's result is a tuple, which the instruction pattern skips: read the raw text).
    bodies = set(re.findall(r"body=%?([\w.\-]+)", text))
    hoisted = bool(bodies) and any(m.split(":")[0] not in bodies for m in materialized)
    if materialized:
        verdict = "NOT FUSED: a float copy of a quantized weight is materialised before the matmul"
        if hoisted:
            verdict += " (some outside the decoding loop: hoisted, alive for the whole block)"
    elif kernel_calls:
        verdict = f"FUSED: {len(kernel_calls)} Pallas kernel calls read the integer weights"
    elif fused_dots:
        verdict = "FUSED: the integer weight is converted inside the fusion that does the matmul"
    else:
        verdict = "INCONCLUSIVE: no weight-sized float buffer, but no fusion with an int convert and a dot"
    return {
        "verdict": verdict,
        "fused": (bool(fused_dots) or bool(kernel_calls)) and not materialized,
        "hoisted_out_of_loop": hoisted,
        "materialized_weight_buffers": materialized[:20],
        "fusions_with_int_convert_and_dot": fused_dots[:20],
        "kernel_calls": kernel_calls[:20],
        "gemm_custom_calls": gemm_calls[:20],
        "int_gemm_custom_calls": int_gemm[:20],
    }
