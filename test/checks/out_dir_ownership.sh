#!/usr/bin/env bash
# An --out-dir's contents belong to the run that wrote them: a later command adds to its history or
# refuses, and never truncates, overwrites or deletes what another or an earlier run wrote unless
# --overwrite says so:
#   - a fresh run into an --out-dir holding another run's model.bin and metrics.jsonl refuses
#     (--overwrite: replaces them); --init-from the --out-dir's own model.bin refuses even with
#     --overwrite, however the path is spelled (resolved path and inode);
#   - --resume auto with checkpoints present but none usable stops naming each and why, and leaves
#     the directory as it was; one that passes over a damaged newer checkpoint moves it aside whole
#     (not replaced); with no checkpoint at all it starts afresh and moves the earlier attempt's
#     metrics.jsonl aside, unchanged;
#   - a rewind (--resume DIR/checkpoint_S with later checkpoints, here through a symlinked path)
#     moves the later checkpoints and the later model.bin (byte for byte) aside into
#     DIR/abandoned_*/, so --resume auto never continues the abandoned branch, and metrics.jsonl
#     shows one history;
#   - --resume of another --out-dir's checkpoint into an --out-dir holding a run of its own refuses
#     (--overwrite: that run's checkpoints are deleted).
# usage: out_dir_ownership.sh cpu|gpu
set -u
# shellcheck source=test/checks/lib/trainer.sh
source "$(dirname "$0")/lib/trainer.sh" "$@"
require_files "$bin" "$ref/model.bin" "$ref/train.bin"

common=(--train-data "$ref/train.bin" --val-data "$ref/train.bin" --batch-size 2 --seq-len 32 --lr 2e-3
        --warmup-steps 2 --val-every 2 --val-steps 1)
init=(--init-from "$ref/model.bin")


"$bin" --help | grep -q -- '--overwrite' || fail "--help does not list --overwrite"

# ---- a fresh run into another run's --out-dir
"$bin" "${init[@]}" "${common[@]}" --max-steps 2 --out-dir "$tmp/first" >"$tmp/first.log" 2>&1 ||
  { fail "the first run failed"; cat "$tmp/first.log"; exit 1; }
mkdir -p "$tmp/taken"
cp "$tmp/first/model.bin" "$tmp/first/metrics.jsonl" "$tmp/taken/"
before=$(tree_digest "$tmp/taken")
expect_refused "fresh run over another run's files" \
  "^error: --out-dir $tmp/taken holds metrics.jsonl and model.bin of another run: .*--overwrite" \
  "${init[@]}" "${common[@]}" --max-steps 3 --out-dir "$tmp/taken"
[ "$(tree_digest "$tmp/taken")" = "$before" ] || fail "the refused fresh run changed $tmp/taken"
if "$bin" "${init[@]}" "${common[@]}" --max-steps 3 --overwrite --out-dir "$tmp/taken" >"$tmp/over.log" 2>&1; then
  [ "$(train_steps "$tmp/taken")" = "1 2 3" ] || fail "--overwrite: metrics.jsonl steps $(train_steps "$tmp/taken")"
else
  fail "--overwrite was refused"; tail -n 3 "$tmp/over.log"
fi

# ---- --init-from the --out-dir's own model.bin: an input, refused even with --overwrite
mkdir -p "$tmp/own"
cp "$ref/model.bin" "$tmp/own/model.bin"
ln -s "$tmp/own" "$tmp/own_link"
for overwrite in 0 1; do
  extra=()
  [ "$overwrite" -eq 0 ] || extra=(--overwrite)
  expect_refused "--init-from OUT/model.bin ${extra[*]}" \
    "^error: --init-from $tmp/own_link/model.bin is --out-dir's model.bin, which this run writes" \
    --init-from "$tmp/own_link/model.bin" "${common[@]}" --max-steps 1 --out-dir "$tmp/own" "${extra[@]}"
