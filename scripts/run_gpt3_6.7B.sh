#!/usr/bin/env bash
# GPT-3 6.7B (Brown et al. 2020, table 2.1: 32 layers, 32 heads, width 4096, context 2048) on
# FineWeb's 100B-token sample, 2 nodes of 8 GPUs: tensor parallelism over each node's 8 GPUs
# (--tp 8, sequence parallel), data parallelism with ZeRO-1 across the 2 nodes; 2M-token steps
# (GPT-3's batch for 6.7B), 47,684 steps = 100B tokens (one pass over the sample), lr 1.2e-4
# (GPT-3's) with 179 warmup steps (375M tokens) and cosine decay to 0.1 x lr, weight decay 0.1.
#   scripts/run_gpt3_6.7B.sh [train_gpt flags that replace or add to these]
# Environment (TRAIN_GPT, DATA_DIR, EVAL_DATA, OUT_DIR, NPROC = 16, LAUNCHER, PLAN=1):
# scripts/lib/recipe.sh; under SLURM: scripts/slurm/gpt3_6.7B.sbatch.
set -euo pipefail
recipe_name=gpt3_6.7B
recipe_data=data/fineweb100B
recipe_micro_batch=32
recipe_eval_every=1000
recipe_nproc=16
recipe_flags=(
  --model gpt3-6.7b --seq-len 2048 --total-batch-tokens 2097152 --max-steps 47684
  --tp 8 --sequence-parallel 1 --zero 1 --recompute 1
  --lr 1.2e-4 --warmup-steps 179 --lr-schedule cosine --final-lr-frac 0.1
  --weight-decay 0.1 --grad-clip 1.0
  --val-every 250 --val-steps 20
  --checkpoint-every 250 --keep-checkpoints 3 --keep-every 5000
)
# shellcheck source=scripts/lib/recipe.sh
source "$(dirname "$0")/lib/recipe.sh"
run_recipe "$@"
