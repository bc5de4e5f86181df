"""Side by side on one checkpoint: the published sampler in eager float32 PyTorch, our reference decoder,
our fast decoder (issue 8's comparison).

    .venv/bin/python scripts/compare_cpu.py [--model DIR] [--json OUT.json]

Without --model it writes a 4-layer x 256-hidden random checkpoint in the published layout (BPE vocabulary
of 8192 trained on the interpreter's standard library). Settings: 256 new tokens, 256 steps, greedy,
entropy, the inherited top_k=50, a 64-token prompt, so the canvas is 320 tokens. The efficiency figure is
the useful FLOPs of a step (one full-canvas forward) over its time, against a 2048 x 2048 float32 matmul
timed in the same run.
"""

from __future__ import annotations

import argparse
import json
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

    matmul = bench.matmul_gflops()
    print(f"matmul ceiling: {matmul:.1f} GFLOP/s; step: {flops_per_step / 1e9:.2f} GFLOP", file=sys.stderr)

    # The published sampler, eager float32 PyTorch (the same code the parity tests use).
    ref_model = dream_torch.DreamReference.from_dir(model_dir)
    with torch.no_grad():
        t0 = time.perf_counter()
        torch_seq, _ = dream_torch.diffusion_generate(
            ref_model,
            torch.tensor([prompt]),
            max_new_tokens=NEW_TOKENS,
            steps=STEPS,
            mask_id=cfg.mask_token_id,
            alg="entropy",
        )
        torch_seconds = time.perf_counter() - t0
    print(f"pytorch reference: {torch_seconds:.2f}s", file=sys.stderr)

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
        "pytorch_reference": {"seconds": torch_seconds, "tokens_per_second": torch_tps},
        "reference_decoder": {
            "seconds": ours["median_seconds"],
            "tokens_per_second": ours["tokens_per_second"],
            "ms_per_step": step_seconds * 1e3,
            "gflops_per_second": flops_per_step / step_seconds / 1e9,
        },
        "fast_decoder": {
            "seconds": fast["median_seconds"],
            "tokens_per_second": fast["tokens_per_second"],
            "forwards": fast["forwards"],
        },
        "reference_vs_pytorch": ours["tokens_per_second"] / torch_tps,
        "matmul_efficiency": flops_per_step / step_seconds / 1e9 / matmul,
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
        f"{100 * result['matmul_efficiency']:.0f}% of matmul; "
        f"fast {result['fast_vs_reference']:.2f}x reference; median of {args.repeat} runs",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
