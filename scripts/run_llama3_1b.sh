#!/usr/bin/env bash
# Llama 3.2 1B (Meta's shape: 16 layers, 32 query and 8 K/V heads, width 2048, SwiGLU 8192, tied
# embeddings, 3.2's RoPE scaling) from scratch on FineWeb's 10B-token sample in Llama 3 tokens,
# one node of 8 GPUs: 1M-token steps (32 x 2048 tokens per GPU, 2 micro-steps), 8,000 steps
# (about 8.4B tokens: one pass over the sample, which is fewer tokens in Llama 3's vocabulary than
# in GPT-2's), lr 3e-4 with 700 warmup steps and cosine decay to 0.1 x lr, weight decay 0.1, ZeRO-1.
# Data: ENCODING=llama3 data/fineweb.sh (data/fineweb10B_llama3); HellaSwag in Llama 3 tokens.
#   scripts/run_llama3_1b.sh [train_gpt flags that replace or add to these]
# Environment (TRAIN_GPT, DATA_DIR, EVAL_DATA, OUT_DIR, NPROC, LAUNCHER, PLAN=1): scripts/lib/recipe.sh.
set -euo pipefail
recipe_name=llama3_1b
recipe_data=data/fineweb10B_llama3
recipe_eval_data=data/hellaswag/hellaswag_val_llama3.bin
recipe_micro_batch=32
recipe_eval_every=250
recipe_flags=(
  --model llama3.2-1b --seq-len 2048 --total-batch-tokens 1048576 --max-steps 8000
  --lr 3e-4 --warmup-steps 700 --lr-schedule cosine --final-lr-frac 0.1
  --weight-decay 0.1 --grad-clip 1.0 --zero 1 --recompute 1
  --val-every 250 --val-steps 20
  --checkpoint-every 1000 --keep-checkpoints 3 --keep-every 5000
)
# shellcheck source=scripts/lib/recipe.sh
source "$(dirname "$0")/lib/recipe.sh"
run_recipe "$@"
