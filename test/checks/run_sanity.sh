#!/usr/bin/env bash
# Runs that look wrong are stopped or flagged:
#   - a numeric flag the optimizer or sampler uses as fp32 is bounded to what fp32 holds:
#     --lr 1e39 is refused in one line (before: it trained NaN weights and exited 0);
#   - a run whose every update is skipped (here: resumed after a step at --lr 1e30 left weights
#     whose loss is no longer finite) ends with a non-zero status and one error line, and writes
#     no model.bin;
#   - training shards that include the validation shards draw a warning;
#   - a NUL character in a string value (a --config file's "prompt" for --generate) is refused.
# usage: run_sanity.sh cpu|gpu
set -u
# shellcheck source=test/checks/lib/trainer.sh
source "$(dirname "$0")/lib/trainer.sh" "$@"
require_files "$bin" "$ref/model.bin" "$ref/train.bin"

common=(--train-data "$ref/train.bin" --batch-size 2 --seq-len 32)
# expect_refused NAME PATTERN FLAGS...: a non-zero exit with one line on stderr matching PATTERN.
expect_refused() {
  local name=$1 pattern=$2
  shift 2
  if "$bin" "$@" >"$tmp/refused.log" 2>"$tmp/refused.err"; then fail "$name: exited 0"; return; fi
  { [ "$(wc -l <"$tmp/refused.err")" -eq 1 ] && grep -qE "$pattern" "$tmp/refused.err"; } ||
    fail "$name: expected one line matching '$pattern', got: $(cat "$tmp/refused.err")"
}

expect_refused "--lr beyond fp32" "^error: --lr: expected a number >= 0 that fits an fp32 \(at most 3\.40282[0-9]*e\+38\), got '1e39'" \
  --init-from "$ref/model.bin" "${common[@]}" --val-every 0 --max-steps 2 --lr 1e39 --out-dir "$tmp/lr"
[ ! -e "$tmp/lr/model.bin" ] || fail "--lr 1e39 wrote a model"

# --lr 1e30 (finite in fp32): step 1 trains on the given weights and leaves them near 1e30, so every
# later step's loss is non-finite and its update skipped; the resumed run has no update at all.
"$bin" --init-from "$ref/model.bin" --dtype fp32 "${common[@]}" --val-every 0 --lr 1e30 --max-steps 1 --out-dir "$tmp/huge" \
  >"$tmp/huge.log" 2>&1 || { fail "the --lr 1e30 run failed"; tail -n 3 "$tmp/huge.log"; }
rm -f "$tmp/huge/model.bin"
if "$bin" --dtype fp32 "${common[@]}" --val-every 0 --max-steps 3 --lr 1e30 --resume auto --out-dir "$tmp/huge" \
    >"$tmp/huge.log" 2>"$tmp/huge.err"; then
  fail "a run whose every update was skipped exited 0"
else
  grep -q "^updates skipped: 2 (non-finite 2" "$tmp/huge.log" || fail "the resumed run did not skip 2 updates"
  tail -n 1 "$tmp/huge.err" | grep -qE "^error: every update of this run's 2 step\(s\) was skipped .*model.bin was not written" ||
    fail "every update skipped: $(tail -n 1 "$tmp/huge.err")"
fi
[ ! -e "$tmp/huge/model.bin" ] || fail "a run whose every update was skipped wrote model.bin"

if "$bin" --init-from "$ref/model.bin" "${common[@]}" --max-steps 1 --val-data "$ref/train.bin" --val-every 1 \
    --val-steps 1 --out-dir "$tmp/shared" >"$tmp/shared.log" 2>"$tmp/shared.err"; then
  grep -q "^warning: --train-data includes 1 of the 1 --val-data shard(s) ($ref/train.bin)" "$tmp/shared.err" ||
    fail "no warning for validation shards among the training shards: $(cat "$tmp/shared.err")"
else
  fail "the run validating on its training shard failed: $(cat "$tmp/shared.err")"
fi

printf '{"prompt": "one\\u0000two"}\n' >"$tmp/nul.json"
expect_refused "NUL in the prompt" '^error: --config .*nul.json: key "prompt": contains a NUL character' \
  --config "$tmp/nul.json" --generate --init-from "$ref/model.bin"

[ "$failures" -eq 0 ] && echo "run_sanity: all checks passed"
[ "$failures" -eq 0 ]
