#!/usr/bin/env bash
# Exact resume (docs/CHECKPOINTS.md): for bf16 and fp32 with shuffling on, a 12-step run equals
#   - a run killed (SIGKILL) after its step-4 checkpoint, then --resume auto to step 12 under
#     another --seed (the checkpoint's seed is the run's: the bf16 rounding continues its stream), and
#   - a run stopped by SIGTERM or Ctrl-C (SIGINT; bf16) or SIGUSR1 (fp32) mid-run (exit 0,
#     complete checkpoint), then --resume auto:
# every metrics.jsonl record (timing fields aside) and the final model.bin byte for byte. The bf16
# runs also have the z-score guards on (tight, so step 9 is skipped) to show their state resumes.
# Also: the final model.bin loads in a fresh process (--init-from) and gives the run's last
# validation loss exactly; the checkpoint's model.bin is that same file; a fresh run refuses an
# --out-dir with checkpoints; --keep-checkpoints / --keep-every retention; a second Ctrl-C ends a
# run at once (status 130).
# usage: checkpoint_resume.sh cpu|gpu
set -u
# shellcheck source=test/checks/lib/trainer.sh
source "$(dirname "$0")/lib/trainer.sh" "$@"
require_files "$bin" "$ref/model.bin" "$ref/train.bin"

common=(--init-from "$ref/model.bin" --train-data "$ref/train.bin" --val-data "$ref/train.bin" --shuffle 1
        --batch-size 2 --seq-len 32 --max-steps 12 --lr 2e-3 --warmup-steps 3 --val-every 4 --val-steps 2)

# Same records (step, losses, lr, norm, skipped; not ms / tokens_per_s / mfu) in both metrics files.
same_metrics() {
  "$python" - "$1/metrics.jsonl" "$2/metrics.jsonl" <<'EOF'
import json, sys
def load(p):
    return [{k: v for k, v in json.loads(l).items() if k not in ("ms", "tokens_per_s", "mfu")} for l in open(p)]
a, b = load(sys.argv[1]), load(sys.argv[2])
if a != b:
    print(f"  {len(a)} vs {len(b)} records")
    for x, y in zip(a, b):
        if x != y: print(f"  straight {x}\n  resumed  {y}"); break
    sys.exit(1)
EOF
}

# Prefix that runs a command with SIGINT at its default action, as in a terminal (a script's
# background jobs start with it ignored); the command replaces it, so $! is the command's pid.
with_sigint=("$python" -c 'import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])')

# Waits (up to 60 s) until FILE exists.
wait_for() {
  for _ in $(seq 600); do [ -e "$1" ] && return 0; sleep 0.1; done
  return 1
}

for dtype in bf16 fp32; do
  guard=()
  [ "$dtype" = bf16 ] && guard=(--skip-norm-z 0.5 --skip-loss-z 1)
  # The fp32 straight run also checks retention: every 2nd step checkpointed, the newest 2 kept
  # and every 6th for good.
  keep=()
  [ "$dtype" = fp32 ] && keep=(--checkpoint-every 2 --keep-checkpoints 2 --keep-every 6)
  straight=$tmp/$dtype-straight
  if ! "$bin" "${common[@]}" "${guard[@]}" "${keep[@]}" --dtype "$dtype" --out-dir "$straight" >"$straight.log" 2>&1; then
    fail "$dtype straight run failed"; cat "$straight.log"; continue
  fi
  [ -f "$straight/checkpoint_00000012/manifest.json" ] || fail "$dtype: no final checkpoint after the last step"
  if [ "$dtype" = bf16 ]; then
    grep -q '"skipped"' "$straight/metrics.jsonl" || fail "bf16: the z-score guard skipped no step (the test needs one)"
  fi

  # 1. SIGKILL after the step-4 checkpoint is complete, then --resume auto.
  killed=$tmp/$dtype-killed
  "$bin" "${common[@]}" "${guard[@]}" --dtype "$dtype" --checkpoint-every 4 --out-dir "$killed" >"$killed.log" 2>&1 &
  pid=$!
  wait_for "$killed/checkpoint_00000004/manifest.json" || fail "$dtype: no step-4 checkpoint appeared"
  kill -KILL "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null; status=$?
  if [ "$status" -eq 0 ]; then
    # A fast device finished all 12 steps before the kill landed: leave the directory as a kill
    # during the step-8 checkpoint would (no manifest yet), plus later records and a torn line.
    echo "note: $dtype run finished before SIGKILL; recreating the state a kill leaves"
    rm -r "$killed/checkpoint_00000012" "$killed/checkpoint_00000008/manifest.json"
    printf '{"step": 10, "train_lo' >>"$killed/metrics.jsonl"
  fi
  if "$bin" "${common[@]}" "${guard[@]}" --dtype "$dtype" --checkpoint-every 4 --seed 7 --resume auto \
      --out-dir "$killed" >"$killed.resume.log" 2>&1; then
    grep -qE 'resumed from .*checkpoint_0000000[48]: [48] step' "$killed.resume.log" ||
      fail "$dtype: the killed run did not resume from step 4 or 8: $(grep -m1 resumed "$killed.resume.log")"
    same_metrics "$straight" "$killed" || fail "$dtype: killed + resumed metrics differ from the straight run"
    cmp -s "$straight/model.bin" "$killed/model.bin" || fail "$dtype: killed + resumed model.bin differs"
  else
    fail "$dtype: resume after SIGKILL failed"; cat "$killed.resume.log"
  fi

  # 3. SIGTERM and Ctrl-C (bf16) / SIGUSR1 (fp32) mid-run: finishes the step, checkpoints, exits 0;
  # the checkpoint resumes exactly.
  signals="TERM INT"
  [ "$dtype" = fp32 ] && signals=USR1
  for signal in $signals; do
    termed=$tmp/$dtype-$signal
    "${with_sigint[@]}" "$bin" "${common[@]}" "${guard[@]}" --dtype "$dtype" --out-dir "$termed" >"$termed.log" 2>&1 &
    pid=$!
    wait_for_steps "$termed" 3
    kill "-$signal" "$pid"
    wait "$pid"; status=$?
    stopped=$(sed -nE "s/^received SIG$signal: stopped after step ([0-9]+) of 12.*/\\1/p" "$termed.log")
    if [ "$status" -eq 0 ] && [ -z "$stopped" ] && grep -q '^saved ' "$termed.log"; then
      echo "note: $dtype run finished before SIG$signal arrived (fast device); signal case not exercised"
    elif [ "$status" -ne 0 ] || [ -z "$stopped" ]; then
      fail "$dtype: SIG$signal: exit status $status, expected 0 and a 'received SIG$signal' line"; tail -3 "$termed.log"
    elif [ "$stopped" -ge 12 ]; then
      echo "note: $dtype: SIG$signal arrived during the last step (fast device); resume case not exercised"
    else
      ckpt=$(printf '%s/checkpoint_%08d' "$termed" "$stopped")
      [ -f "$ckpt/manifest.json" ] || fail "$dtype: SIG$signal left no complete checkpoint at step $stopped"
      if "$bin" "${common[@]}" "${guard[@]}" --dtype "$dtype" --resume auto --out-dir "$termed" >"$termed.resume.log" 2>&1; then
        grep -q "resumed from $ckpt: $stopped step" "$termed.resume.log" || fail "$dtype: did not resume from $ckpt"
        same_metrics "$straight" "$termed" || fail "$dtype: SIG$signal + resumed metrics differ from the straight run"
        cmp -s "$straight/model.bin" "$termed/model.bin" || fail "$dtype: SIG$signal + resumed model.bin differs"
      else
        fail "$dtype: resume after SIG$signal failed"; cat "$termed.resume.log"
      fi
    fi
  done

  # 4. The saved model in a fresh process: the same validation loss (lr 0 leaves it unchanged).
  cmp -s "$straight/model.bin" "$straight/checkpoint_00000012/model.bin" ||
    fail "$dtype: the checkpoint's model.bin differs from DIR/model.bin"
  if "$bin" --init-from "$straight/checkpoint_00000012/model.bin" --train-data "$ref/train.bin" --val-data "$ref/train.bin" \
      --dtype "$dtype" --batch-size 2 --seq-len 32 --max-steps 1 --lr 0 --val-every 1 --val-steps 2 \
      --out-dir "$tmp/$dtype-reload" >"$tmp/$dtype-reload.log" 2>&1; then
    "$python" - "$straight/metrics.jsonl" "$tmp/$dtype-reload/metrics.jsonl" <<'EOF' ||
