#!/usr/bin/env bash
# Instruction-tune the pre-trained demo model into the bundled chat model (model_runtime/bundled/model/).
#
# Stage 2 of the bundled model, after scripts/train_bundled.sh (pre-training, whose RUN_DIR/model is BASE):
# 1. scripts/sft_data.py turns the same corpus into conversations: documented functions, methods and
#    classes as requests, their code as fenced answers; the pre-training's held-out files give only the
#    200 held-out requests; HumanEval matches are left out (OUT/manifest.json lists them).
# 2. diffu train --sft: DiffuCoder's instruction-tuning recipe (model_runtime/train/sft.py) from BASE,
#    STEPS steps x 16 conversations x 256 tokens, AdamW (peak 1e-3, 100 warmup steps, cosine to 1e-4),
#    EMA 0.998; the corpus is passed too, so metrics.json also holds the held-out code evaluation.
# 3. scripts/sft_heldout.py --record measures the held-out requests and writes the chat defaults it
#    measured best into generation_config.json.
#
# Usage: scripts/train_bundled_sft.sh BASE [RUN_DIR] [extra diffu train flags]   (re-run to resume)
#   CORPUS=DIR   the corpus of scripts/bundled_corpus.py (default: RUN_DIR.corpus, built if missing)
#   STEPS=N      training steps (default 2000: about 2.5 hours on 2 shared CPU cores)
#   INSTALL=0    leave the package alone (default: copy RUN_DIR/model into model_runtime/bundled/model)
#   RECORD=0     skip the held-out measurement and the chat defaults
set -euo pipefail
cd "$(dirname "$0")/.."
BASE="${1:?usage: scripts/train_bundled_sft.sh BASE [RUN_DIR] [flags]}"
RUN_DIR="${2:-/tmp/diffu-bundled-sft}"
PY="${PYTHON:-.venv/bin/python}"
CORPUS="${CORPUS:-$RUN_DIR.corpus}"
STEPS="${STEPS:-2000}"
DATA="$RUN_DIR.data"

if [ ! -f "$CORPUS/manifest.json" ]; then
  "$PY" scripts/bundled_corpus.py "$CORPUS"
fi
if [ ! -f "$DATA/manifest.json" ]; then
  "$PY" scripts/sft_data.py "$CORPUS" "$DATA" --tokenizer "$BASE"
fi

"$PY" -m assistant.cli train "$CORPUS" --sft "$DATA/train.jsonl" --init-from "$BASE" --out "$RUN_DIR" \
  --exclude test --exclude tests --exclude idle_test --exclude encodings --heldout-permille 25 \
  --steps "$STEPS" --batch-size 16 --seq-len 256 --lr 1e-3 --warmup 100 --min-lr-ratio 0.1 \
  --weight-decay 0.1 --ema-decay 0.998 --seed 0 \
  --checkpoint-every 100 --eval-every 250 --eval-infill-cases 256 --export-dtype bfloat16 "${@:3}"

if [ -f "$RUN_DIR/model/config.json" ] && [ "${RECORD:-1}" = 1 ]; then
  "$PY" scripts/sft_heldout.py "$RUN_DIR/model" "$DATA/heldout.jsonl" --record \
    --json "$RUN_DIR/heldout_requests.json"
fi

if [ "${INSTALL:-1}" = 1 ] && [ -f "$RUN_DIR/model/config.json" ]; then
  DEST=model_runtime/bundled/model
  rm -rf "$DEST" && mkdir -p "$DEST"
  cp "$RUN_DIR"/model/*.json "$RUN_DIR"/model/merges.txt "$RUN_DIR"/model/*.safetensors "$DEST"/
  echo "bundled model updated in $DEST"
fi
