"""Build instruction-tuning data from the bundled model's corpus, without a download.

    python scripts/sft_data.py CORPUS OUT [--max-tokens 256] [--heldout-requests 200]

CORPUS is what ``scripts/bundled_corpus.py`` builds; the files are filtered exactly as
``scripts/train_bundled.sh`` filters them for pre-training (test suites, codec tables and files over
300 kB left out) and split by the same hash of the path (``--heldout-permille 25``), so the files the
bundled model never saw stay unseen here too. Writes:

    OUT/train.jsonl     {"messages": [...], "source": {...}} per line, for ``diffu train --sft``
    OUT/heldout.jsonl   the held-out requests (same format; the assistant turn is the reference answer)
    OUT/turns.jsonl     stage 3's data (topic changes): the training conversations that fit
                        --final-tokens, as they are, and --topic-changes conversations of 2-3 turns
    OUT/heldout_two_turn.jsonl  each held-out request after another one and its reference answer
    OUT/manifest.json   counts per framing, what was dropped and why, every HumanEval exclusion

The conversations and the HumanEval check are described in ``assistant/evals/instructions.py``, the
topic changes (made from training conversations only) and the two-turn held-out conversations (made from
the held-out requests only) in ``assistant/evals/topic_change.py``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from assistant.evals import instructions as ins
from assistant.evals import topic_change as tc
from assistant.evals.humaneval import load_problems
from model_runtime.bundled import bundled_model_dir
from model_runtime.tokenizer import load_tokenizer
from model_runtime.train import corpus as corpus_lib


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("corpus", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--heldout-permille", type=int, default=25)
    parser.add_argument("--max-tokens", type=int, default=256, help="prompt + answer + end of turn (256)")
    parser.add_argument("--max-prompt-tokens", type=int, default=96, help="longest prompt (96)")
    parser.add_argument("--heldout-requests", type=int, default=200)
    parser.add_argument("--tokenizer", type=Path, default=None, help="model directory (the bundled model)")
    parser.add_argument("--topic-changes", type=int, default=8000, help="multi-turn conversations (8000)")
    parser.add_argument(
        "--final-tokens", type=int, default=192, help="turns.jsonl: a last request's own limit (192)"
    )
    parser.add_argument(
        "--turn-tokens", type=int, default=256, help="turns.jsonl: a whole conversation's (256)"
    )
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    tok_dir = args.tokenizer or bundled_model_dir()
    tok = load_tokenizer(tok_dir, mask_id=0, pad_id=0, eos_id=0)

    def lengths(conv: dict) -> tuple[int, int]:
        prompt = len(tok.encode_chat(conv["messages"][:-1]))
        return prompt, len(tok.encode_text(conv["messages"][-1]["content"])) + 1  # + <|im_end|>

    def fits(conv: dict) -> bool:
        prompt, answer = lengths(conv)
        return prompt <= args.max_prompt_tokens and prompt + answer <= args.max_tokens

    data = ins.build(
        corpus_lib.bundled_sources(args.corpus),
        is_heldout=lambda path: corpus_lib.is_heldout(path, args.heldout_permille),
        guard=ins.HumanEvalGuard(load_problems()),
        fits=fits,
        heldout_requests=args.heldout_requests,
    )
    # Stage 3 (topic changes): stage 2's single-turn conversations (those that fit its --seq-len) and
    # conversations whose earlier turns are other training requests with their answers.
    single = [c for c in data.train if sum(lengths(c)) <= args.final_tokens]
    finals = {id(c) for c in single}
    changes = tc.topic_changes(
        data.train,
        args.topic_changes,
        last=lambda c: id(c) in finals,
        fits=lambda c: sum(lengths(c)) <= args.turn_tokens,
    )
    two_turn = tc.two_turn(data.heldout)
    args.out.mkdir(parents=True, exist_ok=True)
    files = (
        ("train.jsonl", data.train),
        ("heldout.jsonl", data.heldout),
        ("turns.jsonl", single + changes),
        ("heldout_two_turn.jsonl", two_turn),
    )
    for name, rows in files:
        with (args.out / name).open("w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    manifest = data.manifest() | {
        "corpus": str(args.corpus),
        "heldout_permille": args.heldout_permille,
        "max_tokens": args.max_tokens,
        "max_prompt_tokens": args.max_prompt_tokens,
        "tokenizer": str(tok_dir),
        "turns": {
            "single_turn": len(single),
            "topic_changes": len(changes),
            "three_turns": sum(len(c["messages"]) == 6 for c in changes),
            "final_tokens": args.final_tokens,
            "turn_tokens": args.turn_tokens,
        },
        "heldout_two_turn": len(two_turn),
    }
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    print(
        f"{len(data.train)} training conversations, {len(data.heldout)} held-out requests, "
        f"{len(data.excluded)} definitions excluded as HumanEval matches; dropped {dict(data.counts)}; "
        f"turns.jsonl: {len(single)} single-turn and {len(changes)} multi-turn conversations; "
        f"{len(two_turn)} held-out two-turn conversations",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
