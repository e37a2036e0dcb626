#!/usr/bin/env bash
# Resharding on resume (docs/CHECKPOINTS.md): a checkpoint written by 2 ranks at ZeRO 1 or 2
# resumes on 1 rank and on 4 ranks (and at the other ZeRO stage, and with other gradient buckets)
# with the same global micro-batch (ranks × --batch-size), and the resumed steps 4-6 give the
# losses, gradient norms and validation losses of the uninterrupted 2-rank run: fp32 to 1e-5
# relative, bf16 to 2e-3 (the ranks' gradients are summed in another grouping). ZeRO 3 (sharded
# parameters) on either side: 4 ranks at ZeRO 3 resume on 2 at ZeRO 1, and 2 ranks at ZeRO 1 on 4
# at ZeRO 3, continuing the uninterrupted run of the stage they resume at; and across
# tensor-parallel sizes (TP 2 -> 1 rank, 2 ranks -> TP 2 and TP 2 x DP 2 at ZeRO 3) and from a
# checkpoint of two TP groups (fp32 TP 2 x DP 2 at ZeRO 1 -> 1 rank and -> the same grid, against
# that run: each rank's state file holds the TP part and DP shard of its place in the grid). A
# resume whose global batch differs is refused in one line that names the --batch-size to use.
# usage: checkpoint_reshard.sh cpu|gpu   (gpu: needs 4 GPUs, else skipped)
set -u
# shellcheck source=test/checks/lib/trainer.sh
source "$(dirname "$0")/lib/trainer.sh" "$@"
require_files "$bin" "$ref/model.bin" "$ref/train.bin"
require_ranks 4

common=(--init-from "$ref/model.bin" --train-data "$ref/train.bin" --val-data "$ref/train.bin" --shuffle 1
        --seq-len 16 --max-steps 6 --lr 2e-3 --warmup-steps 2 --val-every 3 --val-steps 1)

# ranks N ARGS...: train_gpt under mpirun with N ranks (1: without mpirun).
ranks() {
  local n=$1; shift
  if [ "$n" -eq 1 ]; then "$bin" "${common[@]}" "$@"; else mpirun -np "$n" "${mpi_opts[@]}" "$bin" "${common[@]}" "$@"; fi
}

# close STRAIGHT RESUMED TOLERANCE: the resumed run's step records equal the straight run's for
# the same steps (losses, norms, lr, validation) within TOLERANCE relative.
close() {
  "$python" - "$1/metrics.jsonl" "$2/metrics.jsonl" "$3" <<'PY'
import json, sys
def load(p):
    return {(r.get("type", "train"), r["step"]): r for r in map(json.loads, open(p)) if "step" in r}
a, b, tol = load(sys.argv[1]), load(sys.argv[2]), float(sys.argv[3])
keys = sorted(k for k in b if k[1] > 3)
if len(keys) < 3 or any(k not in a for k in keys):
    print(f"  resumed records {keys}, straight {sorted(a)}"); sys.exit(1)
worst = 0.0
for k in keys:
    for field, v in b[k].items():
        if field in ("ms", "tokens_per_s", "mfu") or not isinstance(v, float): continue
        w = a[k][field]
        worst = max(worst, abs(v - w) / max(abs(w), 1e-6))
print(f"  worst relative difference {worst:.2e} over {len(keys)} records")
sys.exit(0 if worst <= tol else 1)
PY
}

# resume NAME CHECKPOINT STRAIGHT OUT TOLERANCE RANKS ARGS...: resumes CHECKPOINT on RANKS ranks
# into OUT and compares its steps with the uninterrupted run STRAIGHT's.
resume() {
  local name=$1 ckpt=$2 straight=$3 out=$4 tol=$5 n=$6
  shift 6
  if ranks "$n" "$@" --resume "$ckpt" --out-dir "$out" >"$out.log" 2>&1; then
    grep -q "resumed from $ckpt: 3 step" "$out.log" || fail "$name: did not resume from step 3"
    echo "$name:"
    close "$straight" "$out" "$tol" || fail "$name: resumed steps differ from the uninterrupted run"
  else
    fail "$name: resume failed"; tail -n 5 "$out.log"
  fi
}

