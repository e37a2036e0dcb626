#!/usr/bin/env bash
# A checkpoint is never an --out-dir to write into or to delete: a run that trains refuses, in one
# line that says it is a checkpoint, and changes nothing,
#   - an --out-dir that is a checkpoint directory (here the one it resumes from, with --overwrite),
#     or lies inside one, however it is spelled (a symlink);
#   - an --overwrite that would delete the --resume source (the checkpoint named through a symlink
#     from outside its --out-dir, so the run looks like a new history there).
# usage: checkpoint_out_dir.sh cpu|gpu
set -u
# shellcheck source=test/checks/lib/trainer.sh
source "$(dirname "$0")/lib/trainer.sh" "$@"
require_files "$bin" "$ref/model.bin" "$ref/train.bin"

common=(--train-data "$ref/train.bin" --val-every 0 --batch-size 2 --seq-len 32)

run=$tmp/run
"$bin" --init-from "$ref/model.bin" "${common[@]}" --max-steps 2 --checkpoint-every 1 --out-dir "$run" \
  >"$tmp/run.log" 2>&1 || { fail "the first run failed"; cat "$tmp/run.log"; exit 1; }
ckpt=$run/checkpoint_00000002
ln -s "$ckpt" "$tmp/ckpt_link"
before=$(tree_digest "$run")

expect_refused "--out-dir = the --resume checkpoint, --overwrite" \
  "^error: --out-dir $ckpt is the checkpoint directory $ckpt, which a run never writes into" \
  "${common[@]}" --max-steps 3 --resume "$ckpt" --out-dir "$ckpt" --overwrite
expect_refused "--out-dir through a symlink to a checkpoint" \
  "^error: --out-dir $tmp/ckpt_link is the checkpoint directory $ckpt," \
  --init-from "$ref/model.bin" "${common[@]}" --max-steps 1 --out-dir "$tmp/ckpt_link"
expect_refused "--out-dir inside a checkpoint" \
  "^error: --out-dir $run/checkpoint_00000001/more is inside the checkpoint directory $run/checkpoint_00000001," \
  --init-from "$ref/model.bin" "${common[@]}" --max-steps 1 --out-dir "$run/checkpoint_00000001/more"
expect_refused "--overwrite deleting the --resume source" \
  "^error: --overwrite would delete --resume's checkpoint $tmp/ckpt_link \(it is $ckpt\)" \
  "${common[@]}" --max-steps 3 --resume "$tmp/ckpt_link" --out-dir "$run" --overwrite
[ "$(tree_digest "$run")" = "$before" ] || fail "a refused run changed $run"

# The checkpoint continued into its own --out-dir still works.
"$bin" "${common[@]}" --max-steps 3 --resume "$ckpt" --out-dir "$run" >"$tmp/cont.log" 2>&1 ||
  { fail "--resume into the checkpoint's --out-dir failed"; tail -n 3 "$tmp/cont.log"; }

[ "$failures" -eq 0 ] && echo "checkpoint_out_dir: all checks passed"
[ "$failures" -eq 0 ]
