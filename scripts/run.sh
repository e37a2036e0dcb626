#!/usr/bin/env bash
# make run: the main job. With a GPU, builds and runs ./train_gpt; without one, builds the
# CPU build and trains a small model on the built-in corpus, saying which it does.
# Extra flags for the trainer: make run ARGS="--max-steps 50"
set -euo pipefail
cd "$(dirname "$0")/.."
read -r -a extra <<< "${ARGS:-}"
# Every run trains from scratch into a directory of its own (a directory with checkpoints is
# only continued with --resume auto).
stamp=$(date +%Y%m%d-%H%M%S)
# shellcheck source=scripts/lib/flags.sh
source scripts/lib/flags.sh
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "make run: GPU found ($(nvidia-smi -L | head -n 1)); building and running ./train_gpt"
  make --no-print-directory -j"$(nproc)" train_gpt
  defaults_not_given extra --out-dir "runs/gpu-$stamp"
  exec ./train_gpt "${defaults[@]}" "${extra[@]}"
fi
echo "make run: no GPU here; building the CPU build and training the small 'nano' model on the built-in corpus"
make --no-print-directory -j"$(nproc)" train_gpt_cpu
defaults_not_given extra --model nano --batch-size 4 --seq-len 64 --max-steps 40 --lr 2e-3 --warmup-steps 4 \
  --val-every 20 --val-steps 4 --out-dir "runs/cpu-$stamp"
exec ./train_gpt_cpu "${defaults[@]}" "${extra[@]}"