for combo in fp32:1 fp32:2 bf16:1 bf16:2; do
  dtype=${combo%:*} zero=${combo#*:}
  tol=1e-5; [ "$dtype" = bf16 ] && tol=2e-3
  straight=$tmp/$dtype-zero$zero
  if ! ranks 2 --batch-size 2 --dtype "$dtype" --zero "$zero" --bucket-mib 0.1 --checkpoint-every 3 --out-dir "$straight" \
      >"$straight.log" 2>&1; then
    fail "$dtype ZeRO $zero: the 2-rank run failed"; tail -n 20 "$straight.log"; continue
  fi
  ckpt=$straight/checkpoint_00000003
  # to: ranks, --batch-size, ZeRO stage, --bucket-mib (0.1: a bucket per layer; 32: one for both).
  for to in "1 4 0 0.1" "4 1 $zero 0.1" "4 1 $((3 - zero)) 0.1" "2 2 $zero 32"; do
    read -r n b z mib <<<"$to"
    resume "$dtype ZeRO $zero, 2 ranks -> $n rank(s) B $b ZeRO $z --bucket-mib $mib" "$ckpt" "$straight" \
      "$tmp/$dtype-$zero-to-$n-$z-$mib" "$tol" "$n" --batch-size "$b" --dtype "$dtype" --zero "$z" --bucket-mib "$mib"
  done
done

# ZeRO 3 on 4 ranks (B 1) -> ZeRO 1 on 2 ranks (B 2), against the straight 2-rank ZeRO 1 run; and
# ZeRO 1 on 2 ranks -> ZeRO 3 on 4 ranks, against a straight 4-rank ZeRO 3 run.
for dtype in fp32 bf16; do
  tol=1e-5; [ "$dtype" = bf16 ] && tol=2e-3
  z3=$tmp/$dtype-zero3-4ranks
  if ! ranks 4 --batch-size 1 --dtype "$dtype" --zero 3 --bucket-mib 0.1 --checkpoint-every 3 --out-dir "$z3" \
      >"$z3.log" 2>&1; then
    fail "$dtype ZeRO 3: the 4-rank run failed"; tail -n 20 "$z3.log"; continue
  fi
  for pair in "$z3 2 2 1 $tmp/$dtype-zero1" "$tmp/$dtype-zero1 4 1 3 $z3"; do
    read -r from n b z straight <<<"$pair"
    resume "$dtype $(basename "$from") -> $n ranks ZeRO $z" "$from/checkpoint_00000003" "$straight" \
      "$tmp/$dtype-from-$(basename "$from")-to-$n-$z" "$tol" "$n" --batch-size "$b" --dtype "$dtype" --zero "$z" \
      --bucket-mib 0.1
  done
done

# Across tensor-parallel sizes (the model file is gathered on write and split on read; the optimizer
# state is found by the whole model's parameter index): TP 2 (B 4) -> one rank (B 4), against the
# straight TP 2 run; the straight 2-rank ZeRO 1 run's checkpoint -> TP 2 (B 4) and -> TP 2 x DP 2
# at ZeRO 3 (B 2), against that run.
for dtype in fp32 bf16; do
  tol=1e-5; [ "$dtype" = bf16 ] && tol=2e-3
  tp2=$tmp/$dtype-tp2
  if ! ranks 2 --tp 2 --batch-size 4 --dtype "$dtype" --zero 1 --bucket-mib 0.1 --checkpoint-every 3 --out-dir "$tp2" \
      >"$tp2.log" 2>&1; then
    fail "$dtype TP 2: the run failed"; tail -n 20 "$tp2.log"; continue
  fi
  resume "$dtype TP 2 -> 1 rank" "$tp2/checkpoint_00000003" "$tp2" "$tmp/$dtype-tp2-to-1" "$tol" 1 --batch-size 4 \
    --dtype "$dtype" --bucket-mib 0.1
  for to in "2 4 1" "4 2 3"; do
    read -r n b z <<<"$to"
    resume "$dtype 2 ranks ZeRO 1 -> TP 2 on $n ranks ZeRO $z" "$tmp/$dtype-zero1/checkpoint_00000003" \
      "$tmp/$dtype-zero1" "$tmp/$dtype-zero1-to-tp2-$n" "$tol" "$n" --tp 2 --batch-size "$b" --dtype "$dtype" \
      --zero "$z" --bucket-mib 0.1
  done
done

# A checkpoint of two TP groups (ranks 0-1 and 2-3), ZeRO 1 over each DP group's two ranks.
tpdp=$tmp/fp32-tp2dp2
if ranks 4 --tp 2 --batch-size 2 --dtype fp32 --zero 1 --bucket-mib 0.1 --checkpoint-every 3 --out-dir "$tpdp" \
    >"$tpdp.log" 2>&1; then
  resume "fp32 TP 2 x DP 2 -> 1 rank" "$tpdp/checkpoint_00000003" "$tpdp" "$tmp/fp32-tp2dp2-to-1" 1e-5 1 \
    --batch-size 4 --dtype fp32 --bucket-mib 0.1
  resume "fp32 TP 2 x DP 2 -> TP 2 x DP 2" "$tpdp/checkpoint_00000003" "$tpdp" "$tmp/fp32-tp2dp2-to-tp2dp2" 1e-5 4 \
    --tp 2 --batch-size 2 --dtype fp32 --zero 1 --bucket-mib 0.1
else
  fail "fp32 TP 2 x DP 2: the run failed"; tail -n 20 "$tpdp.log"
fi

# Another global micro-batch is refused, naming the --batch-size that keeps it.
ckpt=$tmp/fp32-zero1/checkpoint_00000003
if ranks 4 --batch-size 2 --dtype fp32 --zero 1 --resume "$ckpt" --out-dir "$tmp/refused" >"$tmp/refused.log" 2>&1; then
  fail "resuming 2 ranks x B 2 with 4 ranks x B 2 was not refused"
else
  grep -q "use --batch-size 1" "$tmp/refused.log" || { fail "global batch refusal message"; tail -n 3 "$tmp/refused.log"; }
fi

[ "$failures" -eq 0 ] && echo "checkpoint_reshard: all checks passed"
[ "$failures" -eq 0 ]
