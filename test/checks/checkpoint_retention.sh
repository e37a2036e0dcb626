#!/usr/bin/env bash
# Checkpoint retention says "deleted" only for what it deleted: a checkpoint it cannot delete (here
# its manifest.json cannot be unlinked: it is a directory) draws one warning naming the file, and
# since the manifest goes first, nothing of that checkpoint is deleted; the run goes on, and the
# others are deleted as --keep-checkpoints says.
# usage: checkpoint_retention.sh cpu|gpu
set -u
# shellcheck source=test/checks/lib/trainer.sh
source "$(dirname "$0")/lib/trainer.sh" "$@"
require_files "$bin" "$ref/model.bin" "$ref/train.bin"

common=(--train-data "$ref/train.bin" --val-every 0 --batch-size 2 --seq-len 32 --checkpoint-every 1)
run=$tmp/run
"$bin" --init-from "$ref/model.bin" "${common[@]}" --max-steps 2 --keep-checkpoints 0 --out-dir "$run" \
  >"$tmp/first.log" 2>&1 || { fail "the first run failed"; cat "$tmp/first.log"; exit 1; }
stuck=$run/checkpoint_00000001
rm "$stuck/manifest.json"
mkdir -p "$stuck/manifest.json/x"
if "$bin" "${common[@]}" --max-steps 3 --keep-checkpoints 1 --resume "$run/checkpoint_00000002" --out-dir "$run" \
    >"$tmp/second.log" 2>"$tmp/second.err"; then
  ! grep -q "deleted old checkpoint $stuck" "$tmp/second.log" || fail "retention said it deleted $stuck"
  grep -q "^warning: --keep-checkpoints: an old checkpoint was not deleted: $stuck/manifest.json: cannot delete" "$tmp/second.err" ||
    fail "no warning naming $stuck/manifest.json: $(cat "$tmp/second.err")"
  { [ -f "$stuck/model.bin" ] && [ -f "$stuck/state_r00000.bin" ]; } || fail "files of $stuck were deleted: $(cd "$stuck" && echo *)"
  grep -q "deleted old checkpoint $run/checkpoint_00000002" "$tmp/second.log" || fail "checkpoint_00000002 was not deleted"
  [ ! -e "$run/checkpoint_00000002" ] || fail "checkpoint_00000002 is still there"
else
  fail "the run with an undeletable old checkpoint failed: $(cat "$tmp/second.err")"
fi

[ "$failures" -eq 0 ] && echo "checkpoint_retention: all checks passed"
[ "$failures" -eq 0 ]
