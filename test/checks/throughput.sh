#!/usr/bin/env bash
# Throughput and MFU in the log and metrics.jsonl. With --peak-tflops every step line has tok/s
# and MFU, every train record "tokens_per_s" and "mfu", and mfu = tokens_per_s x FLOPs per token /
# peak, with the FLOPs per token (llm.c's 6N + 6LCT, N = every parameter) computed here from the model
# file's header; the run ends with one throughput line after 3 warm-up steps. Without it the
# simulated device is unknown: "MFU: n/a (unknown GPU; pass --peak-tflops)" once, no MFU anywhere.
# usage: throughput.sh cpu|gpu
set -u
# shellcheck source=test/checks/lib/trainer.sh
source "$(dirname "$0")/lib/trainer.sh" "$@"
require_files "$bin" "$ref/model.bin" "$ref/train.bin"
[ "$mode" = cpu ] || { echo "skipped: the CPU build's device is the unknown one"; exit 77; }

common=(--init-from "$ref/model.bin" --train-data "$ref/train.bin" --val-every 0 --batch-size 2 --seq-len 16
        --max-steps 5 --warmup-steps 0)
if ! "$bin" "${common[@]}" --peak-tflops 0.001 --out-dir "$tmp/known" >"$tmp/known.log" 2>&1; then
  echo "FAIL: the run with --peak-tflops exited non-zero:"; cat "$tmp/known.log"; exit 1
fi
lines=$(grep -cE '^step [1-5]/5 \| .* \| [0-9]+ tok/s \| MFU [0-9]+\.[0-9]% \| ETA' "$tmp/known.log")
if [ "$lines" -eq 5 ]; then echo "ok: 5 step lines with tok/s and MFU"; else fail "$lines of 5 step lines have tok/s and MFU"; fi
summary=$(grep -E '^throughput: [0-9]+ tokens/s, [0-9.]+ ms/step, MFU [0-9]+\.[0-9]% \(mean over 2 step\(s\), after 3 warm-up step\(s\)\)$' "$tmp/known.log")
if [ -n "$summary" ]; then echo "ok: $summary"
else fail "no end-of-training throughput line: $(grep '^throughput' "$tmp/known.log")"; fi

"$python" - "$ref/model.bin" "$tmp/known/metrics.jsonl" <<'PY' || fail "metrics.jsonl's tokens_per_s and mfu"
import json, struct, sys
_, _, maxT, V, L, NH, C, Vp = struct.unpack("<8i", open(sys.argv[1], "rb").read(32))
T, peak, tokens = 16, 0.001e12, 2 * 16
params = Vp * C + maxT * C + L * (12 * C * C + 13 * C) + 2 * C
flops = 6 * params + 6 * L * C * T
records = [json.loads(l) for l in open(sys.argv[2]) if "train_loss" in l]
bad = [r for r in records
       if abs(r["tokens_per_s"] - tokens / (r["ms"] / 1000)) > 1e-6 * r["tokens_per_s"]
       or abs(r["mfu"] - r["tokens_per_s"] * flops / peak) > 1e-9 + 1e-6 * r["mfu"] or r["mfu"] <= 0]
print(f"{'FAIL' if bad or len(records) != 5 else 'ok'}: {len(records)} records with tokens_per_s and mfu "
      f"({flops} FLOPs per token); first mfu {records[0]['mfu']:.4g}" + (f"; wrong: {bad}" if bad else ""))
sys.exit(1 if bad or len(records) != 5 else 0)
PY

if ! "$bin" "${common[@]}" --out-dir "$tmp/unknown" >"$tmp/unknown.log" 2>&1; then
  echo "FAIL: the run without --peak-tflops exited non-zero:"; cat "$tmp/unknown.log"; exit 1
fi
notes=$(grep -c 'MFU: n/a (unknown GPU; pass --peak-tflops)' "$tmp/unknown.log")
others=$(grep -v 'MFU: n/a (unknown GPU; pass --peak-tflops)' "$tmp/unknown.log" | grep -E -c 'MFU [0-9-]')
mfu_keys=$(grep -c '"mfu"' "$tmp/unknown/metrics.jsonl")
if [ "$notes" -eq 1 ] && [ "$others" -eq 0 ] && [ "$mfu_keys" -eq 0 ] &&
    grep -qE '^throughput: [0-9]+ tokens/s, .*MFU n/a' "$tmp/unknown.log"; then
  echo "ok: unknown device: the n/a note once, no MFU figure in the log or metrics.jsonl"
else
  fail "unknown device: $notes n/a notes, $others MFU figures, $mfu_keys mfu keys"; cat "$tmp/unknown.log"
fi
[ "$failures" -eq 0 ]
