"""The device check: everything this project wants to know about one accelerator, in one command.

    python scripts/device_check.py [--out DIR] [--budget 450] [--small] [--modes bf16,int8,int4,w8a8]
                                   [--hlo-dir DIR]

About 7 minutes on one H100 (``--budget`` seconds, default 450: each part is skipped, and said so, when
the time left is below its estimate; results are written after every part, so a run stopped from
outside keeps what it measured). Writes ``DIR/device_check.json`` and ``DIR/device_check.md`` (default
DIR: ``device_check/``). No checkpoint is read: random weights in the DiffuCoder-7B shapes (28 layers,
hidden 3584, MLP 18944, 28 query / 4 KV heads of 128, vocabulary 152064), bf16, drawn on the device and
quantized there with the loader's rounding (``random_weights.random_runtime``). Canvas 512 (256-token prompt,
256 new tokens), block 32, greedy. In order:

1. ``ceilings``: a bf16 8192^3 matmul (TFLOP/s) and an elementwise pass over 1 GiB (bytes read and
   written per second): the floors the step times are set against.
2. ``build``: one runtime per mode, all kept: bf16, int8, int4 (the Pallas kernels where
   ``QuantSpec(kernel="auto")`` selects them, ``quant.QuantSpec.resolved``), and W8A8 (int8 weights
   and int8 activations for products of 256 rows or more; an option, not a default).
3. ``parts``: one full forward (batch 1), the fast decoder's refresh and its block step
   (``bench.forward_latency``, ``bench.fast_parts``).
4. ``fusion``: the HLO verdict on the compiled refresh and block programs (``hlo.fusion_verdict``):
   is the dequantization fused into the matmuls? (``--hlo-dir``: the texts too.)
5. ``generation``: tokens/s at batch 1 of every decoder in ``bench.DECODERS`` (the reference decoder
   streams: one step program, the same per-step work as its fused loop, a tenth of its compile time).
6. ``agreement``: each decoder on 8 fixed prompts (batch 8; each repeated to 256 tokens), quantized
   against bf16: the share of generated tokens equal position by position, and the identical answers.
7. ``batch``: the fast decoder's tokens/s at batch 8 and 32 (batch 1 is in ``generation``).
8. ``kernels``: each distinct 7B projection alone at the block step's 32 rows and the refresh's 512:
   bf16, and int8 / int4 through XLA's path and through the kernel (and W8A8 at 512 rows).
9. ``cost_model``: per mode and decoder, the tokens/s each decoder's cost model (``Decoder.cost``)
   predicts from the measured forward times at the measured tokens per forward, and at 1, 2 and 3.

``--small`` runs the same code on a 1-layer, 64-wide model with the bundled vocabulary (canvas 32,
batches 1 and 2, block 16), int4 through the Pallas kernels in interpret mode, every line once rather
than every combination (the reference decoder in bf16 only, one agreement prompt, the batch sweep in
bf16 only, one projection in ``kernels``): a check of the script and of the kernel path in the whole
runtime, which the test suite runs; its figures say nothing about any device.

The exit code is 1 when any part failed (its error is in the JSON and the table).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from model_runtime import bench, compile_cache, hlo, quant, random_weights  # noqa: E402
from model_runtime.config import DIFFUCODER_7B, DreamConfig  # noqa: E402
from model_runtime.sharding import weight_bytes_per_device  # noqa: E402
from model_runtime.weights import ParamSpec, by_path  # noqa: E402
from scripts.device_report import markdown, targets  # noqa: E402

MODES = ("bf16", "int8", "int4", "w8a8")
PROMPTS = [
    "def fibonacci(n):\n",
    "import os\n\ndef list_files(path):\n",
    "class Stack:\n    def __init__(self):\n",
    "def binary_search(items, target):\n",
    "def read_json(path):\n",
    "def merge_sort(xs):\n",
    "def word_count(text):\n",
    "def parse_args():\n",
]


@dataclasses.dataclass(frozen=True)
class Setup:
    """What a run measures: the model, the canvas and the batches."""

    raw_config: dict[str, Any]
    prompt_tokens: int
    new_tokens: int
    batches: tuple[int, ...]
    repeat: int
    group: int  # int4 group
    ceiling_n: int
    copy_elements: int
    small: bool

    @property
    def canvas(self) -> int:
        return self.prompt_tokens + self.new_tokens

    @property
    def block(self) -> int:
        """The fast decoder's block: its default length, or the whole region when that is shorter."""
        return min(_fast_case().params(self.new_tokens).block_length, self.new_tokens)

    def decoders(self, mode: str, part: str) -> tuple[Any, ...]:
        """The decoders ``part`` measures in ``mode``: all of ``bench.DECODERS``; in the small mode, where
        the point is running every line once, the reference decoder only in bf16's ``generation`` (its
        step program takes seconds to compile on a CPU, whatever the model's size)."""
        if self.small and (mode != "bf16" or part != "generation"):
            return tuple(c for c in bench.DECODERS if c.name == "fast")
        return bench.DECODERS

    @property
    def agreement_batch(self) -> int:
        """The fixed prompts: 8 (the second batch size); the small mode runs one, on the programs it
        compiled for batch 1 (every compile costs seconds on a CPU)."""
        return self.batches[0] if self.small else self.batches[1]

    def kernel(self, mode: str) -> str:
        """``QuantSpec.kernel`` for ``mode``: "auto" (the Pallas kernels on one GPU); in the small mode
        the kernels in interpret mode for int4 (the packed layout, the most code) and XLA's path for the
        others (interpret mode is slow to compile; test_qmatmul.py checks the int8 kernel)."""
        if not self.small:
            return "auto"
        return "interpret" if mode == "int4" else "xla"


