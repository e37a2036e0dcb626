#!/usr/bin/env bash
# A requeued job recovers on its own: --resume auto moves incomplete checkpoint directories (no
# manifest: a crash while the checkpoint was written) aside, unchanged, into OUT/abandoned_*/ and
#   - continues from the newest complete checkpoint, saying which it skipped; or
#   - with none complete (a crash during the first checkpoint), starts afresh, saying so, with the
#     earlier attempt's metrics.jsonl aside too;
# while checkpoints that are damaged (a manifest that does not verify) still stop it (see
# out_dir_ownership.sh).
# usage: resume_incomplete.sh cpu|gpu
set -u
# shellcheck source=test/checks/lib/trainer.sh
source "$(dirname "$0")/lib/trainer.sh" "$@"
require_files "$bin" "$ref/model.bin" "$ref/train.bin"

common=(--init-from "$ref/model.bin" --train-data "$ref/train.bin" --val-every 0 --batch-size 2 --seq-len 32
        --checkpoint-every 1)

# ---- only incomplete checkpoints: an empty one and one cut short before its manifest
out=$tmp/first
"$bin" "${common[@]}" --max-steps 1 --out-dir "$out" >"$tmp/seed.log" 2>&1 || { fail "the first run failed"; exit 1; }
rm "$out/checkpoint_00000001/manifest.json" "$out/model.bin"
mkdir "$out/checkpoint_00000002"
partial=$(tree_digest "$out/checkpoint_00000001")
if "$bin" "${common[@]}" --max-steps 2 --resume auto --out-dir "$out" >"$tmp/first.log" 2>"$tmp/first.err"; then
  grep -q "^--resume auto: no complete checkpoint in $out; starting from scratch" "$tmp/first.log" ||
    fail "the fresh start did not say so: $(grep -m1 'resume' "$tmp/first.log")"
  aside=("$out"/abandoned_*)
  { [ -d "${aside[0]}/checkpoint_00000002" ] && [ "$(tree_digest "${aside[0]}/checkpoint_00000001")" = "$partial" ] &&
    [ -f "${aside[0]}/metrics.jsonl" ]; } ||
    fail "the incomplete checkpoints and metrics.jsonl were not moved aside whole: $(cd "$out" && echo * abandoned_*/*)"
  [ "$(train_steps "$out")" = "1 2" ] || fail "fresh start: metrics.jsonl steps $(train_steps "$out")"
  [ -f "$out/checkpoint_00000002/manifest.json" ] || fail "fresh start: no complete checkpoint_00000002"
else
  fail "--resume auto with only incomplete checkpoints failed: $(cat "$tmp/first.err")"
fi

# ---- a complete checkpoint under an incomplete newer one
out=$tmp/second
"$bin" "${common[@]}" --max-steps 2 --out-dir "$out" >"$tmp/seed2.log" 2>&1 || { fail "the second run failed"; exit 1; }
mkdir "$out/checkpoint_00000003"
if "$bin" "${common[@]}" --max-steps 3 --resume auto --out-dir "$out" >"$tmp/second.log" 2>"$tmp/second.err"; then
  grep -q "^resumed from $out/checkpoint_00000002:" "$tmp/second.log" || fail "did not resume from checkpoint_00000002"
  grep -q "warning: --resume auto: skipping $out/checkpoint_00000003: no manifest.json" "$tmp/second.err" ||
    fail "the skipped incomplete checkpoint was not named: $(cat "$tmp/second.err")"
  [ "$(train_steps "$out")" = "1 2 3" ] || fail "after the resume: metrics.jsonl steps $(train_steps "$out")"
else
  fail "--resume auto past an incomplete checkpoint failed: $(cat "$tmp/second.err")"
fi

[ "$failures" -eq 0 ] && echo "resume_incomplete: all checks passed"
[ "$failures" -eq 0 ]
