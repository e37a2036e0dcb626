#!/usr/bin/env bash
# One run per --out-dir, and nothing in it lost or mixed up:
#   - a second run into a directory a running run holds stops with an error naming the holder's
#     pid, and leaves the first run's metrics.jsonl alone; the lock of a killed run is no lock;
#   - a resume that finds a damaged metrics.jsonl line says which line it drops;
#   - the free-space check counts every checkpoint on disk at once (--checkpoint-every with
#     --keep-checkpoints, --keep-every), so a run that could never keep them fails before training.
# usage: out_dir.sh cpu|gpu
set -u
# shellcheck source=test/checks/lib/trainer.sh
source "$(dirname "$0")/lib/trainer.sh" "$@"
require_files "$bin" "$ref/model.bin" "$ref/train.bin"

common=(--init-from "$ref/model.bin" --train-data "$ref/train.bin" --val-data "$ref/train.bin" --batch-size 2
        --seq-len 32 --lr 2e-3 --warmup-steps 2 --val-every 2 --val-steps 1)

# ---- the lock
out=$tmp/shared
"$bin" "${common[@]}" --max-steps 1000 --out-dir "$out" >"$tmp/first.log" 2>&1 &
first=$!
wait_for_steps "$out" 1 || fail "the first run did not start"
if "$bin" "${common[@]}" --max-steps 3 --out-dir "$out" >"$tmp/second.log" 2>"$tmp/second.err"; then
  fail "a second run into an --out-dir in use exited 0"
else
  [ "$(cat "$tmp/second.err")" = "error: --out-dir: $out is in use by another run (pid $first on $(hostname); lock file $out/.train_gpt.lock): wait for it to end or choose another --out-dir" ] ||
    fail "in-use message: $(cat "$tmp/second.err")"
  ! grep -q '^step ' "$tmp/second.log" || fail "the second run trained"
fi
kill -KILL "$first"
wait "$first" 2>/dev/null
"$python" - "$out/metrics.jsonl" <<'EOF' || fail "the first run's metrics.jsonl was disturbed"
import json, sys
steps = [json.loads(l)["step"] for l in open(sys.argv[1]) if "train_loss" in l]
sys.exit(0 if steps == list(range(1, len(steps) + 1)) else 1)
EOF
# The killed run's lock file stays and locks nothing: a requeued start (--resume auto; the killed
# run wrote no checkpoint, so it starts afresh) takes the directory.
if "$bin" "${common[@]}" --max-steps 2 --resume auto --out-dir "$out" >"$tmp/third.log" 2>&1; then
  [ "$(grep -c train_loss "$out/metrics.jsonl")" -eq 2 ] || fail "the run after the killed one: metrics.jsonl"
else
  fail "the lock of a killed run stopped the next run"; tail -n 1 "$tmp/third.log"
fi

# ---- a damaged metrics.jsonl line on resume: dropped, and said so
res=$tmp/resume
"$bin" "${common[@]}" --max-steps 4 --checkpoint-every 2 --out-dir "$res" >"$res.log" 2>&1 || { fail "run to resume failed"; cat "$res.log"; }
sed -i '2s/.*/{"step": 1, "val_lo/' "$res/metrics.jsonl"
if "$bin" "${common[@]}" --max-steps 6 --checkpoint-every 2 --resume auto --out-dir "$res" >"$res.again.log" 2>"$res.again.err"; then
  grep -qx "warning: --resume: $res/metrics.jsonl line 2: not a metrics record, dropped: '{\"step\": 1, \"val_lo'" \
    "$res.again.err" || fail "no warning naming the damaged line: $(cat "$res.again.err")"
  [ "$(grep -c . "$res/metrics.jsonl")" -eq 8 ] || fail "metrics.jsonl after the resume: $(cat "$res/metrics.jsonl")"
else
  fail "resume with a damaged metrics line failed"; cat "$res.again.err"
fi

# ---- free space for the checkpoints on disk at once (one of the tiny model's is about 1.9 MiB)
# expect_no_room DESCRIPTION TEXT FLAGS...: refused before the first step, naming TEXT.
expect_no_room() {
  local what=$1 text=$2
  shift 2
  rm -rf "$tmp/room"
  if timeout 60 "$bin" "${common[@]}" "$@" --out-dir "$tmp/room" >"$tmp/room.log" 2>&1; then
    fail "$what: accepted"
  else
    grep -qE "^error: --out-dir: $tmp/room: [0-9.]+ MiB free, $text and the final model file need [0-9.]+ MiB \(free space or choose another --out-dir\)$" \
      "$tmp/room.log" || fail "$what: $(tail -n 1 "$tmp/room.log")"
    ! grep -q '^step ' "$tmp/room.log" || fail "$what: training started"
  fi
}
expect_no_room "every step kept" \
  "2000000000 checkpoint\(s\) of 1.9 MiB at once \(--checkpoint-every 1, --keep-checkpoints 0\)" \
  --max-steps 2000000000 --checkpoint-every 1 --keep-checkpoints 0
expect_no_room "every step kept by --keep-every" \
  "2000000000 checkpoint\(s\) of 1.9 MiB at once \(--checkpoint-every 1, --keep-checkpoints 3, --keep-every 1\)" \
  --max-steps 2000000000 --checkpoint-every 1 --keep-checkpoints 3 --keep-every 1
# Retention deletes an old checkpoint only once the new one is complete: 2 at once for K = 1.
if "$bin" "${common[@]}" --max-steps 3 --checkpoint-every 1 --keep-checkpoints 1 --out-dir "$tmp/keep1" >"$tmp/keep1.log" 2>&1; then
  grep -q '^disk: 2 checkpoint(s) of 1.9 MiB at once (--checkpoint-every 1, --keep-checkpoints 1) and the final model file need 4.' \
    "$tmp/keep1.log" || fail "free-space line: $(grep '^disk' "$tmp/keep1.log")"
  [ "$(cd "$tmp/keep1" && echo checkpoint_*)" = checkpoint_00000003 ] || fail "retention kept $(cd "$tmp/keep1" && echo checkpoint_*)"
else
  fail "a run with room for its checkpoints failed"; cat "$tmp/keep1.log"
fi

[ "$failures" -eq 0 ] && echo "out_dir: all checks passed"
[ "$failures" -eq 0 ]