done
cmp -s "$ref/model.bin" "$tmp/own/model.bin" || fail "--init-from OUT/model.bin: the model file changed"

# ---- --resume auto: checkpoints present, none usable
"$bin" "${init[@]}" "${common[@]}" --max-steps 4 --checkpoint-every 2 --out-dir "$tmp/broken" >"$tmp/broken.log" 2>&1 ||
  { fail "the run to damage failed"; cat "$tmp/broken.log"; exit 1; }
state4=$tmp/broken/checkpoint_00000004/state_r00000.bin
truncate -s $(($(stat -c %s "$state4") - 8)) "$state4"
sed -i 's/"version": 1/"version": 2/' "$tmp/broken/checkpoint_00000002/manifest.json"
before=$(tree_digest "$tmp/broken")
expect_refused "--resume auto, no usable checkpoint" \
  "^error: --resume auto: $tmp/broken holds checkpoints but none is complete: $tmp/broken/checkpoint_00000004: state_r00000.bin has [0-9]+ bytes.*; $tmp/broken/checkpoint_00000002: manifest.json is not a valid manifest \(version 2, expected 1\)" \
  "${init[@]}" "${common[@]}" --max-steps 6 --checkpoint-every 2 --resume auto --out-dir "$tmp/broken"
[ "$(tree_digest "$tmp/broken")" = "$before" ] || fail "--resume auto without a usable checkpoint changed $tmp/broken"
# With checkpoint_00000002 usable again, --resume auto continues from it; the damaged (newer)
# checkpoint_00000004 is moved aside whole, not replaced by the new run's checkpoint of step 4.
sed -i 's/"version": 2/"version": 1/' "$tmp/broken/checkpoint_00000002/manifest.json"
damaged=$(tree_digest "$tmp/broken/checkpoint_00000004")
if "$bin" "${init[@]}" "${common[@]}" --max-steps 4 --checkpoint-every 2 --resume auto --out-dir "$tmp/broken" \
    >"$tmp/broken.again.log" 2>&1; then
  aside=("$tmp"/broken/abandoned_*/checkpoint_00000004)
  { [ -d "${aside[0]}" ] && [ "$(tree_digest "${aside[0]}")" = "$damaged" ]; } ||
    fail "the damaged checkpoint_00000004 was not moved aside whole: $(ls "$tmp/broken")"
  [ "$(train_steps "$tmp/broken")" = "1 2 3 4" ] || fail "after passing over the damaged checkpoint: metrics steps $(train_steps "$tmp/broken")"
else
  fail "--resume auto past a damaged checkpoint failed"; tail -n 3 "$tmp/broken.again.log"
fi

# ---- --resume auto without any checkpoint: a fresh start; the earlier attempt's metrics moved aside
mkdir -p "$tmp/attempt"
cp "$tmp/first/metrics.jsonl" "$tmp/attempt/"
if "$bin" "${init[@]}" "${common[@]}" --max-steps 1 --resume auto --out-dir "$tmp/attempt" >"$tmp/attempt.log" 2>&1; then
  moved=("$tmp"/attempt/abandoned_*/metrics.jsonl)
  cmp -s "${moved[0]}" "$tmp/first/metrics.jsonl" || fail "the earlier attempt's metrics.jsonl was not moved aside whole"
  [ "$(train_steps "$tmp/attempt")" = "1" ] || fail "fresh start: metrics.jsonl steps $(train_steps "$tmp/attempt")"
else
  fail "--resume auto without checkpoints failed"; tail -n 3 "$tmp/attempt.log"
fi

# ---- a rewind, named through a symlink to the --out-dir
run=$tmp/rewind
"$bin" "${init[@]}" "${common[@]}" --max-steps 6 --checkpoint-every 2 --out-dir "$run" >"$run.log" 2>&1 ||
  { fail "the run to rewind failed"; cat "$run.log"; exit 1; }
