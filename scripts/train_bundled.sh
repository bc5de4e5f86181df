#!/usr/bin/env bash
# Reproduce the bundled demo model (model_runtime/bundled/) exactly.
#
# Corpus: the .py files of this interpreter's standard library (CPython 3.11.7 for the shipped weights),
# minus test suites and codec tables; 2.5% of files (by a hash of their path) held out for evaluation.
# Model: DiffuCoder architecture (Qwen2.5 blocks, bidirectional attention, untied head), hidden 192,
# 4 layers, 4 query / 2 KV heads, MLP 512, byte-level BPE of 4096 tokens with DiffuCoder's special tokens.
# Training: 700 steps x 16 sequences x 256 tokens, AdamW (peak 3e-3, 40 warmup steps, cosine to 3e-4),
# EMA 0.99; exported in bfloat16. Deterministic: same Python stdlib + same seed -> same weights
# (on the same JAX version and CPU; XLA's float reductions may differ across hardware).
#
# Usage: scripts/train_bundled.sh [RUN_DIR]   (default /tmp/diffu-bundled-run; re-run to resume)
set -euo pipefail
cd "$(dirname "$0")/.."
RUN_DIR="${1:-/tmp/diffu-bundled-run}"
PY="${PYTHON:-.venv/bin/python}"
STDLIB="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')"

"$PY" -m assistant.cli train "$STDLIB" --out "$RUN_DIR" \
  --exclude test --exclude tests --exclude idle_test --exclude encodings \
  --heldout-permille 25 \
  --vocab-size 4096 --hidden-size 192 --intermediate-size 512 --layers 4 --heads 4 --kv-heads 2 \
  --max-position 1024 \
  --steps 700 --batch-size 16 --seq-len 256 --lr 3e-3 --warmup 40 --min-lr-ratio 0.1 \
  --weight-decay 0.1 --ema-decay 0.99 --seed 0 \
  --checkpoint-every 100 --eval-every 300 --eval-infill-cases 256 --export-dtype bfloat16 "${@:2}"

# Copy the exported model into the package (weights, config, tokenizer, metrics.json).
DEST=model_runtime/bundled/model
rm -rf "$DEST" && mkdir -p "$DEST"
cp "$RUN_DIR"/model/*.json "$RUN_DIR"/model/merges.txt "$RUN_DIR"/model/*.safetensors "$DEST"/
echo "bundled model updated in $DEST"
