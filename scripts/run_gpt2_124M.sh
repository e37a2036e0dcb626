#!/usr/bin/env bash
# GPT-2 124M (d12) on FineWeb's 10B-token sample, one node of 8 GPUs (llm.c's reproduction, which
# reaches about 3.28 validation loss and 29.9% HellaSwag acc_norm): 0.5M-token steps (64 x 1024
# tokens per GPU), 18,865 steps = one pass over the ~9.9B training tokens, lr 6e-4 with 700 warmup
# steps and cosine decay to 0.1 x lr, weight decay 0.1, ZeRO-1.
#   scripts/run_gpt2_124M.sh [train_gpt flags that replace or add to these]
# Environment (TRAIN_GPT, DATA_DIR, EVAL_DATA, OUT_DIR, NPROC, LAUNCHER, PLAN=1): scripts/lib/recipe.sh.
set -euo pipefail
recipe_name=gpt2_124M
recipe_data=data/fineweb10B
recipe_micro_batch=64
recipe_eval_every=250
recipe_flags=(
  --model d12 --seq-len 1024 --total-batch-tokens 524288 --max-steps 18865
  --lr 6e-4 --warmup-steps 700 --lr-schedule cosine --final-lr-frac 0.1
  --weight-decay 0.1 --grad-clip 1.0 --zero 1
  --val-every 250 --val-steps 20
  --checkpoint-every 1000 --keep-checkpoints 3 --keep-every 5000
)
# shellcheck source=scripts/lib/recipe.sh
source "$(dirname "$0")/lib/recipe.sh"
run_recipe "$@"
