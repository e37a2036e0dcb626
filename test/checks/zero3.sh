#!/usr/bin/env bash
# ZeRO 3 (parameters sharded, gathered bucket by bucket) everywhere the parameters are read, on 2
# ranks with a bucket per layer, fp32 and bf16. ZeRO 3 computes exactly what ZeRO 2 computes (the
# same gradient shards and AdamW update; the forward and backward read gathered copies of the
# same parameters), so every record must be bit-identical to the ZeRO 2 run's: training losses and
# gradient norms, validation, HellaSwag-style evaluation and greedy samples mid-run, the final
# model.bin and the checkpoint's model.bin; and so for --recompute 0 and 3, gradient accumulation
# and --zero3-prefetch 2. A model file written at ZeRO 3 is read by a one-process --generate.
# (Equality with one process and resharding resume: distributed_train.sh, checkpoint_reshard.sh.)
# usage: zero3.sh cpu|gpu   (gpu: needs 2 GPUs, else skipped)
set -u
# shellcheck source=test/checks/lib/trainer.sh
source "$(dirname "$0")/lib/trainer.sh" "$@"
require_files "$bin" data/gpt2_bpe/encoder.json
require_ranks 2

model=$tmp/model
"$python" dev/gpt2_reference.py --out "$model" --vocab 50257 --layers 3 --heads 2 --channels 32 --max-seq-len 64 \
  --batch 1 --seq-len 8 --steps 4 >/dev/null 2>&1 || { echo "FAIL: dev/gpt2_reference.py could not write the model"; exit 1; }
"$python" - "$tmp/eval.bin" <<'PY' || { echo "FAIL: writing the eval file"; exit 1; }
import sys
import numpy as np
sys.path.insert(0, "test/checks/lib")
from eval_file import write_eval_file
rng = np.random.default_rng(3)
# 5 examples of 2-4 completions: the two ranks score 3 and 2 examples, unequal rows.
examples = []
for i in range(5):
    n = 2 + i % 3
    examples.append((int(rng.integers(0, n)), rng.integers(0, 50257, 3).tolist(),
                     [rng.integers(0, 50257, int(rng.integers(1, 4))).tolist() for _ in range(n)]))
write_eval_file(sys.argv[1], examples)
PY

common=(--init-from "$model/model.bin" --train-data "$model/train.bin" --val-data "$model/train.bin" --val-every 2
        --val-steps 1 --batch-size 2 --seq-len 8 --max-steps 4 --lr 1e-2 --warmup-steps 0 --bucket-mib 0.01
        --eval-data "$tmp/eval.bin" --eval-every 2 --sample-every 2 --prompt "Once upon" --max-new-tokens 6
        --temperature 0)

# run NAME ARGS...: 2 ranks into $tmp/NAME.
run() {
  local name=$1; shift
  if ! mpirun -np 2 "${mpi_opts[@]}" "$bin" "${common[@]}" --out-dir "$tmp/$name" "$@" >"$tmp/$name.log" 2>&1; then
    fail "$name: exited non-zero"; tail -n 20 "$tmp/$name.log"; return 1
  fi
}

# identical A B: every record of B's metrics.jsonl (timings aside) and its model files equal A's.
identical() {
  "$python" - "$tmp/$1/metrics.jsonl" "$tmp/$2/metrics.jsonl" <<'PY' || fail "$2: records differ from $1's"
import json, sys
timing = {"ms", "tokens_per_s", "mfu", "eta_s", "time"}
a, b = ([{k: v for k, v in json.loads(l).items() if k not in timing} for l in open(p)] for p in sys.argv[1:3])
kinds = sorted({k for r in b for k in r if k in ("train_loss", "val_loss", "hellaswag_acc_norm", "sample")})
if a != b:
    for x, y in zip(a, b):
        if x != y: print(f"  {x}\n  {y}")
    sys.exit(1)
if len(kinds) < 4: print(f"  expected training, validation, evaluation and sample records, found {kinds}"); sys.exit(1)
PY
  cmp -s "$tmp/$1/model.bin" "$tmp/$2/model.bin" || fail "$2: model.bin differs from $1's"
  cmp -s "$tmp/$1/checkpoint_00000004/model.bin" "$tmp/$2/checkpoint_00000004/model.bin" ||
    fail "$2: the checkpoint's model.bin differs from $1's"
}

for dtype in fp32 bf16; do
  run "z2_$dtype" --dtype "$dtype" --zero 2 || continue
  run "z3_$dtype" --dtype "$dtype" --zero 3 && identical "z2_$dtype" "z3_$dtype"
  for variant in "--recompute 0" "--recompute 3" "--zero3-prefetch 2"; do
    name="z3_${dtype}_$(echo "$variant" | tr -d ' -')"
    # shellcheck disable=SC2086
    run "$name" --dtype "$dtype" --zero 3 $variant && identical "z2_$dtype" "$name"
  done
  run "acc_z2_$dtype" --dtype "$dtype" --zero 2 --total-batch-tokens 64 &&
    run "acc_z3_$dtype" --dtype "$dtype" --zero 3 --total-batch-tokens 64 && identical "acc_z2_$dtype" "acc_z3_$dtype"
done
grep -q "ZeRO stage 3" "$tmp/z3_fp32.log" || fail "the start-up report does not say ZeRO stage 3"
grep -q "2 data-parallel rank(s) x 2 accumulation step(s)" "$tmp/acc_z3_fp32.log" || fail "accumulation run: batch line"

# The ZeRO 3 run's model file is an ordinary one: one process generates from it.
"$bin" --generate --init-from "$tmp/z3_fp32/model.bin" --prompt "Once upon" --max-new-tokens 6 --temperature 0 \
  --dtype fp32 >"$tmp/generated" 2>"$tmp/generate.err" || fail "--generate on the ZeRO 3 model.bin: $(cat "$tmp/generate.err")"
last_sample=$("$python" -c 'import json,sys; print([json.loads(l)["sample"] for l in open(sys.argv[1]) if "sample" in l][-1], end="")' \
  "$tmp/z3_fp32/metrics.jsonl")
[ "$(cat "$tmp/generated")" = "$last_sample" ] || fail "--generate on the ZeRO 3 model.bin differs from the run's last sample"

[ "$failures" -eq 0 ] && echo "zero3: all checks passed"
[ "$failures" -eq 0 ]
