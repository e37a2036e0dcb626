#!/usr/bin/env bash
# simt checks the trainer's launches against the GPU build's ptxas figures (docs/SIMT.md,
# "Launches"), so a name that ptxas and the CPU build spell differently cannot switch the rule
# off unnoticed: the table (make ptx-report's build/ptx-report.txt.tsv, made here unless make test
# has made it) loads with rows for sm_80 and sm_90a; every kernel of a bf16 and an fp32 training
# run with validation has its row; and the same run with every row at 255 registers per thread
# fails with the GPU's "too many resources requested for launch". The runs: GPT-2's tiny reference,
# and the tiny Mixtral (experts: the routing and dispatch kernels).
# usage: kernel_resources.sh cpu|gpu   (gpu: the GPU checks its launches itself)
set -u
# shellcheck source=test/checks/lib/trainer.sh
source "$(dirname "$0")/lib/trainer.sh" "$@"
[ "$mode" = cpu ] || exit 77
mref=build/reference/mixtral
require_files "$bin" "$ref/model.bin" "$ref/train.bin" "$mref/model.bin"

table=${SIMT_KERNEL_RESOURCES:-}
if [ -z "$table" ]; then
  nvcc=${NVCC:-${CUDA_HOME:-/usr/local/cuda}/bin/nvcc}
  command -v "$nvcc" >/dev/null || { echo "skipped: no nvcc at $nvcc, so no ptxas table: the rule is not applied"; exit 77; }
  table=$PWD/build/ptx-report.txt.tsv
  rm -f "$table"
  make --no-print-directory -j2 ptx-report >"$tmp/ptx-report.log" 2>&1
  [ -f "$table" ] || { echo "FAIL: make ptx-report wrote no $table:"; tail -n 20 "$tmp/ptx-report.log"; exit 1; }
fi
for arch in sm_80 sm_90a; do
  rows=$(awk -F'\t' -v arch="$arch" '$2 == arch' "$table" | wc -l)
  [ "$rows" -gt 0 ] || fail "$table has no $arch rows"
done

# usage: train TABLE LOG FLAGS...   (SIMT_VERBOSE names every launched kernel without a row)
train() {
  local with=$1 log=$2
  shift 2
  SIMT_KERNEL_RESOURCES=$with SIMT_VERBOSE=1 "$bin" --batch-size 2 --seq-len 32 --max-steps 2 --val-every 1 \
    --val-steps 1 --out-dir "$tmp/run" --overwrite "$@" >"$log" 2>&1
}

for run in "bf16 $ref" "fp32 $ref" "bf16 $mref" "fp32 $mref"; do
  read -r dtype model <<<"$run"
  log=$tmp/$dtype.log
  if ! train "$table" "$log" --dtype "$dtype" --init-from "$model/model.bin" --train-data "$model/train.bin" \
      --val-data "$model/train.bin"; then
    fail "$dtype $model run failed with the table: $(tail -n 3 "$log")"
    continue
  fi
  grep -qF "simt: kernel resources from $table (" "$log" || fail "$dtype $model run: simt did not say it loaded $table"
  if grep -q 'has no row in' "$log"; then
    fail "$dtype $model run: kernels without a row in $table (stale table, or a name spelt differently):"
    grep 'has no row in' "$log"
  fi
done

# Planted: every kernel at 255 registers per thread, so any block of more than 256 threads needs
# more registers than a GPU gives it.
awk -F'\t' -v OFS='\t' '{ $3 = 255; print }' "$table" >"$tmp/255-registers.tsv"
if train "$tmp/255-registers.tsv" "$tmp/planted.log" --dtype bf16 --init-from "$ref/model.bin" \
    --train-data "$ref/train.bin" --val-data "$ref/train.bin"; then
  fail "a run whose kernels all take 255 registers per thread succeeded"
else
  grep -q 'too many resources requested for launch' "$tmp/planted.log" ||
    fail "the 255-register run did not fail with 'too many resources requested for launch': $(tail -n 3 "$tmp/planted.log")"
  grep -qE 'launch of .* refused: sm_(80|90a): 255 registers per thread' "$tmp/planted.log" ||
    fail "the 255-register run's refusal does not name the figures"
fi
[ "$failures" -eq 0 ]
