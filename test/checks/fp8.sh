#!/usr/bin/env bash
# --fp8 end to end (src/model/fp8_state.h): a GPT-2 run of 12 steps with the blocks' products in
# FP8 (validation after every 3rd step; step 9's update skipped by a guard) equals, record for
# record and in its final model.bin byte for byte, the same run stopped after step 9's checkpoint
# and resumed from it: the FP8 scales, inverse scales and histories are in the state files
# (docs/CHECKPOINTS.md) and restored. Both scalings. Also: the run is FP8 (its losses differ from
# the bf16 run's) and --plan counts the FP8 weight copies and casts. The same resume at TP 2, and
# across pipeline layouts: PP 2 (interleaved) and one process resumed into each other, and current
# scaling's first step under gpipe equal to one process's (below).
# usage: fp8.sh cpu|gpu
set -u
# shellcheck source=test/checks/lib/trainer.sh
source "$(dirname "$0")/lib/trainer.sh" "$@"
require_files "$bin" "$ref/model.bin" "$ref/train.bin" build/reference/llama-untied31/model.bin

common=(--init-from "$ref/model.bin" --train-data "$ref/train.bin" --val-data "$ref/train.bin" --shuffle 1
        --batch-size 2 --seq-len 32 --lr 2e-3 --lr-schedule constant --warmup-steps 0 --val-every 3 --val-steps 1
        --checkpoint-every 4)

# The records of two metrics files without their timing fields, equal.
same_records() {
  "$python" - "$1/metrics.jsonl" "$2/metrics.jsonl" <<'PY'
import json, sys
def load(p):
    return [{k: v for k, v in json.loads(l).items() if k not in ("ms", "tokens_per_s", "mfu")} for l in open(p)]
a, b = load(sys.argv[1]), load(sys.argv[2])
if a != b or len(a) < 8:
    print(f"  {len(a)} vs {len(b)} records")
    for x, y in zip(a, b):
        if x != y: print(f"  straight {x}\n  resumed  {y}"); break
    sys.exit(1)
PY
}

# Tight guards skip step 9's update: the checkpoint after it holds a step that never ended.
guards=(--skip-norm-z 0.5 --skip-loss-z 1)
for scaling in delayed current; do
  fp8=(--fp8 1 --fp8-scaling "$scaling")
  run "$scaling-straight" 1 "${fp8[@]}" "${guards[@]}" --max-steps 12 || continue
  grep -q '"skipped"' "$tmp/$scaling-straight/metrics.jsonl" || fail "$scaling: no step skipped (the test needs one)"
  run "$scaling-resumed" 1 "${fp8[@]}" "${guards[@]}" --max-steps 9 || continue
  run "$scaling-resumed" 1 "${fp8[@]}" "${guards[@]}" --max-steps 12 --resume auto || continue
  grep -q "resum" "$tmp/$scaling-resumed.log" || fail "$scaling: the second run did not resume"
  same_records "$tmp/$scaling-straight" "$tmp/$scaling-resumed" || fail "$scaling: the resumed run's records differ"
  cmp -s "$tmp/$scaling-straight/model.bin" "$tmp/$scaling-resumed/model.bin" ||
    fail "$scaling: the resumed run's model.bin differs"
done

# TP 2 (2 ranks; skipped on a machine with fewer GPUs): the resume reads rank 0's FP8 section into
# both ranks, which is right because the amaxes are reduced over the TP group.
if [ "$mode" = cpu ] || [ "$(nvidia-smi -L 2>/dev/null | wc -l)" -ge 2 ]; then
  require_ranks 2
  run tp-straight 2 --fp8 1 --tp 2 "${guards[@]}" --max-steps 12 &&
    run tp-resumed 2 --fp8 1 --tp 2 "${guards[@]}" --max-steps 9 &&
    run tp-resumed 2 --fp8 1 --tp 2 "${guards[@]}" --max-steps 12 --resume auto &&
    { same_records "$tmp/tp-straight" "$tmp/tp-resumed" || fail "TP 2: the resumed run's records differ"; }
fi

run bf16 1 --max-steps 12
if "$python" - "$tmp/bf16/metrics.jsonl" "$tmp/delayed-straight/metrics.jsonl" <<'PY'; then
import json, sys
a, b = ([json.loads(l)["train_loss"] for l in open(p) if "train_loss" in l] for p in sys.argv[1:3])
sys.exit(0 if a == b else 1)
PY
  fail "the --fp8 run's losses equal the bf16 run's: the products did not run in FP8"
fi

plan=(--plan --init-from "$ref/model.bin" --batch-size 2 --seq-len 32)
"$bin" "${plan[@]}" --fp8 1 >"$tmp/plan_fp8.txt" 2>&1 || fail "--plan --fp8 failed"
grep -q "FP8 weight copies and casts" "$tmp/plan_fp8.txt" || fail "--plan --fp8 does not count the FP8 copies"
"$bin" "${plan[@]}" >"$tmp/plan.txt" 2>&1 || fail "--plan failed"
! grep -q "FP8" "$tmp/plan.txt" || fail "--plan without --fp8 counts FP8 copies"

