"""Run in a subprocess with 8 virtual CPU devices (XLA_FLAGS must be set before jax is imported).

Prints one JSON object comparing tp/dp meshes against the single-device runtime on one checkpoint.
"""

from __future__ import annotations

import json
import os
import sys

if "--xla_force_host_platform_device_count=8" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"

import jax  # noqa: E402
import numpy as np  # noqa: E402

import model_runtime  # noqa: E402
from model_runtime import SamplingParams  # noqa: E402
from model_runtime.errors import InputError  # noqa: E402
from model_runtime.model import named_arrays  # noqa: E402
from tests.model_runtime.logits import logits  # noqa: E402


def main(model_dir: str) -> None:
    kw = dict(length_buckets=(64,), batch_buckets=(1, 2, 4))
    base = model_runtime.load(model_dir, **kw)
    ids = np.random.default_rng(0).integers(0, base.config.vocab_size - 64, (4, 40))
    ref = logits(base, ids)
    tok = base.tokenizer
    prompts = [tok.encode("def f(x):"), tok.encode("import os"), tok.encode("class A:"), tok.encode("x = 1")]
    greedy = SamplingParams(max_new_tokens=16, steps=16)
    fast = SamplingParams(max_new_tokens=16, decoder="fast", block_length=8)
    sliding = SamplingParams(max_new_tokens=16, decoder="sliding", window=8)
    want = list(base.generate(prompts, greedy, chat=False))[-1].sequences
    want_fast = list(base.generate(prompts, fast, chat=False))[-1].sequences
    want_sliding = list(base.generate(prompts, sliding, chat=False))[-1].sequences
    out = {"devices": jax.device_count(), "meshes": []}
    # Generations on tp=4 and dp=2 x tp=4; tp=8 is checked for its logits and placement only (its
    # programs are the tp=4 ones on more devices: compiling them again would only cost the suite time).
    for tp, dp, generate in ((4, 1, True), (8, 1, False), (4, 2, True)):
        rt = model_runtime.load(model_dir, tp=tp, dp=dp, **kw)
        got = logits(rt, ids)
        mesh = {
            "tp": tp,
            "dp": dp,
            "device": rt.info.device,
            "batch_buckets": list(rt.batch_buckets),
            "max_rel_err": float(np.max(np.abs(got - ref)) / np.max(np.abs(ref))),
            "fractions": fractions_of(rt),
        }
        if generate:
            mesh["greedy_equal"] = list(rt.generate(prompts, greedy, chat=False))[-1].sequences == want
            fused = list(rt.generate(prompts, greedy, chat=False, stream=False))[-1].sequences
            mesh["fused_equal"] = fused == want
            mesh["fast_equal"] = list(rt.generate(prompts, fast, chat=False))[-1].sequences == want_fast
            slid = list(rt.generate(prompts, sliding, chat=False, stream=False))[-1].sequences
            mesh["sliding_equal"] = slid == want_sliding
        out["meshes"].append(mesh)
    # int8: the integer weights and their per-channel scales placed on a dp=2 x tp=4 mesh against the
    # same quantized model on one device. int4 is refused on CPU meshes (see loader.load).
    qbase = model_runtime.load(model_dir, quantize="int8", **kw)
    qwant = list(qbase.generate(prompts, greedy, chat=False))[-1].sequences
    rt = model_runtime.load(model_dir, tp=4, dp=2, quantize="int8", **kw)
    qref, got = logits(qbase, ids), logits(rt, ids)
    out["quantized"] = {
        "max_rel_err": float(np.max(np.abs(got - qref)) / np.max(np.abs(qref))),
        "greedy_equal": list(rt.generate(prompts, greedy, chat=False))[-1].sequences == qwant,
        "fractions": fractions_of(rt),
        "dtypes": {name: str(arr.dtype) for name, arr in flat(rt)},
    }
    try:
        model_runtime.load(model_dir, tp=4, quantize="int4", **kw)
        out["quantized"]["int4_cpu_mesh_error"] = None
    except InputError as exc:
        out["quantized"]["int4_cpu_mesh_error"] = str(exc)
    print(json.dumps(out))


def flat(rt):
    """(name, array) per state leaf (``model.named_arrays``)."""
    return named_arrays(rt.state).items()


def fractions_of(rt) -> dict[str, list[float]]:
    """Per parameter, the fraction of it each device holds (every device's shard is the same size)."""
    return {
        name: [size / arr.size for size in {s.data.size for s in arr.addressable_shards}]
        for name, arr in flat(rt)
    }


if __name__ == "__main__":
    main(sys.argv[1])
