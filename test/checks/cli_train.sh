#!/usr/bin/env bash
# End-to-end training runs of the binary on small data; checks what a run leaves behind:
# metrics.jsonl (steps, keys, finite values, learning rates, validation records), the
# per-step log lines, model.bin, truncation of a previous run's metrics, gradient
# accumulation equal to the bigger batch, and a random-init preset run. Also: the start-up
# warnings (and none for a sensible run or README's CPU example, which can run twice),
# evaluation only (--max-steps 0), an fp32 final model file from a bf16 run (--save-dtype), and a
# measurement run (--save 0) that leaves only metrics.jsonl, at the same losses as a saving run.
# usage: cli_train.sh cpu|gpu   (run from anywhere; uses the tiny reference that `make test` builds)
set -u
# shellcheck source=test/checks/lib/trainer.sh
source "$(dirname "$0")/lib/trainer.sh" "$@"
require_files "$bin" "$ref/model.bin" "$ref/train.bin"
# Validation on a copy of the training shard: the same file would draw the warning that the
# validation loss measures text the model trains on.
cp "$ref/train.bin" "$tmp/val.bin"

# Checks DIR/metrics.jsonl of a run: train records for steps 1..N in order with exactly the
# documented keys and finite values, lr(k) per the documented schedule, and a validation
# record right after step k for every k % VAL_EVERY == 0 and after the last step.
# usage: check_metrics DIR N VAL_EVERY LR WARMUP FINAL_FRAC SCHEDULE
check_metrics() {
  "$python" - "$@" <<'EOF'
import json, math, sys
out, n, val_every, peak, warmup, final_frac, kind = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), \
    float(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6]), sys.argv[7]
def lr_at(s):
    if s <= warmup: return peak * s / warmup
    p, lo = (s - warmup) / (n - warmup), final_frac * peak
    if kind == "cosine": return lo + (peak - lo) * 0.5 * (1 + math.cos(math.pi * p))
    if kind == "linear": return lo + (peak - lo) * (1 - p)
    if kind == "constant": return peak
    start = max(warmup, n - n // 5)
    return peak if s <= start else peak - (peak - lo) * (s - start) / (n - start)
records = [json.loads(line) for line in open(out + "/metrics.jsonl")]
expected = []
for k in range(1, n + 1):
    expected.append(("train", k))
    if val_every > 0 and (k % val_every == 0 or k == n): expected.append(("val", k))
got = [("val" if "val_loss" in r else "train", r.get("step")) for r in records]
problems = []
if got != expected: problems.append(f"record sequence {got} != expected {expected}")
train_keys = ["step", "train_loss", "lr", "grad_norm", "ms", "tokens_per_s"]
for r in records:
    # "mfu" only where the GPU's peak is known (never in the CPU build without --peak-tflops)
    keys = ["step", "val_loss"] if "val_loss" in r else train_keys + (["mfu"] if "mfu" in r else [])
    if list(r.keys()) != keys: problems.append(f"keys {list(r.keys())} != {keys}")
    for key in keys[1:]:
        if not isinstance(r.get(key), (int, float)) or not math.isfinite(r[key]): problems.append(f"{r}: {key} not finite")
    if "lr" in r and isinstance(r["lr"], float) and abs(r["lr"] - lr_at(r["step"])) > 1e-9 * peak:
        problems.append(f"step {r['step']}: lr {r['lr']} != schedule {lr_at(r['step'])}")
    if "train_loss" in r and not (0 < r.get("train_loss", 0) < 20): problems.append(f"implausible loss in {r}")
for p in problems: print("  " + p)
sys.exit(1 if problems else 0)
EOF
}

# Header of a model file: magic, version, maxT, V, L, NH, C, Vp.
model_header() { "$python" -c 'import struct,sys; print(*struct.unpack("<8i", open(sys.argv[1],"rb").read(32)))' "$1"; }

# 1. bf16 (the default dtype) from the tiny model: warmup + cosine, validation every 3 steps.
run1=$tmp/run1
if ! "$bin" --init-from "$ref/model.bin" --train-data "$ref/train.bin" --val-data "$tmp/val.bin" \
    --batch-size 2 --seq-len 32 --max-steps 7 --lr 1e-3 --warmup-steps 2 --final-lr-frac 0.1 \
    --val-every 3 --val-steps 2 --out-dir "$run1" >"$tmp/run1.log" 2>&1; then
  fail "bf16 run exited non-zero"; cat "$tmp/run1.log"
