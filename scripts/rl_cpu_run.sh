#!/usr/bin/env bash
# The CPU demonstration of coupled-GRPO (docs/training.md, "Reinforcement learning"): the instruction-tuned
# bundled-size model, the generated tasks, held-out pass rates before and after, the control curve and the
# plot. Usage: scripts/rl_cpu_run.sh INIT_MODEL [WORK_DIR]. Re-running resumes the training run; STOP_AT=N
# in the environment time-boxes it (trained up to step N, then exported and evaluated; unset, it goes on;
# the eval files of a finished step are kept: delete WORK/after_*.json to measure again).
#
# Two settings differ from the recipe, both for a 10M-parameter model (docs/training.md says why):
# --rollout-decoder fast, and the rewards of scripts/rl_cpu_rewards.py (an answer ending at its fence counts
# as closed). A CPU-sized batch: 4 prompts x 8 completions of up to 128 tokens per rollout, one epoch of
# the 192 training tasks (96 steps), learning rate 3e-5 (the recipe's 1e-6 is for the 7B model).
set -euo pipefail
cd "$(dirname "$0")/.."
INIT=${1:?usage: scripts/rl_cpu_run.sh INIT_MODEL [WORK_DIR]}
WORK=${2:-runs/rl-cpu}
DIFFU=${DIFFU:-.venv/bin/diffu}
PY=${PY:-.venv/bin/python}
export PYTHONPATH=.
mkdir -p "$WORK"
$PY -m model_runtime.train.rl.synthetic --out "$WORK/tasks" --seed 0
eval_tasks() {  # MODEL NAME: greedy with the model's defaults, and sampled as in training (4 per task)
  [ -f "$WORK/$2_greedy.json" ] || $DIFFU eval tasks --tasks "$WORK/tasks/heldout.jsonl" --model "$1" --json \
    > "$WORK/$2_greedy.json"
  [ -f "$WORK/$2_t1.json" ] || $DIFFU eval tasks --tasks "$WORK/tasks/heldout.jsonl" --model "$1" --n 4 --k 1 \
    --temperature 1.0 --top-p 0.95 --decoder fast --max-new-tokens 128 --json > "$WORK/$2_t1.json"
}
eval_tasks "$INIT" before
nice -n 19 $DIFFU train --rl coupled-grpo --tasks "$WORK/tasks/train.jsonl" --init-from "$INIT" \
  --out "$WORK/run" --steps 96 --prompts-per-step 4 --num-generations 8 --chunk 4 \
  --max-completion-length 128 --generation-batch-size 16 --rollout-decoder fast --lr 3e-5 \
  --checkpoint-every 10 --reward scripts.rl_cpu_rewards:code=2.0 \
  --reward scripts.rl_cpu_rewards:code_format=0.5 ${STOP_AT:+--stop-at "$STOP_AT"}
[ -f "$WORK/baseline.jsonl" ] || nice -n 19 $PY scripts/rl_baseline.py "$WORK/run" "$WORK/baseline.jsonl"
eval_tasks "$WORK/run/model" after
$PY scripts/rl_plot.py "$WORK/run" "$WORK/reward.png" --baseline "$WORK/baseline.jsonl" \
  --title "coupled-GRPO on the bundled-size SFT model, CPU"
