#!/usr/bin/env bash
# make run's script on a machine without a GPU: says so, builds the CPU binary, trains the small
# default model on the built-in corpus (two steps here) and saves it in a directory of its own.
# usage: make_run.sh cpu|gpu   (gpu: skipped; the GPU branch needs a GPU)
set -u
cd "$(dirname "$0")/../.." || exit 1
[ "${1:-cpu}" = cpu ] || exit 77
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "skipped: this machine has a GPU, so make run would take the GPU branch"; exit 77
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! ARGS="--max-steps 2 --val-every 0" bash scripts/run.sh >"$log" 2>&1; then
  echo "FAIL: scripts/run.sh failed:"; tail -n 20 "$log"; exit 1
fi
model=$(sed -n 's/^saved \(runs\/cpu-[0-9-]*\/model\.bin\)$/\1/p' "$log")
status=0
grep -q "^make run: no GPU here" "$log" || { echo "FAIL: no line saying the CPU build is used"; status=1; }
grep -q "^step 2/2 | loss" "$log" || { echo "FAIL: no step lines"; status=1; }
if [ -z "$model" ] || [ ! -s "$model" ]; then
  echo "FAIL: no model saved in a runs/cpu-* directory"; status=1
else
  rm -rf "$(dirname "$model")"
fi
[ $status -eq 0 ] && echo "ok: make run trained the default CPU model and saved $model"
exit $status
