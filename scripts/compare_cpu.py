"""Side by side on one checkpoint: the published sampler in eager float32 PyTorch, our reference decoder,
our fast decoder (issue 8's comparison).

    .venv/bin/python scripts/compare_cpu.py [--model DIR] [--json OUT.json]

Without --model it writes a 4-layer x 256-hidden random checkpoint in the published layout (BPE vocabulary
of 8192 trained on the interpreter's standard library). Settings: 256 new tokens, 256 steps, greedy,
entropy, the inherited top_k=50, a 64-token prompt, so the canvas is 320 tokens. Every implementation gets
one warm-up generation (compilation, oneDNN primitive creation); then --repeat interleaved rounds each time
the PyTorch sampler, our reference decoder, our fast decoder and the matmul ceiling back to back (this
kind of machine drifts in speed over minutes), and the medians are reported.

The ceiling is the faster of two 2048 x 2048 float32 matmul rates (XLA's and PyTorch's), medians over the
rounds.
Two efficiency figures for our reference decoder: the published step's FLOPs (one full-canvas forward with
logits for every position, what the reference computes) over our time per step, and the FLOPs our step
actually executes (the last layer, lm_head and the sampler only for the still-masked rows, gathered into
row buckets; model_runtime.bench.reference_step_flops), averaged over the schedule, over the same time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

NEW_TOKENS = STEPS = 256
PROMPT_TOKENS = 64


def stdlib_corpus(limit: int = 300) -> list[str]:
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:limit]
    return [f.read_text(encoding="utf-8", errors="replace") for f in files]


def build_checkpoint(out: Path) -> Path:
    from model_runtime.tiny import write_tiny_checkpoint

    return write_tiny_checkpoint(
        out,
        vocab=8192,
        shards=2,
        corpus=stdlib_corpus(),
        hidden_size=256,
        intermediate_size=1024,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
    )


class Contenders:
    """What the rounds time on one prompt: the published sampler in eager float32 PyTorch (the same code
    the parity tests use), our decoders, and the two matmul rates."""

    def __init__(self, rt: Any, model_dir: Path, prompt: list[int]) -> None:
        import torch

        from tests.reference import dream_torch

        self.rt, self.prompt = rt, prompt
        self.ref_model = dream_torch.DreamReference.from_dir(model_dir)
        self.a = torch.randn(2048, 2048)

    def torch_generate(self) -> Any:
        import torch

        from tests.reference import dream_torch

        with torch.no_grad():
            return dream_torch.diffusion_generate(
                self.ref_model,
                torch.tensor([self.prompt]),
                max_new_tokens=NEW_TOKENS,
                steps=STEPS,
                mask_id=self.rt.config.mask_token_id,
                alg="entropy",
            )[0]

    def ours_generate(self, p: Any) -> Any:
        return list(self.rt.generate([self.prompt], p, chat=False, stream=False))[-1]

    def torch_matmul(self) -> float:
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            self.a @ self.a
            times.append(time.perf_counter() - t0)
        return 2 * 2048**3 / statistics.median(times) / 1e9


def executed_flops(rt: Any, length: int) -> float:
    """Our reference decoder's executed FLOPs per step, averaged over the schedule: the masks left at
    each step decide how many rows it gathers."""
    from model_runtime import bench
    from model_runtime.kernels import gathered_rows
    from model_runtime.sampling import schedule_counts

    window = rt.window_for(NEW_TOKENS, rt.bucket_for(1, length)[1]) or length
    left, executed = NEW_TOKENS, []
    for count in schedule_counts(NEW_TOKENS, STEPS, 1e-3):
        rows = gathered_rows(left, window, rt.programs.row_buckets)
        executed.append(bench.reference_step_flops(rt.config, 1, length, rows))
        left -= count
    return statistics.mean(executed)


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def rounds(c: Contenders, params: Any, fast_params: Any, repeat: int) -> tuple[dict[str, list[float]], Any]:
    """Warm-up, then ``repeat`` interleaved rounds; the timings and the first decoders' last answers.

    Warm-up: compilation, oneDNN primitive creation, first-touch of the weights (the matmul rates take
    medians, and XLA's warms itself up). Then each round times every implementation and the matmul
    ceiling back to back: this machine's speed drifts by 20% or more over minutes, and drift hits them
    all alike."""
    from model_runtime import bench

    torch_seq = c.torch_generate()
    ours_done, fast_done = c.ours_generate(params), c.ours_generate(fast_params)
    runs: dict[str, list[float]] = {"pytorch": [], "reference": [], "fast": [], "xla_mm": [], "torch_mm": []}
    for _ in range(repeat):
        runs["xla_mm"].append(bench.matmul_gflops(repeat=5))
        runs["torch_mm"].append(c.torch_matmul())
        runs["pytorch"].append(timed(c.torch_generate)[0])
        seconds, ours_done = timed(lambda: c.ours_generate(params))
        runs["reference"].append(seconds)
        seconds, fast_done = timed(lambda: c.ours_generate(fast_params))
        runs["fast"].append(seconds)
    return runs, (torch_seq, ours_done, fast_done)


def parity(c: Contenders, params: Any, torch_seq: Any, ours_done: Any) -> tuple[bool, bool]:
    """Same outputs: (identical tokens, every step tie-aware). The second replays each reference step
    from our previous canvas; positions may differ only where the reference's confidences tie."""
    import numpy as np
    import torch

    from model_runtime.interface import BatchStep
    from tests.reference import dream_torch
    from tests.reference.parity import assert_step_matches

    identical = bool(torch_seq[0, PROMPT_TOKENS:].tolist() == ours_done.generated[0])
    if identical:
        return True, True
    mask_id = c.rt.config.mask_token_id
    events = c.rt.generate([c.prompt], params, chat=False)
    history = [np.array(e.content) for e in events if isinstance(e, BatchStep)]
    x, mask4, tok_idx = dream_torch.prepare(torch.tensor([c.prompt]), None, NEW_TOKENS, mask_id)
    prev = x.numpy()
    try:
        for i, canvas in enumerate(history):
            ref, conf, _ = dream_torch.step(
                c.ref_model, torch.tensor(prev), mask4, tok_idx, i, steps=STEPS, mask_id=mask_id
            )
            assert_step_matches(prev, canvas, ref.numpy(), conf.numpy(), mask_id, f"step {i}")
            prev = canvas
    except AssertionError as exc:
        print(f"parity: {exc}", file=sys.stderr)
        return False, False
    return False, True


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--repeat", type=int, default=5, help="interleaved timing rounds (default 5)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    import numpy as np

    import model_runtime
    from model_runtime import SamplingParams, bench

    model_dir = args.model or build_checkpoint(
        Path(tempfile.mkdtemp(prefix="diffu-compare-")) / "dream-4x256"
    )
    rt = model_runtime.load(model_dir)
    text = '"""Utilities for parsing, validating and formatting configuration files."""\n' * 8
    prompt = rt.tokenizer.encode(text)[:PROMPT_TOKENS]
    assert len(prompt) == PROMPT_TOKENS
    length = PROMPT_TOKENS + NEW_TOKENS
    flops_per_step = bench.forward_flops(rt.config, 1, length)
    executed_per_step = executed_flops(rt, length)
    contenders = Contenders(rt, model_dir, prompt)
    params = SamplingParams(max_new_tokens=NEW_TOKENS, steps=STEPS, alg="entropy", temperature=0.0)
    fast_params = SamplingParams(max_new_tokens=NEW_TOKENS, decoder="fast")
    runs, (torch_seq, ours_done, fast_done) = rounds(contenders, params, fast_params, args.repeat)
    medians = {name: statistics.median(values) for name, values in runs.items()}
    matmul = max(medians["xla_mm"], medians["torch_mm"])
    print(
        f"matmul ceiling: {matmul:.1f} GFLOP/s (XLA {medians['xla_mm']:.1f}, PyTorch "
        f"{medians['torch_mm']:.1f}); step: {flops_per_step / 1e9:.2f} GFLOP published, "
        f"{executed_per_step / 1e9:.2f} executed",
        file=sys.stderr,
    )
    print(
        f"pytorch reference {medians['pytorch']:.2f}s, reference decoder {medians['reference']:.2f}s, fast "
        f"decoder {medians['fast']:.2f}s (medians of {args.repeat} interleaved rounds)",
        file=sys.stderr,
    )
    identical, ties_ok = parity(contenders, params, torch_seq, ours_done)
    agreement = float(np.mean(np.array(fast_done.generated[0]) == np.array(ours_done.generated[0])))
    result = summary(rt.config, runs, (flops_per_step, executed_per_step), fast_done)
    result |= {
        "same_tokens_as_pytorch": identical,
        "steps_match_pytorch_tie_aware": ties_ok,
        "fast_token_agreement_with_reference": agreement,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    print(
        f"reference decoder {result['reference_vs_pytorch']:.2f}x PyTorch, "
        f"{100 * result['matmul_efficiency']:.0f}% of matmul (published step FLOPs; "
        f"{100 * result['executed_matmul_efficiency']:.0f}% executed FLOPs); "
        f"fast {result['fast_vs_reference']:.2f}x reference; medians of {args.repeat} interleaved rounds",
        file=sys.stderr,
    )
    return 0


def summary(
    cfg: Any, runs: dict[str, list[float]], flops: tuple[float, float], fast_done: Any
) -> dict[str, Any]:
    """The figures of the JSON: per implementation its median time, rate and efficiency, and the ratios
    (the parity and agreement fields are added by the caller, last)."""
    from model_runtime import bench

    flops_per_step, executed_per_step = flops
    torch_seconds, ours_seconds, fast_seconds = (
        statistics.median(runs[name]) for name in ("pytorch", "reference", "fast")
    )
    xla_matmul, torch_matmul_rate = statistics.median(runs["xla_mm"]), statistics.median(runs["torch_mm"])
    matmul = max(xla_matmul, torch_matmul_rate)
    torch_tps, ours_tps, fast_tps = (NEW_TOKENS / t for t in (torch_seconds, ours_seconds, fast_seconds))
    step_seconds = ours_seconds / STEPS
    return {
        "environment": bench.environment(),
        "model": {
            "layers": cfg.num_hidden_layers,
            "hidden": cfg.hidden_size,
            "intermediate": cfg.intermediate_size,
            "heads": cfg.num_attention_heads,
            "kv_heads": cfg.num_key_value_heads,
            "vocab": cfg.vocab_size,
        },
        "settings": {
            "prompt_tokens": PROMPT_TOKENS,
            "new_tokens": NEW_TOKENS,
            "steps": STEPS,
            "alg": "entropy",
            "temperature": 0.0,
            "top_k": 50,
        },
        "matmul_gflops": matmul,
        "matmul_gflops_xla": xla_matmul,
        "matmul_gflops_pytorch": torch_matmul_rate,
        "matmul_runs": {"xla": runs["xla_mm"], "pytorch": runs["torch_mm"]},
        "pytorch_reference": {
            "seconds": torch_seconds,
            "runs": runs["pytorch"],
            "tokens_per_second": torch_tps,
            "ms_per_step": torch_seconds / STEPS * 1e3,
            "gflops_per_second": flops_per_step / (torch_seconds / STEPS) / 1e9,
        },
        "reference_decoder": {
            "seconds": ours_seconds,
            "runs": runs["reference"],
            "tokens_per_second": ours_tps,
            "ms_per_step": step_seconds * 1e3,
            "gflops_per_second": flops_per_step / step_seconds / 1e9,
            "executed_gflops_per_step": executed_per_step / 1e9,
            "executed_gflops_per_second": executed_per_step / step_seconds / 1e9,
        },
        "fast_decoder": {
            "seconds": fast_seconds,
            "runs": runs["fast"],
            "tokens_per_second": fast_tps,
            "forwards": fast_done.stats.steps,
        },
        "reference_vs_pytorch": ours_tps / torch_tps,
        "reference_vs_pytorch_per_round": [
            t / o for t, o in zip(runs["pytorch"], runs["reference"], strict=True)
        ],
        "matmul_efficiency": flops_per_step / step_seconds / 1e9 / matmul,
        "executed_matmul_efficiency": executed_per_step / step_seconds / 1e9 / matmul,
        "pytorch_matmul_efficiency": flops_per_step / (torch_seconds / STEPS) / 1e9 / matmul,
        "fast_vs_reference": fast_tps / ours_tps,
    }


if __name__ == "__main__":
    sys.exit(main())
