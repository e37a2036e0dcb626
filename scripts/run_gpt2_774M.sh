#!/usr/bin/env bash
# GPT-2 774M (d36) on FineWeb's 100B-token sample, one node of 8 GPUs: 1M-token steps, 32,000
# steps = 33.6B tokens, lr 2.5e-4 (GPT-3's for its 760M model) with 700 warmup steps and cosine
# decay to 0.1 x lr, weight decay 0.1, ZeRO-1.
#   scripts/run_gpt2_774M.sh [train_gpt flags that replace or add to these]
# Environment (TRAIN_GPT, DATA_DIR, EVAL_DATA, OUT_DIR, NPROC, LAUNCHER, PLAN=1): scripts/lib/recipe.sh.
set -euo pipefail
recipe_name=gpt2_774M
recipe_data=data/fineweb100B
recipe_micro_batch=32
recipe_eval_every=1000
recipe_flags=(
  --model d36 --seq-len 1024 --total-batch-tokens 1048576 --max-steps 32000
  --lr 2.5e-4 --warmup-steps 700 --lr-schedule cosine --final-lr-frac 0.1
  --weight-decay 0.1 --grad-clip 1.0 --zero 1
  --val-every 250 --val-steps 20
  --checkpoint-every 500 --keep-checkpoints 3 --keep-every 5000
)
# shellcheck source=scripts/lib/recipe.sh
source "$(dirname "$0")/lib/recipe.sh"
run_recipe "$@"