else
  check_metrics "$run1" 7 3 1e-3 2 0.1 cosine || fail "bf16 run: metrics.jsonl"
  [ "$(grep -cE '^step +[0-9]+/7 \| loss [0-9.]+ \| lr .* \| norm .* ms \| .* tok/s \| ETA' "$tmp/run1.log")" -eq 7 ] ||
    fail "bf16 run: expected 7 per-step log lines"
  [ "$(grep -c 'val loss' "$tmp/run1.log")" -eq 3 ] || fail "bf16 run: expected 3 validation log lines"
  grep -q '136,960 parameters' "$tmp/run1.log" || fail "bf16 run: no parameter count in the log"
  grep -qE '^memory: parameters\+gradients .* optimizer .* activations ' "$tmp/run1.log" || fail "bf16 run: no memory line"
  grep -q '^device: ' "$tmp/run1.log" || fail "bf16 run: no device line"
  ! grep -q 'warning' "$tmp/run1.log" || fail "bf16 run: a warning: $(grep warning "$tmp/run1.log")"
  [ "$(model_header "$run1/model.bin")" = "20240326 5 64 500 2 4 64 512" ] ||
    fail "bf16 run: model.bin header $(model_header "$run1/model.bin") (expected bf16 version 5, tiny config)"
  # the saved model is the trained one: from it, the first batch's loss is below the initial
  # weights' loss on that batch (the reference's step 1: same B, T, first batch)
  first=$("$python" -c 'import json,sys; print(json.load(open(sys.argv[1]))["losses"][0])' "$ref/reference.json")
  if "$bin" --init-from "$run1/model.bin" --train-data "$ref/train.bin" --val-every 0 --shuffle 0 \
      --batch-size 2 --seq-len 32 --max-steps 1 --out-dir "$tmp/cont" >"$tmp/cont.log" 2>&1; then
    again=$("$python" -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["train_loss"])' "$tmp/cont/metrics.jsonl")
    "$python" -c 'import sys; sys.exit(0 if float(sys.argv[2]) < float(sys.argv[1]) - 0.05 else 1)' "$first" "$again" ||
      fail "continuing from the saved model.bin: loss $again is not below the initial $first"
  else
    fail "continuing from the saved model.bin failed"; cat "$tmp/cont.log"
  fi
fi

# Evaluation only: the checkpoint's model gives the validation loss the run recorded after that
# step, and nothing is written.
val7=$("$python" -c 'import json,sys; print("%.6f" % [json.loads(l) for l in open(sys.argv[1])][-1]["val_loss"])' "$run1/metrics.jsonl")
if "$bin" --resume "$run1/checkpoint_00000007" --train-data "$ref/train.bin" --val-data "$tmp/val.bin" \
    --batch-size 2 --seq-len 32 --max-steps 0 --val-steps 2 --out-dir "$tmp/eval" >"$tmp/eval.log" 2>&1; then
  grep -q "^val loss $val7 (2 batch(es) of 2 x 32 tokens per rank, the model after step 7); --max-steps 0: evaluation only, nothing written$" \
    "$tmp/eval.log" || fail "evaluating the step-7 checkpoint: $(tail -n 1 "$tmp/eval.log"), the run had $val7"
  [ ! -e "$tmp/eval" ] || fail "evaluation only created --out-dir"
else
  fail "evaluation only (--max-steps 0) failed"; cat "$tmp/eval.log"
fi

# 2. A second run into the same directory with --overwrite (without it: refused, see
# out_dir_ownership.sh) deletes the first run's checkpoints and starts metrics.jsonl anew;
# validation at the last step.
if "$bin" --init-from "$ref/model.bin" --train-data "$ref/train.bin" --val-data "$tmp/val.bin" \
    --batch-size 2 --seq-len 32 --max-steps 2 --lr-schedule wsd --warmup-steps 0 --val-every 5 --val-steps 1 \
    --out-dir "$run1" --overwrite >"$tmp/run2.log" 2>&1; then
  check_metrics "$run1" 2 5 6e-4 0 0.1 wsd || fail "rerun: metrics.jsonl was not truncated or is wrong"
else
  fail "rerun exited non-zero"; cat "$tmp/run2.log"
fi

# 3. Gradient accumulation: 2 micro-batches of B=2 equal one batch of B=4 (same tokens, fp32).
for variant in "4 64" "2 64"; do
  read -r b total <<<"$variant"
  "$bin" --init-from "$ref/model.bin" --train-data "$ref/train.bin" --dtype fp32 --shuffle 0 --val-every 0 \
    --batch-size "$b" --seq-len 16 --total-batch-tokens "$total" --max-steps 4 --lr 1e-3 --lr-schedule linear \
    --warmup-steps 1 --out-dir "$tmp/accum$b" >"$tmp/accum$b.log" 2>&1 || { fail "accumulation run B=$b failed"; cat "$tmp/accum$b.log"; }
