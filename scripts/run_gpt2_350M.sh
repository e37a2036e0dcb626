#!/usr/bin/env bash
# GPT-2 350M (d24) on FineWeb's 100B-token sample, one node of 8 GPUs: 0.5M-token steps, 60,000
# steps = 31.5B tokens, lr 3e-4 (GPT-3's for its 350M model) with 700 warmup steps and cosine decay
# to 0.1 x lr, weight decay 0.1, ZeRO-1.
#   scripts/run_gpt2_350M.sh [train_gpt flags that replace or add to these]
# Environment (TRAIN_GPT, DATA_DIR, EVAL_DATA, OUT_DIR, NPROC, LAUNCHER, PLAN=1): scripts/lib/recipe.sh.
set -euo pipefail
recipe_name=gpt2_350M
recipe_data=data/fineweb100B
recipe_micro_batch=64
recipe_eval_every=1000
recipe_flags=(
  --model d24 --seq-len 1024 --total-batch-tokens 524288 --max-steps 60000
  --lr 3e-4 --warmup-steps 700 --lr-schedule cosine --final-lr-frac 0.1
  --weight-decay 0.1 --grad-clip 1.0 --zero 1
  --val-every 250 --val-steps 20
  --checkpoint-every 1000 --keep-checkpoints 3 --keep-every 10000
)
# shellcheck source=scripts/lib/recipe.sh
source "$(dirname "$0")/lib/recipe.sh"
run_recipe "$@"
