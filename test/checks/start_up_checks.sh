#!/usr/bin/env bash
# What a run checks before it starts work, so that nothing is lost or overwritten later:
#   - a flag value that is not valid UTF-8 (it would reach metrics.jsonl or a checkpoint's
#     manifest) is refused in one line naming the flag, before any step or directory;
#   - --eval-losses never names an input (the model file, --eval-data, a checkpoint's model.bin),
#     however the path is spelled (a symlink, a hard link), and an unwritable one fails before
#     the evaluation;
#   - an eval file whose header claims 2^30 examples is an error naming the file;
#   - a model with a non-finite weight is refused, naming the tensor, for training, evaluation and
#     generation;
#   - --plan refuses --gpu-memory 1e300 and exits 2 when the plan does not fit;
#   - --sample-every larger than --max-steps draws a warning.
# usage: start_up_checks.sh cpu|gpu
set -u
# shellcheck source=test/checks/lib/trainer.sh
source "$(dirname "$0")/lib/trainer.sh" "$@"
require_files "$bin" "$ref/model.bin" "$ref/train.bin"

model=$ref/model.bin
common=(--train-data "$ref/train.bin" --val-data "$ref/train.bin" --batch-size 2 --seq-len 32 --val-every 0)

# expect_refused NAME PATTERN ARGS...: the binary exits 1 with one line on stderr matching PATTERN
# (extended regular expression), having trained and evaluated nothing.
expect_refused() {
  local name=$1 pattern=$2 status=0
  shift 2
  "$bin" "$@" >"$tmp/refused.log" 2>"$tmp/refused.err" || status=$?
  [ "$status" -eq 1 ] || fail "$name: exit status $status, expected 1"
  { [ "$(wc -l <"$tmp/refused.err")" -eq 1 ] && grep -qE "$pattern" "$tmp/refused.err"; } ||
    fail "$name: expected one line matching '$pattern', got: $(head -c 600 "$tmp/refused.err")"
  ! grep -qE '^step |acc_norm|val loss' "$tmp/refused.log" || fail "$name: it trained or evaluated"
}

# ---- values that are not UTF-8
bad=$'\xff'
expect_refused "--out-dir not UTF-8" "^error: --out-dir: not valid UTF-8 text \(byte 0xff at offset [0-9]+\)" \
  --init-from "$model" "${common[@]}" --max-steps 2 --out-dir "$tmp/out$bad"
[ ! -e "$tmp/out$bad" ] || fail "--out-dir not UTF-8: the directory was created"
expect_refused "--prompt not UTF-8" "^error: --prompt: not valid UTF-8 text \(byte 0xc3 at offset 2\)" \
  --init-from "$model" "${common[@]}" --max-steps 2 --sample-every 1 --prompt $'Hi\xc3(' --out-dir "$tmp/prompt"
expect_refused "--train-data not UTF-8" "^error: --train-data: not valid UTF-8 text" \
  --init-from "$model" "${common[@]:2}" --train-data "$ref/train$bad.bin" --max-steps 2 --out-dir "$tmp/data"

# ---- --eval-losses never replaces an input
"$python" - "$tmp/eval.bin" <<'PY' || fail "writing the eval file"
import sys
sys.path.insert(0, "test/checks/lib")
from eval_file import write_eval_file
write_eval_file(sys.argv[1], [(0, [1, 2, 3], [[4, 5], [6]]), (1, [7], [[8], [9, 10], [11]])])
PY
cp "$model" "$tmp/model.bin"
ln -s "$tmp/model.bin" "$tmp/model_link.bin"
ln "$tmp/eval.bin" "$tmp/eval_hardlink.bin"
eval_flags=(--eval --init-from "$tmp/model.bin" --eval-data "$tmp/eval.bin" --batch-size 2 --seq-len 32)
for target in "$tmp/model.bin" "$tmp/model_link.bin" "$tmp/eval.bin" "$tmp/eval_hardlink.bin"; do
  expect_refused "--eval-losses $(basename "$target")" \
    "^error: --eval-losses $target is (the model file|--eval-data) $tmp/(model|eval).bin: " \
    "${eval_flags[@]}" --eval-losses "$target"
done
cmp -s "$model" "$tmp/model.bin" || fail "--eval-losses: the model file changed"
# A checkpoint's model file, read by --resume.
"$bin" --init-from "$model" "${common[@]}" --max-steps 1 --out-dir "$tmp/run" >"$tmp/run.log" 2>&1 ||
  { fail "the run to resume failed"; cat "$tmp/run.log"; }
expect_refused "--eval-losses onto --resume's model file" \
  "^error: --eval-losses $tmp/run/checkpoint_00000001/model.bin is the model file " \
  --eval --resume "$tmp/run/checkpoint_00000001" --eval-data "$tmp/eval.bin" --batch-size 2 --seq-len 32 \
  --out-dir "$tmp/run" --eval-losses "$tmp/run/checkpoint_00000001/model.bin"
