#!/usr/bin/env bash
# Llama 3.1 70B (Meta's shape: 80 layers, 64 query and 8 K/V heads, width 8192, SwiGLU 28672,
# untied lm head, 3.1's RoPE scaling) from scratch on FineWeb's 100B-token sample in Llama 3
# tokens, 4 nodes of 8 GPUs: tensor parallelism over each node's 8 GPUs (--tp 8, sequence
# parallel) and a 4-stage pipeline across the nodes (--pp 4, interleaved with 2 chunks per rank:
# the layers cut into 8 chunks balanced by cost), so each GPU holds 1/32 of the model and its
# optimizer state; only the pipeline's activations and gradients cross nodes. 4M-token steps
# (32 ranks: one replica, 512 micro-batches of 8192 tokens per step through the pipeline), 20,000
# steps (about 84B tokens), lr 1.5e-4 with 2,000 warmup steps and cosine decay to 0.1 x lr, weight
# decay 0.1; --recompute 3 keeps only each block's input for the micro-batches in flight. Data:
# ENCODING=llama3 data/fineweb.sh fineweb100B (data/fineweb100B_llama3).
#   scripts/run_llama3_70b.sh [train_gpt flags that replace or add to these]
# Environment (TRAIN_GPT, DATA_DIR, EVAL_DATA, OUT_DIR, NPROC = 32, LAUNCHER, PLAN=1):
# scripts/lib/recipe.sh; under SLURM: scripts/slurm/llama3_70b.sbatch.
set -euo pipefail
recipe_name=llama3_70b
recipe_data=data/fineweb100B_llama3
recipe_eval_data=data/hellaswag/hellaswag_val_llama3.bin
recipe_micro_batch=1
recipe_eval_every=1000
recipe_nproc=32
recipe_flags=(
  --model llama3.1-70b --seq-len 8192 --total-batch-tokens 4194304 --max-steps 20000
  --tp 8 --sequence-parallel 1 --pp 4 --pp-schedule interleaved --pp-virtual 2 --zero 1 --recompute 3
  --lr 1.5e-4 --warmup-steps 2000 --lr-schedule cosine --final-lr-frac 0.1
  --weight-decay 0.1 --grad-clip 1.0
  --val-every 250 --val-steps 20
  --checkpoint-every 250 --keep-checkpoints 3 --keep-every 5000
)
# shellcheck source=scripts/lib/recipe.sh
source "$(dirname "$0")/lib/recipe.sh"
run_recipe "$@"