import json, sys
last = [json.loads(l)["val_loss"] for l in open(sys.argv[1]) if "val_loss" in l][-1]
again = [json.loads(l)["val_loss"] for l in open(sys.argv[2]) if "val_loss" in l][0]
if last != again: print(f"  trained run {last!r}, reloaded {again!r}"); sys.exit(1)
EOF
      fail "$dtype: the reloaded model's validation loss differs"
  else
    fail "$dtype: --init-from the checkpoint's model.bin failed"; cat "$tmp/$dtype-reload.log"
  fi
done

# A second Ctrl-C does not wait for the step: the run ends at once, killed by SIGINT (status 130).
# (16 micro-batches per step leave time to press it twice.)
twice=$tmp/int-twice
"${with_sigint[@]}" "$bin" "${common[@]}" --total-batch-tokens 1024 --out-dir "$twice" >"$twice.log" 2>&1 &
pid=$!
wait_for_steps "$twice" 1
kill -INT "$pid"
for _ in $(seq 500); do grep -q '^SIGINT: stopping' "$twice.log" && break; sleep 0.02; done
kill -INT "$pid" 2>/dev/null
wait "$pid"; status=$?
if [ "$status" -eq 0 ] && grep -q '^received SIGINT' "$twice.log"; then
  echo "note: the run stopped before the second Ctrl-C (fast device); not exercised"
elif [ "$status" -ne 130 ]; then
  fail "two Ctrl-C: exit status $status, expected 130"; tail -3 "$twice.log"
else
  grep -q "^SIGINT: stopping after this step with a checkpoint (Ctrl-C again: stop at once)" "$twice.log" ||
    fail "the first Ctrl-C did not say what it does: $(tail -3 "$twice.log")"
fi

# A fresh run into a directory with checkpoints is refused, naming the way out; nothing changes.
before=$(cat "$tmp/fp32-straight/metrics.jsonl")
if "$bin" "${common[@]}" --dtype fp32 --out-dir "$tmp/fp32-straight" >"$tmp/refuse.log" 2>&1; then
  fail "a fresh run into an --out-dir with checkpoints was not refused"
else
  grep -q 'holds checkpoints .*of another run: continue it with --resume auto' "$tmp/refuse.log" ||
    fail "refusal message: $(cat "$tmp/refuse.log")"
  [ "$before" = "$(cat "$tmp/fp32-straight/metrics.jsonl")" ] || fail "the refused run changed metrics.jsonl"
fi

kept=$(cd "$tmp/fp32-straight" && echo checkpoint_*)
[ "$kept" = "checkpoint_00000006 checkpoint_00000010 checkpoint_00000012" ] || fail "retention kept: $kept"

[ "$failures" -eq 0 ] && echo "checkpoint_resume: all checks passed"
[ "$failures" -eq 0 ]
