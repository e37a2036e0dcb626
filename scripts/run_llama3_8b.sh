#!/usr/bin/env bash
# Llama 3.1 8B (Meta's shape: 32 layers, 32 query and 8 K/V heads, width 4096, SwiGLU 14336,
# untied lm head, 3.1's RoPE scaling) from scratch on FineWeb's 100B-token sample in Llama 3
# tokens, 2 nodes of 8 GPUs: data parallelism over the 16 GPUs with ZeRO-1 (the model, its
# gradients and optimizer state fit one 80 GB GPU at T = 8192, B = 1: see PLAN=1); 4M-token steps
# (Llama 3's batch for its 8B; 16 ranks x 8192 tokens x 32 micro-steps), 20,000 steps (about 84B
# tokens), lr 3e-4 (Meta's for 8B) with 2,000 warmup steps and cosine decay to 0.1 x lr, weight
# decay 0.1. Data: ENCODING=llama3 data/fineweb.sh fineweb100B (data/fineweb100B_llama3).
#   scripts/run_llama3_8b.sh [train_gpt flags that replace or add to these]
# Environment (TRAIN_GPT, DATA_DIR, EVAL_DATA, OUT_DIR, NPROC = 16, LAUNCHER, PLAN=1):
# scripts/lib/recipe.sh; under SLURM: scripts/slurm/llama3_8b.sbatch.
set -euo pipefail
recipe_name=llama3_8b
recipe_data=data/fineweb100B_llama3
recipe_eval_data=data/hellaswag/hellaswag_val_llama3.bin
recipe_micro_batch=1
recipe_eval_every=1000
recipe_nproc=16
recipe_flags=(
  --model llama3.1-8b --seq-len 8192 --total-batch-tokens 4194304 --max-steps 20000
  --zero 1 --recompute 1
  --lr 3e-4 --warmup-steps 2000 --lr-schedule cosine --final-lr-frac 0.1
  --weight-decay 0.1 --grad-clip 1.0
  --val-every 250 --val-steps 20
  --checkpoint-every 250 --keep-checkpoints 3 --keep-every 5000
)
# shellcheck source=scripts/lib/recipe.sh
source "$(dirname "$0")/lib/recipe.sh"
run_recipe "$@"