def setup(small: bool) -> Setup:
    if not small:
        return Setup(dict(DIFFUCODER_7B), 256, 256, (1, 8, 32), 3, 128, 8192, 1 << 29, False)
    return Setup(random_weights.small_config().to_dict(), 16, 16, (1, 2), 1, 16, 256, 1 << 16, True)


def qspec(mode: str, s: Setup) -> Any:
    if mode == "bf16":
        return None
    if mode == "w8a8":
        return quant.QuantSpec("int8", kernel=s.kernel(mode), activations="int8")
    return quant.QuantSpec(mode, group=s.group, kernel=s.kernel(mode))


class Check:
    """The run: the results so far, the time budget, and the files they are written to."""

    def __init__(self, out: Path, budget: float, setup: Setup, modes: list[str]) -> None:
        self.out, self.setup, self.modes = out, setup, modes
        self.t0 = time.monotonic()
        self.deadline = self.t0 + budget
        self.result: dict[str, Any] = {
            "environment": bench.environment(),
            "settings": {
                "small": setup.small,
                "canvas": setup.canvas,
                "prompt_tokens": setup.prompt_tokens,
                "new_tokens": setup.new_tokens,
                "block_length": setup.block,  # the fast decoder's default, cut to the region
                "batches": list(setup.batches),
                "budget_seconds": budget,
            },
            "modes": {m: {} for m in modes},
            "skipped": [],
            "errors": [],
        }
        self.runtimes: dict[str, Any] = {}
        self.float_answers: dict[str, list[list[int]]] = {}  # bf16's answers, per decoder
        self.hlo_dir: Path | None = None  # where the fusion part writes the HLO it read

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def part(self, at: tuple[str, ...], estimate: float, fn: Callable[[], Any]) -> None:
        """Run one part if the budget allows ``estimate`` more seconds, store its result at the path ``at``
        of the results (``("modes", "int8", "parts")``), and write the files."""
        name = " ".join(at[1:] if at[0] == "modes" else at)
        if estimate > 0 and self.left() < estimate:  # an estimate of 0: no device time, always run
            left = max(0.0, self.left())
            self.result["skipped"].append(f"{name}: {left:.0f} s left, about {estimate:.0f} s needed")
            say(f"skip {name}: time budget")
            return
        t0 = time.monotonic()
        try:
            value = fn()
            node = self.result
            for key in at[:-1]:
                node = node.setdefault(key, {})
            node[at[-1]] = value
            say(f"{name}: {time.monotonic() - t0:.1f} s")
        except Exception as exc:  # one failed part must not cost the others
            error = f"{type(exc).__name__}: {exc}"
            self.result["errors"].append({"part": name, "error": error, "traceback": traceback.format_exc()})
            say(f"FAILED {name}: {error}")
        self.write()

    def write(self) -> None:
        self.result["elapsed_seconds"] = time.monotonic() - self.t0
        self.result["targets"] = targets(self.result)
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "device_check.json").write_text(json.dumps(self.result, indent=2, default=str) + "\n")
        (self.out / "device_check.md").write_text(markdown(self.result))


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _median_ms(fn: Callable[[], Any], repeat: int) -> float:
    return 1e3 * bench.median_seconds(fn, repeat)[0]


