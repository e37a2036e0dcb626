#!/usr/bin/env bash
# --profile N trains N steps in place of --max-steps, so on a run with history (--resume auto or a
# checkpoint) it would change that history (learning-rate schedule, checkpoints, model.bin): it is
# refused in one line and the --out-dir is left as it was.
# usage: profile_history.sh cpu|gpu
set -u
# shellcheck source=test/checks/lib/trainer.sh
source "$(dirname "$0")/lib/trainer.sh" "$@"
require_files "$bin" "$ref/model.bin" "$ref/train.bin"

common=(--train-data "$ref/train.bin" --val-every 0 --batch-size 2 --seq-len 32)

"$bin" --init-from "$ref/model.bin" "${common[@]}" --max-steps 3 --checkpoint-every 1 --out-dir "$tmp/run" \
  >"$tmp/run.log" 2>&1 || { fail "the run failed"; cat "$tmp/run.log"; exit 1; }
before=$(tree_digest "$tmp/run")
for resume in auto "$tmp/run/checkpoint_00000002"; do
  if "$bin" "${common[@]}" --profile 2 --resume "$resume" --out-dir "$tmp/run" >"$tmp/p.log" 2>"$tmp/p.err"; then
    fail "--profile 2 --resume $resume: exited 0"
  else
    { [ "$(wc -l <"$tmp/p.err")" -eq 1 ] &&
      grep -q "^error: --profile N trains N steps in place of --max-steps, which would change the history --resume continues" "$tmp/p.err"; } ||
      fail "--profile 2 --resume $resume: $(cat "$tmp/p.err")"
  fi
  [ "$(tree_digest "$tmp/run")" = "$before" ] || fail "--profile 2 --resume $resume changed the --out-dir"
done

[ "$failures" -eq 0 ] && echo "profile_history: all checks passed"
[ "$failures" -eq 0 ]
