#!/usr/bin/env bash
# dev/plot.py on real runs of the binary: a PNG (valid signature, the expected size, not blank)
# with the panels of the metrics the runs wrote, a HellaSwag panel only when a run has that
# metric, and one clear line with a non-zero exit for a missing run directory or metrics file.
# usage: plot.sh cpu|gpu
set -u
# shellcheck source=test/checks/lib/trainer.sh
source "$(dirname "$0")/lib/trainer.sh" "$@"
require_files "$bin" "$ref/model.bin" "$ref/train.bin"

for lr in 1e-3 3e-4; do
  if ! "$bin" --init-from "$ref/model.bin" --train-data "$ref/train.bin" --val-data "$ref/train.bin" --val-steps 1 \
      --batch-size 2 --seq-len 16 --max-steps 6 --val-every 3 --lr "$lr" --out-dir "$tmp/lr$lr" \
      >"$tmp/lr$lr.log" 2>&1; then
    fail "run with --lr $lr exited non-zero:"; cat "$tmp/lr$lr.log"; exit 1
  fi
done
# A run whose records include HellaSwag evaluations.
mkdir -p "$tmp/evals"
printf '%s\n' '{"step":1,"train_loss":3.5,"lr":1e-3,"grad_norm":1.0,"ms":10,"tokens_per_s":100}' \
  '{"step":2,"hellaswag_acc_norm":0.27,"hellaswag_acc":0.26,"hellaswag_examples":40}' \
  '{"step":4,"hellaswag_acc_norm":0.29,"hellaswag_acc":0.28,"hellaswag_examples":40}' >"$tmp/evals/metrics.jsonl"

# check_png FILE WIDTH HEIGHT: PNG signature, IHDR size, and more than one colour.
check_png() {
  "$python" - "$@" <<'PY'
import struct, sys
import matplotlib.image
path, width, height = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
data = open(path, "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
w, h = struct.unpack(">II", data[16:24])
assert (w, h) == (width, height), f"{w}x{h}, expected {width}x{height}"
pixels = matplotlib.image.imread(path)
assert pixels.std() > 0.01, "blank image"
PY
}

if out=$("$python" dev/plot.py "$tmp/lr1e-3" "$tmp/lr3e-4" -o "$tmp/runs.png" --baseline 124M 2>&1) &&
   [ "$out" = "$tmp/runs.png: 2 run(s); panels: loss, learning rate, gradient norm, tokens/s" ] &&
   check_png "$tmp/runs.png" 1500 720; then
  echo "ok: two runs → $out"
else
  fail "plot of two runs: $out"
fi
if out=$("$python" dev/plot.py "$tmp/lr1e-3" "$tmp/evals" -o "$tmp/evals.png" --baseline-hellaswag 0.294 2>&1) &&
   [ "$out" = "$tmp/evals.png: 2 run(s); panels: loss, HellaSwag acc_norm, learning rate, gradient norm, tokens/s" ] &&
   check_png "$tmp/evals.png" 1500 720; then
  echo "ok: a run with HellaSwag records adds its panel"
else
  fail "plot with HellaSwag records: $out"
fi

# A mixture of experts' routing records (metrics.h: aux_loss, expert_tokens, expert_imbalance).
mkdir -p "$tmp/experts"
printf '%s\n' '{"step":1,"train_loss":3.5,"lr":1e-3,"grad_norm":1.0,"ms":10,"tokens_per_s":100,"aux_loss":2.1,"expert_tokens":[30,34,20,44],"expert_imbalance":1.375}' \
  '{"step":2,"train_loss":3.4,"lr":1e-3,"grad_norm":0.9,"ms":10,"tokens_per_s":100,"aux_loss":2.05,"expert_tokens":[32,32,30,34],"expert_imbalance":1.0625}' \
  >"$tmp/experts/metrics.jsonl"
if out=$("$python" dev/plot.py "$tmp/lr1e-3" "$tmp/experts" -o "$tmp/experts.png" 2>&1) &&
   [ "$out" = "$tmp/experts.png: 2 run(s); panels: loss, learning rate, gradient norm, tokens/s, load-balancing loss, expert imbalance, expert load" ] &&
   check_png "$tmp/experts.png" 1500 1080; then
  echo "ok: a run with experts adds the routing panels"
else
  fail "plot with routing records: $out"
fi

mkdir -p "$tmp/empty_run"
for spec in "$tmp/no_such_run|not a directory" "$tmp/empty_run|metrics.jsonl: cannot read"; do
  run_dir=${spec%%|*} pattern=${spec#*|}
  if "$python" dev/plot.py "$run_dir" -o "$tmp/bad.png" >"$tmp/out" 2>"$tmp/err"; then
    fail "plot of $run_dir exited 0"
  elif [ "$(wc -l <"$tmp/err")" -eq 1 ] && grep -q "$pattern" "$tmp/err" && [ ! -e "$tmp/bad.png" ]; then
    echo "ok: $(cat "$tmp/err")"
  else
    fail "plot of $run_dir: expected one line matching '$pattern', got:"; cat "$tmp/err"
  fi
done
[ "$failures" -eq 0 ]