done
grep -q '2 accumulation step' "$tmp/accum2.log" || fail "B=2 run does not report 2 accumulation steps"
"$python" - "$tmp/accum4/metrics.jsonl" "$tmp/accum2/metrics.jsonl" <<'EOF' || fail "accumulated run differs from the big-batch run"
import json, sys
a, b = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
bad = len(a) != 4 or len(b) != 4
for x, y in zip(a, b):
    for key in ("train_loss", "grad_norm", "lr"):
        if abs(x[key] - y[key]) > 2e-5 * abs(x[key]) + 1e-7:
            print(f"  step {x['step']} {key}: B=4 {x[key]} vs B=2 x 2 {y[key]}"); bad = True
sys.exit(1 if bad else 0)
EOF

# 4. Random init of a preset on GPT-2-vocabulary tokens; a JSON config supplies some flags.
"$python" - "$tmp/gpt2_train_000.bin" <<'EOF'
import struct, random, sys
random.seed(7); n = 3000
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
    f.write(struct.pack(f"<{n}H", *[random.randrange(50257) for _ in range(n)]))
EOF
printf '{"model": "nano", "batch-size": 2, "seq-len": 32, "lr-schedule": "linear", "val-steps": 1}\n' >"$tmp/run.json"
if "$bin" --config "$tmp/run.json" --train-data "$tmp/gpt2_train_000.bin" --val-data "$tmp/gpt2_train_000.bin" \
    --max-steps 3 --warmup-steps 1 --lr 3e-4 --val-every 2 --out-dir "$tmp/nano" >"$tmp/nano.log" 2>&1; then
  check_metrics "$tmp/nano" 3 2 3e-4 1 0.1 linear || fail "nano run: metrics.jsonl"
  [ "$(model_header "$tmp/nano/model.bin")" = "20240326 5 128 50257 2 4 64 50304" ] ||
    fail "nano run: model.bin header $(model_header "$tmp/nano/model.bin")"
  "$python" -c 'import json,sys; l=json.loads(open(sys.argv[1]).readline())["train_loss"]; sys.exit(0 if abs(l-10.83)<0.1 else 1)' \
    "$tmp/nano/metrics.jsonl" || fail "nano run: step-1 loss is not ~ln(50257) = 10.83 for a fresh init"
else
  fail "nano run exited non-zero"; cat "$tmp/nano.log"
fi

# 5. Start-up warnings: warm-up as long as the run, more validation batches than the data holds
# (641 tokens: 10 batches of 2 x 32), more than 64 accumulation steps. The --out-dir cannot be
# created, so the run stops right after them.
if "$bin" --init-from "$ref/model.bin" --train-data "$ref/train.bin" --val-data "$tmp/val.bin" --batch-size 2 \
    --seq-len 32 --max-steps 20 --val-steps 11 --total-batch-tokens $((65 * 64)) --out-dir /proc/self/none \
    >"$tmp/warn.log" 2>"$tmp/warn.err"; then
  fail "the run into /proc/self/none succeeded"
else
  for w in "--warmup-steps 100 >= --max-steps 20: the whole run is warm-up (the learning rate rises every step and never decays)" \
      "--total-batch-tokens 4160 means 65 accumulation steps of batch-size x seq-len x ranks per optimizer step (more than 64; a larger --batch-size takes fewer)" \
      "--val-steps 11 > the 10 distinct batches of 2 x 32 tokens per rank in --val-data: each validation repeats batches"; do
    grep -qxF -- "warning: $w" "$tmp/warn.err" || fail "no warning '$w' in: $(cat "$tmp/warn.err")"
  done
  [ "$(grep -c '^warning: ' "$tmp/warn.err")" -eq 3 ] || fail "expected 3 warnings: $(cat "$tmp/warn.err")"
fi

# README's CPU example: no warning, and it can run twice (shortened here to 2 steps).
mapfile -d '' -t example < <("$python" - README.md <<'EOF'
import shlex, sys
text = open(sys.argv[1]).read().replace("\\\n", " ")
line = next(l for l in text.splitlines() if l.startswith("./train_gpt_cpu --model nano"))
sys.stdout.write("".join(arg + "\0" for arg in shlex.split(line.split("#")[0])[1:]))
EOF
)
with_flags example --out-dir /proc/self/none
if "$bin" "${flags[@]}" >"$tmp/example.log" 2>&1; then
  fail "README's example into /proc/self/none succeeded"
