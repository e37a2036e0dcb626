#!/usr/bin/env bash
# Bad-step guards in a real run (docs/CHECKPOINTS.md, "Bad-step guards"): a model file whose huge
# (finite) weights make every loss non-finite, so every update is skipped, logged and counted; the
# fp32 run's last checkpoint holds the input file byte for byte (nothing was applied), and the run
# ends with a non-zero status without writing model.bin (a model no update reached is no result).
# Then a z-score guard that trips: skipped steps are logged with their z-score.
# usage: step_guards.sh cpu|gpu
set -u
# shellcheck source=test/checks/lib/trainer.sh
source "$(dirname "$0")/lib/trainer.sh" "$@"
require_files "$bin" "$ref/model.bin" "$ref/train.bin"

# The tiny fp32 model with its final LayerNorm's weights set to 3e38: finite (a model file holding
# a NaN or infinity is refused at start-up), but the normalized activations times 3e38 overflow, so
# every loss is non-finite.
"$python" - "$ref/model.bin" "$tmp/huge.bin" <<'EOF'
import struct, sys
data = bytearray(open(sys.argv[1], "rb").read())
magic, version, maxT, V, L, NH, C, Vp = struct.unpack("<8i", data[:32])
assert version == 3, "expected the fp32 reference model"
P = Vp * C + maxT * C + L * (C + C + 3 * C * C + 3 * C + C * C + C + C + C + 4 * C * C + 4 * C + 4 * C * C + C) + 2 * C
lnfw = 1024 + 4 * (P - 2 * C)
data[lnfw:lnfw + 4 * C] = struct.pack(f"<{C}f", *[3e38] * C)
open(sys.argv[2], "wb").write(data)
EOF

run=(--train-data "$ref/train.bin" --val-data "$ref/train.bin" --batch-size 2 --seq-len 32 --val-every 0)
if ! "$bin" "${run[@]}" --init-from "$tmp/huge.bin" --dtype fp32 --max-steps 3 --lr 1e-3 --out-dir "$tmp/huge" >"$tmp/huge.log" 2>&1; then
  "$python" - "$tmp/huge/metrics.jsonl" <<'EOF' || fail "non-finite steps: metrics.jsonl"
import json, sys
records = [json.loads(l) for l in open(sys.argv[1])]
ok = len(records) == 3 and all(r.get("skipped") in ("non-finite loss", "non-finite gradient norm") for r in records)
if not ok: print(records)
sys.exit(0 if ok else 1)
EOF
  [ "$(grep -c '| update skipped: non-finite' "$tmp/huge.log")" -eq 3 ] || fail "non-finite steps: expected 3 log lines"
  grep -q '^updates skipped: 3 (non-finite 3, loss z-score 0, gradient-norm z-score 0)' "$tmp/huge.log" ||
    fail "non-finite steps: no count at the end"
  cmp -s "$tmp/huge.bin" "$tmp/huge/checkpoint_00000003/model.bin" || fail "non-finite steps changed the parameters"
  [ ! -e "$tmp/huge/model.bin" ] || fail "a run whose every update was skipped wrote model.bin"
  tail -n 1 "$tmp/huge.log" | grep -q "^error: every update of this run's 3 step(s) was skipped" ||
    fail "a run whose every update was skipped did not end with its error: $(tail -n 1 "$tmp/huge.log")"
else
  fail "a run whose every update was skipped exited 0"; cat "$tmp/huge.log"
fi

# A tight gradient-norm guard skips a step of this run, never one of the first 8 (the guard waits
# for 8 accepted steps); the skipped step's record says why.
if "$bin" "${run[@]}" --init-from "$ref/model.bin" --max-steps 10 --lr 2e-3 --warmup-steps 3 --skip-norm-z 0.5 \
    --out-dir "$tmp/z" >"$tmp/z.log" 2>&1; then
  "$python" - "$tmp/z/metrics.jsonl" <<'EOF' || fail "z-score guard: metrics.jsonl"
import json, sys
records = [json.loads(l) for l in open(sys.argv[1])]
skipped = {r["step"]: r["skipped"] for r in records if "skipped" in r}
ok = len(records) == 10 and skipped and all(s.startswith("gradient-norm z-score ") for s in skipped.values()) \
    and min(skipped) > 8
if not ok: print(skipped)
sys.exit(0 if ok else 1)
EOF
else
  fail "z-score run failed"; cat "$tmp/z.log"
fi

[ "$failures" -eq 0 ] && echo "step_guards: all checks passed"
[ "$failures" -eq 0 ]
