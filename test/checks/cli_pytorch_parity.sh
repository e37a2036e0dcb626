#!/usr/bin/env bash
# The binary, end to end, against PyTorch: a fresh reference (a model and data the binary has
# never seen) trained for 10 steps by dev/gpt2_reference.py, then by the binary through its
# CLI in both dtypes; per-step train_loss and grad_norm must agree (fp32: max rel err 1e-4,
# bf16: 2e-2).
# usage: cli_pytorch_parity.sh cpu|gpu
set -u
# shellcheck source=test/checks/lib/trainer.sh
source "$(dirname "$0")/lib/trainer.sh" "$@"
require_files "$bin"

steps=10
if ! "$python" dev/gpt2_reference.py --out "$tmp" --layers 3 --heads 2 --channels 48 --vocab 300 --max-seq-len 32 \
    --batch 2 --seq-len 16 --steps $steps --seed 4242 --lr 1e-3 --weight-decay 0.1 --grad-clip 1.0; then
  echo "FAIL: dev/gpt2_reference.py failed"; exit 1
fi

for spec in "fp32 1e-4" "bf16 2e-2"; do
  read -r dtype tol <<<"$spec"
  if ! "$bin" --init-from "$tmp/model.bin" --train-data "$tmp/train.bin" --dtype "$dtype" --shuffle 0 \
      --batch-size 2 --seq-len 16 --max-steps $steps --lr 1e-3 --lr-schedule constant --warmup-steps 0 \
      --weight-decay 0.1 --grad-clip 1.0 --beta1 0.9 --beta2 0.95 --adam-eps 1e-8 --val-every 0 \
      --out-dir "$tmp/run_$dtype" >"$tmp/$dtype.log" 2>&1; then
    echo "FAIL: $dtype run exited non-zero:"; cat "$tmp/$dtype.log"; failures=$((failures + 1)); continue
  fi
  "$python" - "$tmp/reference.json" "$tmp/run_$dtype/metrics.jsonl" "$tol" "$dtype" <<'EOF' || failures=$((failures + 1))
import json, math, sys
reference = json.load(open(sys.argv[1]))
records = [r for r in map(json.loads, open(sys.argv[2])) if "train_loss" in r]
tol, dtype = float(sys.argv[3]), sys.argv[4]
ok = True
for key, ref_key in (("train_loss", "losses"), ("grad_norm", "grad_norms")):
    want, got = reference[ref_key], [r[key] for r in records]
    if len(got) != len(want):
        print(f"FAIL: {dtype}: {len(got)} train records, reference has {len(want)} steps"); sys.exit(1)
    errs = [abs(g - w) / abs(w) if g is not None and math.isfinite(g) else math.inf for g, w in zip(got, want)]
    for k, (g, w, e) in enumerate(zip(got, want, errs), 1):
        print(f"  {dtype} step {k:2d} {key}: train_gpt {g:.7f}  pytorch {w:.7f}  rel err {e:.1e}")
    worst = max(errs)
    print(f"{'ok' if worst <= tol else 'FAIL'}: {dtype} {key}: max rel err {worst:.2e} (limit {tol:g})")
    ok = ok and worst <= tol
sys.exit(0 if ok else 1)
EOF
done
[ "$failures" -eq 0 ]
