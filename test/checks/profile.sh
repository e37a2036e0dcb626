#!/usr/bin/env bash
# --profile end to end: a run of 3 steps with 2 micro-steps each at B·T = 2,048 rows, under a
# --gpu-memory that the plan with one 2,048-row lm-head chunk exceeds by half a MiB, so the memory
# plan chooses 1,024-row chunks (2 per micro-step). The run prints the table and writes
# DIR/profile.json with steps 2..3, held to the code's own plan: AdamW at most one launch per dtype
# per optimizer step (one dtype), the classifier and the lm head's forward product once per planned
# chunk per micro-step, the encoder forward once and its backward's kernels as planned per
# micro-step; every cuBLASLt site's FLOPs are 2·m·n·k of its shape; on the CPU build the time is
# labelled CPU time. --help documents the flag, and --profile with --max-steps fails naming both.
# usage: profile.sh cpu|gpu   (uses the tiny reference that `make test` builds)
set -u
# shellcheck source=test/checks/lib/trainer.sh
source "$(dirname "$0")/lib/trainer.sh" "$@"
require_files "$bin" "$ref/model.bin"

# A shard of 20,000 ids below the tiny model's vocabulary (500).
"$python" - "$tmp/train.bin" <<'PY'
import random, struct, sys
random.seed(7)
n = 20000
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
    f.write(struct.pack(f"<{n}H", *[random.randrange(500) for _ in range(n)]))
PY

shape=(--init-from "$ref/model.bin" --batch-size 32 --seq-len 64)
# --plan's total with the whole micro-batch in one chunk ("total per rank  61.5 MiB of ..."), less
# half a MiB (one 1,024-row chunk of bf16 logits, Vp = 512, is 1 MiB), in GiB.
budget=$("$bin" --plan "${shape[@]}" --gpu-memory 1000 | "$python" -c '
import re, sys
m = re.search(r"total per rank +([0-9.]+) (B|KiB|MiB|GiB)", sys.stdin.read())
scale = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}[m[2]]
print((float(m[1]) * scale - 2**19) / 2**30)')
out=$tmp/run
if ! "$bin" "${shape[@]}" --train-data "$tmp/train.bin" --val-every 0 --total-batch-tokens 4096 --profile 3 \
    --gpu-memory "$budget" --out-dir "$out" >"$tmp/log" 2>&1; then
  fail "the --profile run exited non-zero"; cat "$tmp/log"
fi
grep -q '^profile: 2 step(s)' "$tmp/log" || fail "no profile table on stdout"
[ "$(grep -c train_loss "$out/metrics.jsonl" 2>/dev/null)" = 3 ] || fail "--profile 3 did not train 3 steps"

"$python" - "$out/profile.json" <<'PY' || fail "profile.json does not match the plan"
import json, re, sys
p = json.load(open(sys.argv[1]))
plan, sites = p["plan"], p["sites"]
bad = []
def check(ok, what):
    print(("ok: " if ok else "FAIL: ") + what)
    if not ok: bad.append(what)
def launches(pattern, per):
    return sum(s[per] for s in sites if re.search(pattern, s["site"]))

check(p["profiled_steps"] == 2, f"steps 2..3 profiled ({p['profiled_steps']})")
check(plan["grad_accum_steps"] == 2, f"2 micro-steps per step planned ({plan['grad_accum_steps']})")
check(plan["lm_head_chunks_per_micro_step"] == 2 and plan["lm_head_chunk_rows"] == 1024,
      f"the plan's lm head: {plan['lm_head_chunks_per_micro_step']} chunks of {plan['lm_head_chunk_rows']} rows")
adamw = launches(r"^adamw_kernel<", "launches_per_step")
check(0 < adamw <= plan["adamw_launches_per_step"], f"AdamW launches per optimizer step: {adamw} (plan: at most "
      f"{plan['adamw_launches_per_step']} per dtype)")
chunks = launches(r"^fused_classifier_kernel<", "launches_per_micro_step")
check(chunks == plan["lm_head_chunks_per_micro_step"], f"classifier launches per micro-step: {chunks} (plan: "
      f"{plan['lm_head_chunks_per_micro_step']})")
# The lm head's forward products: m = Vp (512), k = C (64), n = the chunk's rows.
head = {int(re.search(r" n=(\d+)", s["site"]).group(1)): s["launches_per_micro_step"] for s in sites
        if re.match(r"cublasLt TN m=512 n=\d+ k=64$", s["site"])}
check(head == {plan["lm_head_chunk_rows"]: plan["lm_head_chunks_per_micro_step"]},
      f"lm-head forward products per micro-step by rows: {head}")
enc = launches(r"^encoder_forward_kernel<", "launches_per_micro_step")
check(enc == 1, f"encoder forward launches per micro-step: {enc}")
enc_back = launches(r"^encoder_backward_\w+_kernel<", "launches_per_micro_step")
check(enc_back == plan["encoder_backward_launches_per_micro_step"] == 3,
      f"encoder backward launches per micro-step: {enc_back} (plan: "
      f"{plan['encoder_backward_launches_per_micro_step']}; 3 at 2,048 rows: segments, combination, wpe)")
for s in sites:
    m = re.match(r"cublasLt .. m=(\d+) n=(\d+) k=(\d+)", s["site"])
    if m and s["flops_per_call"] != 2 * int(m[1]) * int(m[2]) * int(m[3]):
        check(False, f"{s['site']}: {s['flops_per_call']} FLOPs per call, expected 2mnk")
check(all(s["ms_per_step"] >= 0 and s["launches_per_step"] > 0 for s in sites), "every site launched and timed")
check(abs(sum(s["percent"] for s in sites) - 100) < 1e-6, "shares sum to 100%")
check(p["time"].startswith("CPU time") == p["device"].startswith("simt"), f"time labelled: {p['time']}")
sys.exit(1 if bad else 0)
PY

"$bin" --help | grep -q -- '--profile N' || fail "--help does not document --profile"
if "$bin" "${shape[@]}" --train-data "$tmp/train.bin" --profile 2 --max-steps 5 --out-dir "$tmp/both" \
    >"$tmp/both.log" 2>&1; then
  fail "--profile with --max-steps was accepted"
else
  grep -q -- '--profile N trains N steps: drop --max-steps' "$tmp/both.log" || { fail "unexpected message:"; cat "$tmp/both.log"; }
fi

[ "$failures" -eq 0 ] && echo "profile: all checks passed"
exit $((failures > 0))
