#!/usr/bin/env bash
# Reproduce the bundled demo model (model_runtime/bundled/model/) exactly.
#
# Corpus: scripts/bundled_corpus.py: the .py files of this interpreter's standard library (CPython 3.11.7
# for the shipped weights) and of 31 pinned, permissively licensed pure-Python wheels from PyPI (Django,
# SymPy, Twisted, SQLAlchemy, JAX, ...; the list and licences are in that script and in the corpus's
# manifest.json), minus test suites, codec tables and files over 300 kB; 2.5% of files (by a hash of their
# path) held out for evaluation.
# Model: DiffuCoder architecture (Qwen2.5 blocks, bidirectional attention, untied head), hidden 256,
# 8 layers, 4 query / 2 KV heads, MLP 1024, byte-level BPE of 4096 tokens with DiffuCoder's special tokens,
# 1024 positions: 9.97M parameters, 19 MiB in bfloat16.
# Training: STEPS steps x 64 sequences x 1024 tokens, AdamW (peak 2e-3, 300 warmup steps, cosine to 2e-4),
# EMA 0.999; exported in bfloat16. Deterministic: same corpus + seed -> same data order and masks (the
# weights also depend on the accelerator's float arithmetic).
#
# Usage: scripts/train_bundled.sh [RUN_DIR] [extra diffu train flags]   (re-run to resume)
#   CORPUS=DIR   use an already built corpus (default: build it in RUN_DIR.corpus, needs PyPI)
#   INSTALL=0    leave the package alone (default: copy RUN_DIR/model into model_runtime/bundled/model)
#   RECORD=0     skip scripts/decoder_quality.py (default: run it and record the better decoder)
#   The first stage can run apart: add --prepare-only to build the tokenizer and token shards on one
#   machine, copy RUN_DIR, and run the same command on the accelerator machine.
set -euo pipefail
cd "$(dirname "$0")/.."
RUN_DIR="${1:-/tmp/diffu-bundled-run}"
PY="${PYTHON:-.venv/bin/python}"
CORPUS="${CORPUS:-$RUN_DIR.corpus}"
STEPS="${STEPS:-6000}"

if [ ! -f "$CORPUS/manifest.json" ]; then
  "$PY" scripts/bundled_corpus.py "$CORPUS"
fi

"$PY" -m assistant.cli train "$CORPUS" --out "$RUN_DIR" \
  --exclude test --exclude tests --exclude idle_test --exclude encodings \
  --heldout-permille 25 \
  --vocab-size 4096 --hidden-size 256 --intermediate-size 1024 --layers 8 --heads 4 --kv-heads 2 \
  --max-position 1024 \
  --steps "$STEPS" --batch-size 64 --seq-len 1024 --lr 2e-3 --warmup 300 --min-lr-ratio 0.1 \
  --weight-decay 0.1 --ema-decay 0.999 --seed 0 \
  --checkpoint-every 500 --eval-infill-cases 256 --export-dtype bfloat16 "${@:2}"

# Which decoder writes better code with this model (held-out infill and free generation); the verdict
# goes into RUN_DIR/model/generation_config.json as diffu_decoder, the model's default decoder.
if [ -f "$RUN_DIR/model/config.json" ] && [ "${RECORD:-1}" = 1 ]; then
  "$PY" scripts/decoder_quality.py "$RUN_DIR" --record --json "$RUN_DIR/decoder_quality.json" > /dev/null
fi

if [ "${INSTALL:-1}" = 1 ] && [ -f "$RUN_DIR/model/config.json" ]; then
  # Copy the exported model into the package (weights, config, tokenizer, metrics.json).
  DEST=model_runtime/bundled/model
  rm -rf "$DEST" && mkdir -p "$DEST"
  cp "$RUN_DIR"/model/*.json "$RUN_DIR"/model/merges.txt "$RUN_DIR"/model/*.safetensors "$DEST"/
  echo "bundled model updated in $DEST"
fi