ln -s "$run" "$tmp/rewind_link"
digest6=$(tree_digest "$run/checkpoint_00000006")
cp "$run/model.bin" "$tmp/model6.bin"
with_flags common --lr 1e-3  # new settings from step 2 on
if "$bin" "${flags[@]}" --max-steps 3 --checkpoint-every 2 --resume "$tmp/rewind_link/checkpoint_00000002" \
    --out-dir "$run" >"$run.rewind.log" 2>&1; then
  [ "$(cd "$run" && echo checkpoint_*)" = "checkpoint_00000002 checkpoint_00000003" ] ||
    fail "after the rewind: $(cd "$run" && echo checkpoint_*)"
  aside=("$run"/abandoned_*/checkpoint_00000006)
  { [ -d "${aside[0]}" ] && [ "$(tree_digest "${aside[0]}")" = "$digest6" ]; } ||
    fail "the abandoned checkpoint_00000006 was not moved aside whole: $(ls "$run")"
  aside=("$run"/abandoned_*/model.bin)
  cmp -s "${aside[0]}" "$tmp/model6.bin" || fail "the abandoned branch's model.bin is not under abandoned_*/ as it was"
  grep -q "abandoned" "$run.rewind.log" || fail "the rewind did not say where the later checkpoints went"
  [ "$(train_steps "$run")" = "1 2 3" ] || fail "after the rewind: metrics.jsonl steps $(train_steps "$run")"
else
  fail "the rewind failed"; tail -n 3 "$run.rewind.log"
fi
if "$bin" "${common[@]}" --max-steps 5 --checkpoint-every 2 --resume auto --out-dir "$run" >"$run.auto.log" 2>&1; then
  grep -q "^resumed from $run/checkpoint_00000003:" "$run.auto.log" ||
    fail "--resume auto after the rewind: $(grep -m1 'resumed\|already' "$run.auto.log")"
  [ "$(train_steps "$run")" = "1 2 3 4 5" ] || fail "after the rewind and resume: metrics.jsonl steps $(train_steps "$run")"
else
  fail "--resume auto after the rewind failed"; tail -n 3 "$run.auto.log"
fi

# ---- another --out-dir's checkpoint into an --out-dir that holds a run of its own
"$bin" "${init[@]}" "${common[@]}" --seed 5 --max-steps 4 --checkpoint-every 2 --out-dir "$tmp/other" \
  >"$tmp/other.log" 2>&1 || { fail "the other run failed"; cat "$tmp/other.log"; }
before=$(tree_digest "$tmp/other")
expect_refused "--resume of a foreign checkpoint into a run's --out-dir" \
  "^error: --out-dir $tmp/other holds checkpoints .*of another run: .*--overwrite" \
  "${common[@]}" --max-steps 4 --checkpoint-every 2 --resume "$run/checkpoint_00000004" \
  --out-dir "$tmp/other"
[ "$(tree_digest "$tmp/other")" = "$before" ] || fail "the refused resume changed $tmp/other"
# --overwrite: the other run's checkpoints are deleted, its metrics.jsonl started anew.
if "$bin" "${common[@]}" --max-steps 5 --resume "$run/checkpoint_00000004" --out-dir "$tmp/other" --overwrite \
    >"$tmp/other.over.log" 2>&1; then
  [ "$(cd "$tmp/other" && echo checkpoint_*)" = checkpoint_00000005 ] ||
    fail "--overwrite left $(cd "$tmp/other" && echo checkpoint_*)"
  [ "$(train_steps "$tmp/other")" = "5" ] || fail "--overwrite: metrics.jsonl steps $(train_steps "$tmp/other")"
else
  fail "--resume of a foreign checkpoint with --overwrite failed"; tail -n 3 "$tmp/other.over.log"
fi

[ "$failures" -eq 0 ] && echo "out_dir_ownership: all checks passed"
[ "$failures" -eq 0 ]