# Pipeline stages (2 ranks; skipped on a machine with fewer GPUs), on a 4-layer model: a checkpoint
# holds the whole model's FP8 state in global layer order, gathered from the stages, and a resume
# at any --pp picks its stage's layers. Interleaved PP 2 (rank 0 layers 0 and 2, rank 1 layers 1
# and 3) resumed at the same layout equals its uninterrupted run bit for bit; resumed on one
# process and at contiguous PP 2, and one process's checkpoint resumed at PP 2, their first step's
# loss (a forward pass through every layer's restored input and weight scales, the same at every
# layout) equals the uninterrupted run's bit for bit and the later steps within 2e-3 (the layouts
# sum the tied embedding's gradient in another order).
# same_after STRAIGHT RESUMED REL: RESUMED (resumed from STRAIGHT's step-4 checkpoint into its own
# --out-dir) recorded what STRAIGHT did after step 4: all bit for bit when REL is 0, else the first
# step's loss bit for bit and every loss within REL.
same_after() {
  "$python" - "$tmp/$1/metrics.jsonl" "$tmp/$2/metrics.jsonl" "$3" <<'PY' || fail "$2 differs from $1 after step 4"
import json, sys
def load(p):
    return [{k: v for k, v in json.loads(l).items() if k not in ("ms", "tokens_per_s", "mfu")} for l in open(p)]
a, b, rel = [r for r in load(sys.argv[1]) if r["step"] > 4], load(sys.argv[2]), float(sys.argv[3])
bad = len(a) != len(b) or len(b) < 5 or a[0]["train_loss"] != b[0]["train_loss"]
for x, y in zip(a, b):
    if rel == 0 and x != y: print(f"  straight {x}\n  resumed  {y}"); bad = True
    for key in ("train_loss", "val_loss"):
        if key in x and abs(x[key] - y.get(key, 0)) > rel * abs(x[key]):
            print(f"  step {x['step']} {key}: {x[key]} vs {y.get(key)}"); bad = True
print(f"  {sys.argv[2].split('/')[-2]}: first loss {b[0]['train_loss'] if b else None} (straight {a[0]['train_loss'] if a else None})")
sys.exit(1 if bad else 0)
PY
}
if [ "$mode" = cpu ] || [ "$(nvidia-smi -L 2>/dev/null | wc -l)" -ge 2 ]; then
  require_ranks 2
  if "$python" dev/gpt2_reference.py --out "$tmp/l4" --layers 4 --steps 1 >/dev/null 2>&1; then
    with_flags common --init-from "$tmp/l4/model.bin" --train-data "$tmp/l4/train.bin" --val-data "$tmp/l4/train.bin" \
      --total-batch-tokens 128 --fp8 1
    common=("${flags[@]}")
    interleaved=(--pp 2 --pp-schedule interleaved --pp-virtual 2)
    if run pp-straight 2 "${interleaved[@]}" --max-steps 8; then
      run pp-resumed 2 "${interleaved[@]}" --max-steps 8 --resume "$tmp/pp-straight/checkpoint_00000004" &&
        same_after pp-straight pp-resumed 0
      run pp-on-1 1 --max-steps 8 --resume "$tmp/pp-straight/checkpoint_00000004" && same_after pp-straight pp-on-1 2e-3
      run pp-on-contiguous 2 --pp 2 --max-steps 8 --resume "$tmp/pp-straight/checkpoint_00000004" &&
        same_after pp-straight pp-on-contiguous 2e-3
    fi
    run one-straight 1 --max-steps 8 &&
      run one-on-pp 2 "${interleaved[@]}" --max-steps 8 --resume "$tmp/one-straight/checkpoint_00000004" &&
      same_after one-straight one-on-pp 2e-3
  else
    fail "dev/gpt2_reference.py could not write the 4-layer model"
  fi
  # Current scaling under gpipe (every forward before the first backward): each backward casts its
  # micro-batch's input with that input's own scale, not the last forward's. On an untied Llama
  # (no tied embedding summed across stages) PP 2's first step equals one process's: the loss bit
  # for bit, the gradient norm within 1e-6 (its sum over the stages rounds apart: ~1e-7).
  llama=build/reference/llama-untied31
  common=(--init-from "$llama/model.bin" --train-data "$llama/train.bin" --val-data "$llama/train.bin" --batch-size 2
          --seq-len 32 --total-batch-tokens 128 --max-steps 1 --save 0 --fp8 1 --fp8-scaling current)
  run current-one 1 && run current-pp 2 --pp 2 --pp-schedule gpipe &&
    { "$python" - "$tmp/current-one/metrics.jsonl" "$tmp/current-pp/metrics.jsonl" <<'PY' || fail "current scaling: PP 2's first step differs from one process's"
import json, sys
a, b = (json.loads(open(p).readline()) for p in sys.argv[1:3])
rel = abs(a["grad_norm"] - b["grad_norm"]) / a["grad_norm"]
print(f"  current scaling, PP 2 (gpipe) vs one process: loss {b['train_loss']} vs {a['train_loss']}, grad norm relative {rel:.1e}")
sys.exit(0 if a["train_loss"] == b["train_loss"] and rel <= 1e-6 else 1)
PY
    }
fi

[ $failures -eq 0 ] && echo "fp8: ok"
exit $((failures > 0))
