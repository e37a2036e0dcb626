#!/usr/bin/env bash
# What a resumed run says about its flags is what it does:
#   - one seed per history: a resume given another --seed uses the checkpoint's everywhere (bf16
#     stochastic rounding, data order, samples), so its model.bin is byte-identical to the
#     uninterrupted run's; it says so in one line ("--seed 7 ignored: resuming uses the
#     checkpoint's seed 1337"), the checkpoints it writes record that seed, and the next resume
#     says nothing about the seed;
#   - --init-from under --resume is said to be ignored; a resume that was not given --init-from
#     says nothing about it; every checkpoint of the history records where the model came from
#     (--init-from's file, "model": "-"), not the unused --model default.
# usage: resume_seed.sh cpu|gpu
set -u
# shellcheck source=test/checks/lib/trainer.sh
source "$(dirname "$0")/lib/trainer.sh" "$@"
require_files "$bin" "$ref/model.bin" "$ref/train.bin"

common=(--train-data "$ref/train.bin" --val-every 0 --batch-size 2 --seq-len 32 --lr 2e-3 --warmup-steps 2
        --checkpoint-every 2 --dtype bf16)
# manifest_value KEY MANIFEST: the flag KEY as MANIFEST's configuration records it.
manifest_value() { "$python" -c 'import json, sys; print(json.load(open(sys.argv[2]))["config"][sys.argv[1]])' "$@"; }

"$bin" --init-from "$ref/model.bin" "${common[@]}" --max-steps 4 --out-dir "$tmp/whole" >"$tmp/whole.log" 2>&1 ||
  { fail "the uninterrupted run failed"; cat "$tmp/whole.log"; exit 1; }
"$bin" --init-from "$ref/model.bin" "${common[@]}" --max-steps 2 --out-dir "$tmp/parts" >"$tmp/first.log" 2>&1 ||
  { fail "the first part failed"; cat "$tmp/first.log"; exit 1; }
if "$bin" "${common[@]}" --max-steps 4 --seed 7 --init-from "$ref/model.bin" --resume auto --out-dir "$tmp/parts" \
    >"$tmp/second.log" 2>"$tmp/second.err"; then
  grep -qx "warning: --seed 7 ignored: resuming uses the checkpoint's seed 1337" "$tmp/second.err" ||
    fail "the resume under --seed 7 did not say it kept seed 1337: $(grep seed "$tmp/second.err")"
  [ "$(grep -c seed "$tmp/second.err")" -eq 1 ] || fail "more than one line about the seed: $(grep seed "$tmp/second.err")"
  grep -q "^warning: --init-from ignored: --resume takes the model" "$tmp/second.err" ||
    fail "--init-from under --resume was not said to be ignored: $(grep init-from "$tmp/second.err")"
  cmp -s "$tmp/whole/model.bin" "$tmp/parts/model.bin" ||
    fail "the bf16 resume under --seed 7 is not byte-identical to the uninterrupted run"
  [ "$(manifest_value seed "$tmp/parts/checkpoint_00000004/manifest.json")" = 1337 ] ||
    fail "checkpoint_00000004 records seed $(manifest_value seed "$tmp/parts/checkpoint_00000004/manifest.json")"
else
  fail "the resume under --seed 7 failed: $(cat "$tmp/second.err")"
fi
if "$bin" "${common[@]}" --max-steps 5 --resume auto --out-dir "$tmp/parts" >"$tmp/third.log" 2>"$tmp/third.err"; then
  ! grep -q "seed\|init-from" "$tmp/third.err" || fail "the next resume spoke of flags not given: $(grep 'seed\|init-from' "$tmp/third.err")"
  # The model trained is --init-from's all along: no preset is recorded, the history's source is.
  for step in 00000002 00000004 00000005; do
    m=$tmp/parts/checkpoint_$step/manifest.json
    [ "$(manifest_value model "$m")/$(manifest_value init-from "$m")" = "-/$ref/model.bin" ] ||
      fail "checkpoint_$step records --model $(manifest_value model "$m"), --init-from $(manifest_value init-from "$m")"
  done
else
  fail "the next resume failed: $(cat "$tmp/third.err")"
fi

[ "$failures" -eq 0 ] && echo "resume_seed: all checks passed"
[ "$failures" -eq 0 ]
