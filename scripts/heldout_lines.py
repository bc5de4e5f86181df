"""Build the held-out single-line infill tasks that decoder settings are chosen on.

    python scripts/heldout_lines.py CORPUS OUT.jsonl [--tasks 2000] [--seed 0]

CORPUS is what ``scripts/bundled_corpus.py`` builds. Its files are filtered and split exactly as
``scripts/train_bundled.sh`` does for pre-training (test suites, codec tables and files over 300 kB left
out; ``--heldout-permille 25`` by a hash of the path), and the tasks come from the held-out files only,
which the bundled model never saw (``assistant/evals/lines.py`` says how a task is made). Held out by
path is not held out by content (vendored copies of one library in another, generated tables): a task
whose hidden line with two lines on each side stands verbatim in a training file is dropped, and the
script says how many (``lines.unseen``). Score them with ``diffu eval lines --tasks OUT.jsonl``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from assistant.evals import lines
from model_runtime.bundled import bundled_model_dir
from model_runtime.tokenizer import load_tokenizer
from model_runtime.train import corpus as corpus_lib

CHOOSING = 200  # the last drawn tasks: the decoder settings' choosing set


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("corpus", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--heldout-permille", type=int, default=25)
    parser.add_argument(
        "--spans", action="store_true", help="multi-line spans (2 to 4 lines in the cursor's scope) instead"
    )
    parser.add_argument(
        "--choosing",
        type=Path,
        help="also write here the tasks kept of the last 200 drawn: the set decoder settings are chosen on, "
        "which the tables leave out (decoder_table.py --exclude)",
    )
    args = parser.parse_args()

    tok = load_tokenizer(bundled_model_dir(), mask_id=0, pad_id=0, eos_id=0)
    held: list[tuple[str, str]] = []
    trained: list[tuple[str, str]] = []
    for path, text in corpus_lib.bundled_sources(args.corpus):
        (held if corpus_lib.is_heldout(path, args.heldout_permille) else trained).append((path, text))
    build = lines.build_spans if args.spans else lines.build
    drawn = build(held, args.tasks, lambda s: len(tok.encode(s)), seed=args.seed)
    tasks, dropped = lines.unseen(drawn, lines.Seen.of(text for _, text in trained))
    lines.write(tasks, args.out)
    if args.choosing:
        last = {t.task_id for t in drawn[-CHOOSING:]}
        lines.write([t for t in tasks if t.task_id in last], args.choosing)
    print(
        f"{len(tasks)} tasks from {len(held)} held-out files -> {args.out}; {len(dropped)} of the "
        f"{len(drawn)} drawn left out, their {2 * lines.WINDOW_LINES + 1}-line context verbatim in a "
        "training file",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
