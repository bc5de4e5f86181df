"""Side by side on one checkpoint: the published sampler in eager float32 PyTorch, our reference decoder,
our fast decoder (issue 8's comparison).

    .venv/bin/python scripts/compare_cpu.py [--model DIR] [--json OUT.json]

Without --model it writes a 4-layer x 256-hidden random checkpoint in the published layout (BPE vocabulary
of 8192 trained on the interpreter's standard library). Settings: 256 new tokens, 256 steps, greedy,
entropy, the inherited top_k=50, a 64-token prompt, so the canvas is 320 tokens. Every implementation gets
one warm-up generation (compilation, oneDNN primitive creation), then the median of --repeat timed ones.

The ceiling is the faster of two 2048 x 2048 float32 matmuls timed in the same run (XLA's and PyTorch's).
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
from pathlib import Path

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


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    import numpy as np
    import torch

    import model_runtime
    from model_runtime import SamplingParams, bench
    from model_runtime.engine import gathered_rows
    from model_runtime.sampling import schedule_counts
    from tests.reference import dream_torch
    from tests.reference.parity import assert_step_matches

    model_dir = args.model or build_checkpoint(
        Path(tempfile.mkdtemp(prefix="diffu-compare-")) / "dream-4x256"
    )
    rt = model_runtime.load(model_dir)
    cfg = rt.config
    text = '"""Utilities for parsing, validating and formatting configuration files."""\n' * 8
    prompt = rt.tokenizer.encode(text)[:PROMPT_TOKENS]
    assert len(prompt) == PROMPT_TOKENS
    length = PROMPT_TOKENS + NEW_TOKENS
    flops_per_step = bench.forward_flops(cfg, 1, length)

    # Executed FLOPs: the masks left at each step (the schedule) decide how many rows a step gathers.
    window = rt.window_for(NEW_TOKENS, rt.bucket_for(1, length)[1]) or length
    left, executed = NEW_TOKENS, []
    for count in schedule_counts(NEW_TOKENS, STEPS, 1e-3):
        executed.append(bench.reference_step_flops(cfg, 1, length, gathered_rows(left, window)))
        left -= count
    executed_per_step = statistics.mean(executed)

    xla_matmul = bench.matmul_gflops()
    a = torch.randn(2048, 2048)
    torch_times = []
    for _ in range(11):
        t0 = time.perf_counter()
        a @ a
        torch_times.append(time.perf_counter() - t0)
    torch_matmul = 2 * 2048**3 / statistics.median(torch_times[1:]) / 1e9
    matmul = max(xla_matmul, torch_matmul)
    print(
        f"matmul ceiling: {matmul:.1f} GFLOP/s (XLA {xla_matmul:.1f}, PyTorch {torch_matmul:.1f}); "
        f"step: {flops_per_step / 1e9:.2f} GFLOP published, {executed_per_step / 1e9:.2f} executed",
        file=sys.stderr,
    )

    # The published sampler, eager float32 PyTorch (the same code the parity tests use).
    ref_model = dream_torch.DreamReference.from_dir(model_dir)

    def torch_generate():
        return dream_torch.diffusion_generate(
            ref_model,
            torch.tensor([prompt]),
            max_new_tokens=NEW_TOKENS,
            steps=STEPS,
            mask_id=cfg.mask_token_id,
            alg="entropy",
        )[0]

    with torch.no_grad():
        torch_seq = torch_generate()  # warm-up
        torch_runs = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            torch_generate()
            torch_runs.append(time.perf_counter() - t0)
    torch_seconds = statistics.median(torch_runs)
    print(f"pytorch reference: {torch_seconds:.2f}s (median of {args.repeat})", file=sys.stderr)

    params = SamplingParams(max_new_tokens=NEW_TOKENS, steps=STEPS, alg="entropy", temperature=0.0)
    ours = bench.generation(rt, [prompt], params, repeat=args.repeat)
    fast = bench.generation(
        rt, [prompt], SamplingParams(max_new_tokens=NEW_TOKENS, decoder="fast"), repeat=args.repeat
    )

    # Same outputs: identical tokens, or else every step tie-aware (replay each reference step from our
    # previous canvas; positions may differ only where the reference's confidences tie).
    identical = torch_seq[0, PROMPT_TOKENS:].tolist() == ours["generated"][0]
    ties_ok = identical
    if not identical:
        from model_runtime.params import StepEvent

        events = rt.generate([prompt], params, chat=False)
        history = [np.array(e.content) for e in events if isinstance(e, StepEvent)]
        x, mask4, tok_idx = dream_torch.prepare(torch.tensor([prompt]), None, NEW_TOKENS, cfg.mask_token_id)
        prev, ties_ok = x.numpy(), True
        try:
            for i, canvas in enumerate(history):
                ref, conf, _ = dream_torch.step(
                    ref_model, torch.tensor(prev), mask4, tok_idx, i, steps=STEPS, mask_id=cfg.mask_token_id
                )
                assert_step_matches(prev, canvas, ref.numpy(), conf.numpy(), cfg.mask_token_id, f"step {i}")
                prev = canvas
        except AssertionError as exc:
            ties_ok = False
            print(f"parity: {exc}", file=sys.stderr)
    agreement = float(np.mean(np.array(fast["generated"][0]) == np.array(ours["generated"][0])))

    torch_tps = NEW_TOKENS / torch_seconds
    step_seconds = ours["median_seconds"] / STEPS
    result = {
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
        "matmul_gflops_pytorch": torch_matmul,
        "pytorch_reference": {
            "seconds": torch_seconds,
            "runs": torch_runs,
            "tokens_per_second": torch_tps,
            "ms_per_step": torch_seconds / STEPS * 1e3,
            "gflops_per_second": flops_per_step / (torch_seconds / STEPS) / 1e9,
        },
        "reference_decoder": {
            "seconds": ours["median_seconds"],
            "runs": ours["seconds"],
            "tokens_per_second": ours["tokens_per_second"],
            "ms_per_step": step_seconds * 1e3,
            "gflops_per_second": flops_per_step / step_seconds / 1e9,
            "executed_gflops_per_step": executed_per_step / 1e9,
            "executed_gflops_per_second": executed_per_step / step_seconds / 1e9,
        },
        "fast_decoder": {
            "seconds": fast["median_seconds"],
            "tokens_per_second": fast["tokens_per_second"],
            "forwards": fast["forwards"],
        },
        "reference_vs_pytorch": ours["tokens_per_second"] / torch_tps,
        "matmul_efficiency": flops_per_step / step_seconds / 1e9 / matmul,
        "executed_matmul_efficiency": executed_per_step / step_seconds / 1e9 / matmul,
        "pytorch_matmul_efficiency": flops_per_step / (torch_seconds / STEPS) / 1e9 / matmul,
        "fast_vs_reference": fast["tokens_per_second"] / ours["tokens_per_second"],
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
        f"fast {result['fast_vs_reference']:.2f}x reference; median of {args.repeat} runs",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