# An unwritable path fails before the evaluation.
touch "$tmp/a_file"
expect_refused "--eval-losses under a file" "^error: --eval-losses: $tmp/a_file/losses.jsonl.*: Not a directory" \
  "${eval_flags[@]}" --eval-losses "$tmp/a_file/losses.jsonl"
if "$bin" "${eval_flags[@]}" --eval-losses "$tmp/losses.jsonl" >"$tmp/losses.log" 2>&1; then
  [ "$(wc -l <"$tmp/losses.jsonl")" -eq 2 ] || fail "--eval-losses: $(wc -l <"$tmp/losses.jsonl") lines, expected 2"
else
  fail "--eval with --eval-losses failed"; tail -n 2 "$tmp/losses.log"
fi

# ---- an eval header claiming 2^30 examples
"$python" - "$tmp/eval.bin" "$tmp/huge.bin" <<'PY'
import struct, sys
data = bytearray(open(sys.argv[1], "rb").read())
struct.pack_into("<i", data, 8, 1 << 30)
open(sys.argv[2], "wb").write(data)
PY
expect_refused "eval header of 2^30 examples" \
  "^error: --eval-data: $tmp/huge.bin: the header says 1073741824 examples, the file's [0-9]+ bytes hold at most [0-9]+" \
  --eval --init-from "$model" --eval-data "$tmp/huge.bin" --batch-size 2 --seq-len 32

# ---- non-finite weights, in a model with GPT-2's vocabulary (for --generate and --sample-every)
gpt=$tmp/gpt
"$python" dev/gpt2_reference.py --out "$gpt" --vocab 50257 --layers 2 --heads 2 --channels 32 --max-seq-len 64 \
  --batch 1 --seq-len 8 --steps 1 >/dev/null 2>&1 || { echo "FAIL: dev/gpt2_reference.py could not write the model"; exit 1; }
"$python" - "$gpt/model.bin" "$tmp/nan.bin" <<'PY'
import struct, sys
import numpy as np
data = bytearray(open(sys.argv[1], "rb").read())
maxT, V, L, NH, C, Vp = struct.unpack_from("<6i", data, 8)
# llm.c order: wte, wpe, ln1w, ln1b, qkvw, qkvb, attprojw, attprojb, ln2w, ln2b (layer 1's, element 3)
sizes = [Vp * C, maxT * C, L * C, L * C, L * 3 * C * C, L * 3 * C, L * C * C, L * C, L * C]
struct.pack_into("<f", data, 1024 + 4 * (sum(sizes) + C + 3), np.nan)
open(sys.argv[2], "wb").write(data)
PY
nan_error="^error: --init-from: $tmp/nan.bin: tensor ln2b holds 1 non-finite value\(s\) \(NaN or infinity\), the first at element $((32 + 3)) \(layer 1\)"
expect_refused "training from a NaN weight" "$nan_error" --init-from "$tmp/nan.bin" "${common[@]}" --max-steps 1 \
  --out-dir "$tmp/nan_run"
expect_refused "validating a NaN weight" "$nan_error" --init-from "$tmp/nan.bin" "${common[@]}" --max-steps 0
expect_refused "evaluating a NaN weight" "$nan_error" --eval --init-from "$tmp/nan.bin" --eval-data "$tmp/eval.bin" \
  --batch-size 2 --seq-len 32
expect_refused "generating from a NaN weight" "$nan_error" --generate --init-from "$tmp/nan.bin" --max-new-tokens 2

# ---- --plan
expect_refused "--plan --gpu-memory 1e300" "^error: --gpu-memory: expected a number in \[0, [0-9]+\], got '1e300'" \
  --plan --model d12 --gpu-memory 1e300
status=0
"$bin" --plan --model d12 --batch-size 8 --seq-len 1024 --gpu-memory 1 >"$tmp/plan.log" 2>&1 || status=$?
[ "$status" -eq 2 ] || fail "--plan that does not fit: exit status $status, expected 2"
grep -qi "does not fit" "$tmp/plan.log" || fail "--plan that does not fit: $(tail -n 3 "$tmp/plan.log")"
"$bin" --plan --model d12 --batch-size 8 --seq-len 1024 --gpu-memory 80 >"$tmp/plan.log" 2>&1 ||
  fail "--plan that fits: exit status $?"

# ---- --sample-every beyond --max-steps
if "$bin" --init-from "$gpt/model.bin" "${common[@]}" --max-steps 2 --sample-every 5 --max-new-tokens 2 --out-dir "$tmp/sample" \
    >"$tmp/sample.log" 2>"$tmp/sample.err"; then
  grep -qx "warning: --sample-every 5 > --max-steps 2: no sample is drawn" "$tmp/sample.err" ||
    fail "--sample-every 5 --max-steps 2: no warning ($(cat "$tmp/sample.err"))"
else
  fail "a run with --sample-every 5 --max-steps 2 failed"; tail -n 2 "$tmp/sample.err"
fi

[ "$failures" -eq 0 ] && echo "start_up_checks: all checks passed"
[ "$failures" -eq 0 ]
