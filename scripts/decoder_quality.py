"""The reference and the fast decoder on a trained model: do they write equally good code?

    python scripts/decoder_quality.py RUN_DIR [--model DIR] [--cases N] [--prompts N] [--json OUT] [--record]

RUN_DIR is a `diffu train` run (scripts/train_bundled.sh makes the bundled model's); its held-out files,
which the model never saw, supply both tests. The model defaults to RUN_DIR/model.

- Single-line infill: the held-out lines of the training evaluation (model_runtime/train/evaluate.py),
  each filled by both decoders with greedy settings: the reference decoder with its default `entropy`
  order, one token per step; the fast decoder with its defaults (block 32, threshold 0.9). Exact match
  as in the evaluation.
- Free generation: the first `def ...:` line of held-out files as a raw prompt, 128 new tokens, greedy:
  the share of generated lines that are code parsing with the prompt as one program
  (model_runtime.train.evaluate.python_share, the bundled-model test's rule), and the share of distinct
  lines (repetition shows up here).

``--record`` writes the verdict into the model's generation_config.json as ``diffu_decoder``: ``fast`` when
the fast decoder is at least as good on infill and better on free generation, else ``reference``. diffu
uses it as the default decoder of that model (``model_runtime.generation_config.recommended_decoder``).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from model_runtime.interface import BatchDone, BatchStep  # noqa: E402  (plain Python: no JAX yet)


def def_prompts(texts: list[tuple[str, str]], n: int) -> list[str]:
    out = []
    for _, text in texts:
        m = re.search(r"^def [A-Za-z_]\w*\(.*\):$", text, flags=re.M)
        if m:
            out.append(m.group(0))
        if len(out) == n:
            break
    return out


def finished(events: Iterable[BatchStep | BatchDone]) -> BatchDone:
    """The last event of a run, its BatchDone (a run that does not stream sends only that one)."""
    *_, last = events
    assert isinstance(last, BatchDone), last
    return last


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("run", type=Path)
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--cases", type=int, default=256)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--record", action="store_true", help="record the better decoder with the model")
    args = parser.parse_args()

    import model_runtime
    from model_runtime.interface import CanvasRow
    from model_runtime.params import SamplingParams
    from model_runtime.train import corpus as corpus_lib
    from model_runtime.train.evaluate import infill_cases, python_share

    rt = model_runtime.load(args.model or args.run / "model", dtype="float32")
    tok = rt.tokenizer
    texts = corpus_lib.heldout_texts(args.run / "corpus")
    cases = infill_cases(tok, texts, args.cases)
    decoders = {
        "reference": lambda n: SamplingParams(max_new_tokens=n, steps=n),
        "fast": lambda n: SamplingParams(max_new_tokens=n, steps=n, decoder="fast"),
    }
    result: dict[str, Any] = {"model": str(rt.model_dir), "infill": {}, "generation": {}}
    for name, make in decoders.items():
        hits, seconds = 0, 0.0
        for c in cases:
            row = CanvasRow(c.prefix + (tok.mask_id,) * len(c.middle) + c.suffix,
                            (len(c.prefix), len(c.prefix) + len(c.middle)), chat=False)  # fmt: skip
            t0 = time.perf_counter()
            done = finished(rt.run([row], make(len(c.middle)), stream=False))
            seconds += time.perf_counter() - t0
            hits += tok.decode(list(done.generated[0])).strip() == c.line.strip()
        result["infill"][name] = {"exact_match": hits / len(cases), "cases": len(cases), "seconds": seconds}
        print(f"infill {name}: {hits}/{len(cases)} exact", file=sys.stderr)

    prompts = def_prompts(texts, args.prompts)
    for name, make in decoders.items():
        parsed: list[float] = []
        distinct: list[float] = []
        samples: list[dict[str, str]] = []
        for p in prompts:
            done = finished(rt.generate([tok.encode(p)], make(128), chat=False, stream=False))
            lines = [ln for ln in done.texts[0].splitlines() if ln.strip()]
            parsed.append(python_share(p, done.texts[0]))
            distinct.append(len(set(ln.strip() for ln in lines)) / max(len(lines), 1))
            if len(samples) < 3:
                samples.append({"prompt": p, "text": done.texts[0]})
        result["generation"][name] = {
            "prompts": len(prompts),
            "python_lines": statistics.mean(parsed),
            "distinct_lines": statistics.mean(distinct),
            "samples": samples,
        }
        print(f"generation {name}: {statistics.mean(parsed):.1%} Python lines, "
              f"{statistics.mean(distinct):.1%} distinct", file=sys.stderr)  # fmt: skip
    inf, gen = result["infill"], result["generation"]
    better = (
        inf["fast"]["exact_match"] >= inf["reference"]["exact_match"]
        and gen["fast"]["python_lines"] > gen["reference"]["python_lines"]
    )
    result["recommended_decoder"] = "fast" if better else "reference"
    if args.record:
        path = Path(rt.model_dir) / "generation_config.json"
        config = json.loads(path.read_text()) if path.is_file() else {}
        config["diffu_decoder"] = result["recommended_decoder"]
        path.write_text(json.dumps(config, indent=2) + "\n")
        print(f"recorded diffu_decoder={config['diffu_decoder']} in {path}", file=sys.stderr)
    out = json.dumps(result, indent=2)
    if args.json:
        args.json.write_text(out + "\n")
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