elif grep -q warning "$tmp/example.log" || ! grep -q "^error: --out-dir /proc/self/none: cannot create" "$tmp/example.log"; then
  fail "README's CPU example (${example[*]}): $(grep -E 'warning|error' "$tmp/example.log")"
fi
with_flags example --max-steps 2 --warmup-steps 1 --val-every 0 --out-dir "$tmp/example"
for round in 1 2; do
  "$bin" "${flags[@]}" >"$tmp/example$round.log" 2>&1 || { fail "README's CPU example, run $round, failed"; tail -n 3 "$tmp/example$round.log"; }
done
grep -q "nothing to train" "$tmp/example2.log" || fail "README's CPU example, run 2: $(tail -n 2 "$tmp/example2.log")"

# 6. --save-dtype fp32: a bf16 run's final model file in fp32 (version 3), the same values as the
# bf16 model file of its checkpoint; it loads again (--init-from) to the same validation loss.
fp32out=$tmp/save_fp32
if "$bin" --init-from "$ref/model.bin" --train-data "$ref/train.bin" --val-data "$tmp/val.bin" --batch-size 2 \
    --seq-len 32 --max-steps 2 --warmup-steps 1 --val-every 2 --val-steps 2 --save-dtype fp32 --out-dir "$fp32out" \
    >"$fp32out.log" 2>&1; then
  [ "$(model_header "$fp32out/model.bin")" = "20240326 3 64 500 2 4 64 512" ] ||
    fail "--save-dtype fp32: header $(model_header "$fp32out/model.bin") (expected version 3)"
  "$python" - "$fp32out/model.bin" "$fp32out/checkpoint_00000002/model.bin" <<'EOF' || fail "--save-dtype fp32: values differ from the bf16 checkpoint's"
import struct, sys
wide, narrow = open(sys.argv[1], "rb").read()[1024:], open(sys.argv[2], "rb").read()[1024:]
n = len(narrow) // 2
widened = struct.pack(f"<{n}I", *[b << 16 for b in struct.unpack(f"<{n}H", narrow)])
sys.exit(0 if wide == widened else 1)
EOF
  val2=$("$python" -c 'import json,sys; print("%.6f" % [json.loads(l) for l in open(sys.argv[1])][-1]["val_loss"])' "$fp32out/metrics.jsonl")
  # (evaluation only into a directory with checkpoints: it writes nothing, so it is no second run there)
  "$bin" --init-from "$fp32out/model.bin" --train-data "$ref/train.bin" --val-data "$tmp/val.bin" --batch-size 2 \
    --seq-len 32 --max-steps 0 --val-steps 2 --out-dir "$fp32out" >"$tmp/eval_fp32.log" 2>&1
  grep -q "^val loss $val2 " "$tmp/eval_fp32.log" || fail "the fp32 model file evaluates to $(tail -n 1 "$tmp/eval_fp32.log"), the run had $val2"
else
  fail "--save-dtype fp32 run failed"; cat "$fp32out.log"
fi

# --save 0: the same steps, nothing but metrics.jsonl on disk.
nosave=$tmp/nosave
if "$bin" --init-from "$ref/model.bin" --train-data "$ref/train.bin" --val-data "$ref/train.bin" --batch-size 2 \
     --seq-len 32 --max-steps 2 --val-every 0 --save 0 --out-dir "$nosave" > "$nosave.log" 2>&1 &&
   "$bin" --init-from "$ref/model.bin" --train-data "$ref/train.bin" --val-data "$ref/train.bin" --batch-size 2 \
     --seq-len 32 --max-steps 2 --val-every 0 --out-dir "$nosave-saved" > "$nosave-saved.log" 2>&1; then
  [ "$(cd "$nosave" && find . -type f ! -name .train_gpt.lock | sort | paste -sd ' ')" = "./metrics.jsonl" ] ||
    fail "--save 0 left $(cd "$nosave" && find . -type f | paste -sd ' ') (expected metrics.jsonl alone)"
  grep -q '^disk: --save 0: only metrics.jsonl is written$' "$nosave.log" || fail "--save 0: no 'disk: --save 0' line"
  "$python" -c 'import json, sys
a, b = ([(r["train_loss"], r["grad_norm"]) for r in map(json.loads, open(p))] for p in sys.argv[1:3])
sys.exit(0 if a == b and len(a) == 2 else 1)' "$nosave/metrics.jsonl" "$nosave-saved/metrics.jsonl" ||
    fail "--save 0 changed the steps' losses or norms"
else
  fail "--save 0 run failed: $(tail -n 2 "$nosave.log")"
fi

[ "$failures" -eq 0 ] && echo "cli_train: all checks passed"
[ "$failures" -eq 0 ]