# -- the parts ------------------------------------------------------------------------------------------


def build(check: Check, mode: str) -> dict[str, Any]:
    s = check.setup
    cfg = DreamConfig.from_dict(s.raw_config)
    stats0 = jax.devices()[0].memory_stats() or {}
    t0 = time.perf_counter()
    tokenizer = next((rt.rows.tokenizer for rt in check.runtimes.values()), None)
    rt = random_weights.random_runtime(
        cfg,
        dtype=jnp.bfloat16,
        quantize=qspec(mode, s),
        length_buckets=(s.canvas,),
        batch_buckets=s.batches,
        tokenizer=tokenizer,
    )
    jax.block_until_ready(rt.state)
    check.runtimes[mode] = rt
    stats1 = jax.devices()[0].memory_stats() or {}
    used = stats1.get("bytes_in_use", 0) - stats0.get("bytes_in_use", 0) if stats1 else None
    return {
        "seconds": time.perf_counter() - t0,
        "parameters": cfg.param_count(),
        "weight_bytes": weight_bytes_per_device(cfg, 1, quantize=rt.quantize),
        "device_bytes_in_use": used,
        "kernel": rt.quantize.kernel if rt.quantize else None,
    }


def prompts(rt: Any, s: Setup, batch: int) -> list[list[int]]:
    """``batch`` of the fixed prompts, each repeated to exactly ``prompt_tokens`` tokens (the fast decoder
    wants every row's region in the same columns)."""
    out = []
    for i in range(batch):
        ids = rt.rows.tokenizer.encode(PROMPTS[i % len(PROMPTS)])
        out.append((ids * (s.prompt_tokens // len(ids) + 1))[: s.prompt_tokens])
    return out


def _fast_case() -> Any:
    return next(c for c in bench.DECODERS if c.name == "fast")


def parts(check: Check, mode: str) -> dict[str, Any]:
    rt, s = check.runtimes[mode], check.setup
    f = bench.forward_latency(rt, 1, s.canvas, repeat=s.repeat)
    fast = _fast_case().params(s.new_tokens)
    p = bench.fast_parts(rt, prompts(rt, s, 1), fast, s.repeat)
    return {"forward_ms": 1e3 * f["median_seconds"], "forward_compile_seconds": f["compile_seconds"], **p}


def fusion(check: Check, mode: str) -> dict[str, Any]:
    """The HLO verdict on the fast decoder's refresh and block programs (compiled by ``parts``); the
    texts are written next to the results."""
    rt, s = check.runtimes[mode], check.setup
    params = _fast_case().params(s.new_tokens)
    out = {}
    for kind, text in bench.fast_program_texts(rt, prompts(rt, s, 1), params).items():
        if check.hlo_dir is not None:
            check.hlo_dir.mkdir(parents=True, exist_ok=True)
            (check.hlo_dir / f"{kind}_{mode}.hlo.txt").write_text(text)
        out[kind] = hlo.fusion_verdict(text, bench.quantized_shapes(rt))
    return out


def generation(check: Check, mode: str, case: Any, batch: int, *, keep: bool = True) -> dict[str, Any]:
    """Tokens/s of one decoder at ``batch``; ``keep``: with the generated tokens."""
    rt, s = check.runtimes[mode], check.setup
    params = case.params(s.new_tokens)
    # A decoder of full forwards streams: its one-step program, not the fused loop of every step (one more
    # long compile, for the same forwards).
    stream = case.decoder.full_forwards
    g = bench.generation(rt, prompts(rt, s, batch), params, repeat=1, stream=stream, compile_first=True)
    g["tokens_per_forward"] = s.new_tokens / max(g["forwards"], 1)
    if not keep:
        g.pop("generated")
    return g


def agreement(check: Check, mode: str) -> dict[str, Any]:
    """Each decoder's greedy answers to the fixed prompts against bf16's (kept in memory for this)."""

    out: dict[str, Any] = {}
    for case in check.setup.decoders(mode, "agreement"):
        got = generation(check, mode, case, check.setup.agreement_batch)["generated"]
        if mode == "bf16":
            check.float_answers[case.name] = got
            continue
        ref = check.float_answers.get(case.name)
        if ref is None:
            continue
        same = sum(a == b for r, g in zip(ref, got, strict=True) for a, b in zip(r, g, strict=True))
        out[case.name] = {
            "token_agree": same / sum(len(r) for r in ref),
            "identical": sum(r == g for r, g in zip(ref, got, strict=True)),
            "of": len(ref),
        }
    return out


def _projection(check: Check, k: int, n: int, m: int) -> dict[str, Any]:
    """One ``[m, k] x [k, n]`` product alone: bf16, and int8 / int4 through XLA's path and the kernel
    (and W8A8 from 256 rows), each a median over repeats."""

    s = check.setup
    spec = ParamSpec("w", ("w",), (k, n), (k, n), ("embed", "mlp"), lambda a: a, lambda a: a, contract=(0,))
    w = 0.02 * jax.random.normal(jax.random.key(0), (k, n), jnp.bfloat16)
    x = jax.random.normal(jax.random.key(1), (m, k), jnp.bfloat16)
    row: dict[str, Any] = {
        "m": m,
        "k": k,
        "n": n,
        "bf16_ms": _median_ms(lambda: jax.jit(jnp.matmul)(x, w), s.repeat),
    }
    kernel = "interpret" if s.small else "pallas"
    variants: list[tuple[str, str, str | None]] = [
        ("int8", "xla", None),
        ("int8", kernel, None),
        ("int4", "xla", None),
        ("int4", kernel, None),
    ]
    if m >= quant.W8A8_MIN_ROWS:
        variants.append(("int8", "xla", "int8"))
    for mode, impl, act in variants:
        q = quant.QuantSpec(mode, group=min(s.group, k), kernel=impl, activations=act)
        qa = jax.jit(lambda w, q=q: quant.stored(*quant.quantize_device(w, spec, q), spec, q))(w)
        product = jax.jit(lambda x, qa: quant.dense("mk,kn->mn", x, qa))
        name = "w8a8_xla" if act else f"{mode}_{'xla' if impl == 'xla' else 'kernel'}"
        row[f"{name}_ms"] = _median_ms(functools.partial(product, x, qa), s.repeat)
    return row


def kernels(check: Check) -> list[dict[str, Any]]:
    """Each distinct projection of the model alone at the block step's rows (batch 1) and the refresh's."""

    s = check.setup
    out, seen = [], set()
    specs = [spec for spec in by_path(DreamConfig.from_dict(s.raw_config)).values() if spec.quantizable]
    if s.small:  # checks the code on one weight, the smallest
        specs = [min(specs, key=lambda spec: spec.size)]
    for spec in specs:
        k = int(np.prod([spec.shape[i] for i in spec.contract]))
        if (k, spec.size // k) in seen:
            continue
        seen.add((k, spec.size // k))
        for m in (s.block, max(s.canvas, quant.W8A8_MIN_ROWS)):
            row = {"name": spec.name.split(".")[-2], **_projection(check, k, spec.size // k, m)}
            out.append(row)
            say(f"kernels {row}")
    return out


def cost_model(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Predicted against measured tokens/s, per mode and decoder (no device time)."""
    out = []
    block = result["settings"]["block_length"]
    for mode, r in result["modes"].items():
        p = r.get("parts")
        for case in bench.DECODERS:
            g = r.get("generation", {}).get(case.name)
            if p is None or g is None:
                continue
            row = {"mode": mode, "decoder": case.name, "measured": g["tokens_per_second"]}
            row["tokens_per_forward"] = tpf = g["tokens_per_forward"]
            row["modeled"] = bench.modeled_tokens_per_second(case, p, block, tpf)
            for t in (1, 2, 3):
                row[f"modeled_tpf{t}"] = bench.modeled_tokens_per_second(case, p, block, t)
            out.append(row)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path("device_check"), help="where the JSON and table go")
    parser.add_argument("--hlo-dir", type=Path, default=None, help="write the programs' optimized HLO here")
    parser.add_argument("--budget", type=float, default=450.0, help="seconds (default 450)")
    parser.add_argument("--small", action="store_true", help="a tiny model: check the script on a CPU")
    parser.add_argument("--modes", default=",".join(MODES), help=f"a subset of {','.join(MODES)}")
    args = parser.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    if not modes or modes[0] != "bf16" or set(modes) - set(MODES):
        parser.error(f"--modes: bf16 first (the others are set against it), then any of {MODES[1:]}")

    s = setup(args.small)
    # The persistent cache: a second run (after a failed part, say) loads the programs it compiled.
    compile_cache.enable()
    check = Check(args.out, args.budget, s, modes)
    check.hlo_dir = args.hlo_dir
    say(f"devices: {jax.devices()}; writing {args.out}/device_check.json and .md")
    # Seconds each part may take on one H100 (compiling dominates: a 28-layer program compiles in about
    # 7 s); a part starts only while its estimate fits in the time left. The small mode ignores them.
    est = (lambda seconds: 0.0) if s.small else (lambda seconds: seconds)
    ceilings = functools.partial(bench.device_ceilings, s.ceiling_n, s.copy_elements)
    check.part(("ceilings",), est(10), ceilings)
    for mode in modes:
        check.part(("modes", mode, "build"), est(20), functools.partial(build, check, mode))
    built = [m for m in modes if m in check.runtimes]
    for mode in built:
        check.part(("modes", mode, "parts"), est(25), functools.partial(parts, check, mode))
    for mode in built[1:]:
        check.part(("modes", mode, "fusion"), est(2), functools.partial(fusion, check, mode))
    for mode in built:
        for case in s.decoders(mode, "generation"):
            one = functools.partial(generation, check, mode, case, 1, keep=False)
            check.part(("modes", mode, "generation", case.name), est(15), one)
    for mode in built:
        at = ("modes", mode, "agreement")
        check.part(
            at, est(15 * len(s.decoders(mode, "agreement"))), functools.partial(agreement, check, mode)
        )
    fast = _fast_case()
    for batch in s.batches[1:]:
        for mode in built if not s.small else built[:1]:  # the small mode: the code runs once
            sweep = functools.partial(generation, check, mode, fast, batch, keep=False)
            check.part(("modes", mode, "batch", str(batch)), est(20 if batch <= 8 else 30), sweep)
    check.part(("kernels",), est(60), functools.partial(kernels, check))
    check.part(("cost_model",), 0, functools.partial(cost_model, check.result))
    print((args.out / "device_check.md").read_text())
    return 1 if check.result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
