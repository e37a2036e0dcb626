#!/usr/bin/env bash
# Bad input to the binary: every case must exit non-zero with one message that names the
# flag, key or file and what was expected, and must leave an existing --out-dir untouched.
# Also: --help lists every flag with its default.
# usage: cli_errors.sh cpu|gpu   (uses the tiny reference that `make test` builds)
set -u
# shellcheck source=test/checks/lib/trainer.sh
source "$(dirname "$0")/lib/trainer.sh" "$@"
require_files "$bin" "$ref/model.bin" "$ref/train.bin"
cases=0

# A previous run's outputs that no failing invocation may touch.
out=$tmp/previous_run
mkdir -p "$out"
echo '{"step": 1, "train_loss": 1.0}' >"$out/metrics.jsonl"
echo 'previous model' >"$out/model.bin"
snapshot() { (cd "$out" && ls -l --time-style=full-iso && cat metrics.jsonl model.bin) | md5sum; }
before=$(snapshot)

# Flags of a run that would succeed on the tiny reference (with --overwrite, which may replace the
# previous run's files only once every input has been checked). Its validation shard is a copy of
# the training shard, not the same file (that draws a warning).
cp "$ref/train.bin" "$tmp/val.bin"
good=(--init-from "$ref/model.bin" --train-data "$ref/train.bin" --val-data "$tmp/val.bin"
      --batch-size 2 --seq-len 32 --max-steps 1 --warmup-steps 0 --val-steps 1 --out-dir "$out" --overwrite 1)

# expect_error "description" "text the message must contain"... -- ARGS...
# ARGS "+ FLAGS...": the good flags with FLAGS in place of theirs (with_flags).
expect_error() {
  local what=$1; shift
  local needles=()
  while [ "$1" != "--" ]; do needles+=("$1"); shift; done
  shift
  if [ "${1:-}" = "+" ]; then shift; with_flags good "$@"; set -- "${flags[@]}"; fi
  cases=$((cases + 1))
  "$bin" "$@" >"$tmp/stdout" 2>"$tmp/stderr"
  local status=$? msg
  msg=$(cat "$tmp/stderr")
  if [ $status -eq 0 ]; then
    echo "FAIL: $what: exit status 0"; failures=$((failures + 1)); return
  fi
  for n in "${needles[@]}"; do
    if [[ "$msg" != *"$n"* ]]; then
      echo "FAIL: $what: message does not contain '$n': $msg"; failures=$((failures + 1)); return
    fi
  done
  if [ "$(grep -c . "$tmp/stderr")" -ne 1 ]; then
    echo "FAIL: $what: expected a one-line message, got:"; cat "$tmp/stderr"; failures=$((failures + 1)); return
  fi
  echo "ok: $what: $msg"
}

# Files for the data and model cases.
shard() {  # shard PATH MAGIC VERSION HEADER_COUNT ACTUAL_COUNT MAX_TOKEN
  "$python" - "$@" <<'EOF'
import random, struct, sys
path, magic, version, count, actual, top = sys.argv[1], *map(int, sys.argv[2:])
random.seed(1)
with open(path, "wb") as f:
    f.write(struct.pack("<256i", magic, version, count, *([0] * 253)))
    f.write(struct.pack(f"<{actual}H", *[random.randrange(top) for _ in range(actual - 1)], top - 1))
EOF
}
shard "$tmp/bad_magic.bin" 12345 1 1000 1000 500
shard "$tmp/bad_version.bin" 20240520 7 1000 1000 500
shard "$tmp/truncated.bin" 20240520 1 1000 900 500
shard "$tmp/too_small.bin" 20240520 1 40 40 500
shard "$tmp/big_vocab.bin" 20240520 1 1000 1000 50257
head -c 5000 "$ref/model.bin" >"$tmp/truncated_model.bin"
"$python" -c 'import sys; d=bytearray(open(sys.argv[1],"rb").read()); d[0]^=1; open(sys.argv[2],"wb").write(d)' \
  "$ref/model.bin" "$tmp/bad_magic_model.bin"
printf '{"lr": 0.001, "batch-size": 2,}' >"$tmp/invalid.json"
printf '{"learning_rate": 0.001}' >"$tmp/unknown_key.json"
printf '{"batch-size": "two"}' >"$tmp/wrong_type.json"
printf '{"max-steps": 1.5}' >"$tmp/wrong_type_int.json"
printf '{"lr": 0.001, "batch-size": 2, "lr": 0.002}' >"$tmp/repeated_key.json"
mkdir "$tmp/config_dir"
echo "not a directory" >"$tmp/a_file"

# ---- flags
expect_error "unknown flag" "unknown flag" "--learning-rate" -- + --learning-rate 0.1
expect_error "flag without a value" "--lr" "missing value" -- + --lr
expect_error "positional argument" "unexpected argument 'train.bin'" -- + train.bin
expect_error "non-number" "--lr" "expected a number" "'fast'" -- + --lr fast
expect_error "non-integer" "--batch-size" "expected an integer" -- + --batch-size=2.5
expect_error "zero batch" "--batch-size" "got '0'" -- + --batch-size 0
expect_error "negative lr" "--lr" ">= 0" -- + --lr -1e-3
expect_error "beta out of range" "--beta2" "[0, 1)" -- + --beta2 1.0
expect_error "eps zero" "--adam-eps" "> 0" -- + --adam-eps 0
expect_error "ZeRO stage 4" "--zero" "[0, 3]" "'4'" -- + --zero 4
expect_error "no ZeRO 3 prefetch" "--zero3-prefetch" "[1, 8]" -- + --zero3-prefetch 0
expect_error "no tensor parallelism" "--tp" "got '0'" -- + --tp 0
expect_error "TP group larger than the run" "--tp 2 must divide the number of ranks, 1" -- + --tp 2
expect_error "TP group splitting a head" "--tp 3: each rank holds whole heads" "NH = 4" -- \
  --plan --init-from "$ref/model.bin" --seq-len 32 --world-size 3 --tp 3
expect_error "plan's TP group larger than its world" "must divide the number of ranks, 1 (--world-size)" -- \
  --plan --init-from "$ref/model.bin" --seq-len 32 --tp 2
expect_error "no pipeline stage" "--pp" "got '0'" -- + --pp 0
expect_error "pipeline larger than the run" "--tp 1 x --pp 2 = 2 must divide the number of ranks, 1" -- + --pp 2
expect_error "plan's TP x PP grid not dividing its world" "--tp 2 x --pp 2 = 4 must divide the number of ranks, 6 (--world-size)" -- \
  --plan --init-from "$ref/model.bin" --seq-len 32 --world-size 6 --tp 2 --pp 2
expect_error "no context-parallel rank" "--cp" "got '0'" -- + --cp 0
expect_error "context parallelism larger than the run" "--cp 2 x --tp 1 x --pp 1 = 2 must divide the number of ranks, 1" -- \
  + --cp 2
expect_error "plan's CP x TP grid not dividing its world" "--cp 2 x --tp 2 x --pp 1 = 4 must divide the number of ranks, 6 (--world-size)" -- \
  --plan --init-from "$ref/model.bin" --seq-len 32 --world-size 6 --tp 2 --cp 2
expect_error "sequence not cut into 2N chunks" "--seq-len 30 with --cp 4" "2 x --cp must divide it" -- \
  --plan --init-from "$ref/model.bin" --seq-len 30 --world-size 4 --cp 4
expect_error "--max-seq-len on a model file" "--max-seq-len sizes a fresh --model preset; --init-from's model file" -- \
  --plan --init-from "$ref/model.bin" --seq-len 32 --max-seq-len 64
expect_error "experts on GPT-2" "--moe-experts/--moe-top-k/--moe-router: experts replace a Llama 3 MLP; preset d12" -- \
  --plan --model d12 --seq-len 32 --moe-experts 4 --moe-top-k 2
expect_error "top-k above the experts" "--moe-top-k 5: expected 1..E = 4" -- \
  --plan --model llama-nano --seq-len 32 --moe-experts 4 --moe-top-k 5
expect_error "experts without top-k" "--moe-top-k 0: expected 1..E = 4 (give --moe-top-k)" -- \
  --plan --model llama-nano --seq-len 32 --moe-experts 4
expect_error "too many experts" "--moe-experts" "'257'" -- --plan --model llama-nano --seq-len 32 --moe-experts 257
expect_error "unknown router" "--moe-router" "got 'hash'" -- --plan --model moe-nano --seq-len 32 --moe-router hash
expect_error "sigmoid router with an aux loss" "--moe-aux-loss-coef: the sigmoid router balances with its expert bias" -- \
  --plan --model moe-nano --seq-len 32 --moe-experts 8 --moe-router sigmoid --moe-aux-loss-coef 0.01
expect_error "bias rate for the softmax router" "--moe-bias-rate: preset moe-nano" "has no balancing bias" -- \
  --plan --model moe-nano --seq-len 32 --moe-bias-rate 0.01
expect_error "sigmoid router over 4 experts" "expected E a multiple of 8 with the sigmoid router" -- \
  --plan --model moe-nano --seq-len 32 --moe-router sigmoid
expect_error "experts reshaping a model file" "--moe-experts shapes a fresh --model preset; --init-from's model" -- \
  --plan --init-from "$ref/model.bin" --seq-len 32 --moe-experts 4
expect_error "aux loss without experts" "--moe-aux-loss-coef: preset llama-nano has no experts" -- \
  --plan --model llama-nano --seq-len 32 --moe-aux-loss-coef 0.1
expect_error "balanced routing without experts" "--moe-balanced-routing: preset nano has no experts" -- \
  --plan --model nano --seq-len 32 --moe-balanced-routing 1
expect_error "experts under --tp without sequence parallelism" \
  "--sequence-parallel 0 with --tp 2 and experts (preset moe-nano): each TP rank routes its own rows" -- \
  --plan --model moe-nano --seq-len 32 --world-size 2 --tp 2 --sequence-parallel 0
expect_error "experts with FP8" "--fp8 with experts (preset moe-nano) is not supported yet" -- \
  --plan --model moe-nano --seq-len 32 --fp8 1
expect_error "no expert-parallel rank" "--ep" "got '0'" -- + --ep 0
expect_error "expert parallelism without experts" "--ep: preset llama-nano has no experts" -- \
  --plan --model llama-nano --seq-len 32 --world-size 2 --ep 2
expect_error "EP group not dividing the data ranks" "--ep 4: the EP group's ranks are data-parallel ranks" \
  "must divide their number, 2 (--world-size)" -- --plan --model moe-nano --seq-len 32 --world-size 2 --ep 4
expect_error "EP group splitting an expert" "--ep 3: each rank holds whole experts" "E = 4 (preset moe-nano)" -- \
  --plan --model moe-nano --seq-len 32 --world-size 3 --ep 3
expect_error "unknown pipeline schedule" "--pp-schedule" "got 'zb'" -- + --pp-schedule zb
expect_error "no chunk per pipeline rank" "--pp-virtual" "got '0'" -- + --pp-virtual 0
expect_error "virtual stages without interleaving" "--pp-virtual 2 chunks per rank need --pp-schedule interleaved" -- \
  + --pp-virtual 2
expect_error "fewer micro-batches than stages" "--pp 2 needs at least 2 micro-batches per optimizer step" "--batch-size" -- \
  --plan --init-from "$ref/model.bin" --seq-len 32 --world-size 2 --pp 2
expect_error "ZeRO 2 under a pipeline" "--zero 2 with --pp 2" "use --zero 0 or 1" -- \
  --plan --init-from "$ref/model.bin" --seq-len 32 --world-size 2 --pp 2 --zero 2 --total-batch-tokens 16384
expect_error "zb-h1 with recomputation" "--pp-schedule zb-h1 with --recompute 1" "use --recompute 0" -- \
  --plan --init-from "$ref/model.bin" --seq-len 32 --world-size 2 --pp 2 --pp-schedule zb-h1 --recompute 1 \
  --total-batch-tokens 16384
expect_error "--fp8 with fp32" "--fp8 with --dtype fp32" "use --dtype bf16" -- + --fp8 1 --dtype fp32
expect_error "--fp8 with ZeRO 3" "--fp8 with --zero 3" "use --zero 2 or less" -- + --fp8 1 --zero 3
expect_error "--fp8 with zb-h1" "--fp8 with --pp-schedule zb-h1" -- \
  --plan --init-from "$ref/model.bin" --seq-len 32 --world-size 2 --pp 2 --pp-schedule zb-h1 --recompute 0 \
  --total-batch-tokens 16384 --fp8 1
expect_error "--fp8 rows not a multiple of 16" "--fp8: the rows per rank B*T/--cp" "is 8, not a multiple of 16" -- \
  + --fp8 1 --batch-size 1 --seq-len 8
expect_error "unknown FP8 scaling" "--fp8-scaling" "got 'fast'" -- + --fp8 1 --fp8-scaling fast
expect_error "FP8 history 0" "--fp8-amax-history" "'0'" -- + --fp8 1 --fp8-amax-history 0
expect_error "--pp-recompute not one per rank" "--pp-recompute: 1 value(s) for --pp 2 (one per pipeline rank)" -- \
  --plan --init-from "$ref/model.bin" --seq-len 32 --world-size 2 --pp 2 --pp-recompute 1 --total-batch-tokens 16384
expect_error "--pp-recompute without a pipeline" "--pp-recompute sets --recompute per pipeline stage" -- \
  + --pp-recompute 1
expect_error "zb-h1 with a stage recomputing" "--pp-schedule zb-h1 with --recompute 1 (--pp-recompute, stage 1)" -- \
  --plan --init-from "$ref/model.bin" --seq-len 32 --world-size 2 --pp 2 --pp-schedule zb-h1 --pp-recompute 0,1 \
  --total-batch-tokens 16384
expect_error "more pipeline chunks than layers" "--pp 1 x --pp-virtual 4 = 4 pipeline chunks for a model of 2 layers" -- \
  + --pp-schedule interleaved --pp-virtual 4
expect_error "--pp-layers not one per rank" "--pp-layers: 2 counts for --pp 1" -- + --pp-layers 1,1
expect_error "--pp-layers entry below 1" "--pp-layers" "got '0'" -- + --pp-layers 0
expect_error "--pp-layers not summing to L" "--pp-layers: the counts sum to 3 layers, the model has 2" -- + --pp-layers 3
expect_error "--pp-layers not a multiple of --pp-virtual" "--pp-layers: pipeline rank 0's 1 layers are not a multiple of --pp-virtual 2" -- \
  + --pp-schedule interleaved --pp-virtual 2 --pp-layers 1
expect_error "negative clip" "--grad-clip" -- + --grad-clip -1
expect_error "final-lr-frac > 1" "--final-lr-frac" "[0, 1]" -- + --final-lr-frac 2
expect_error "negative steps" "--max-steps" "[0, 2147483647]" -- + --max-steps -1
expect_error "bad save dtype" "--save-dtype" "bf16 fp32" -- + --save-dtype fp16
expect_error "flag given twice" "--lr is given twice ('1e-3', then '2e-3')" -- + --lr 1e-3 --lr 2e-3
expect_error "flag given twice, other syntax" "--batch-size is given twice ('2', then '3')" -- "${good[@]}" --batch-size=3
expect_error "a batch too big to index" "--batch-size 2147483647" "--seq-len 32" -- + --batch-size 2147483647
expect_error "bad dtype" "--dtype" "bf16 fp32" -- + --dtype fp16
expect_error "bad schedule" "--lr-schedule" "cosine linear constant wsd" -- + --lr-schedule step
expect_error "bad switch" "--shuffle" "0 or 1" -- + --shuffle maybe
expect_error "T above the model's maximum" "--seq-len 128" "64" "$ref/model.bin" -- + --seq-len 128
expect_error "T above the preset's maximum" "--seq-len 256" "128" "nano" -- --model nano --seq-len 256 --out-dir "$out" --overwrite
expect_error "total batch not divisible" "--total-batch-tokens 100" "2 x 32 x 1 = 64" -- + --total-batch-tokens 100
expect_error "--init-from with --model" "--init-from and --model" -- + --model d12
expect_error "unknown preset" "--model" "unknown model preset 'd13'" -- --model d13 --out-dir "$out" --overwrite

# ---- config files
expect_error "missing config file" "--config $tmp/none.json" "cannot open" -- --config "$tmp/none.json"
expect_error "invalid JSON" "--config $tmp/invalid.json" "not valid JSON" -- + --config "$tmp/invalid.json"
expect_error "unknown config key" "$tmp/unknown_key.json" "unknown key \"learning_rate\"" -- + --config "$tmp/unknown_key.json"
expect_error "wrong JSON type" "$tmp/wrong_type.json" "key \"batch-size\"" "expected an integer" -- + --config "$tmp/wrong_type.json"
expect_error "float for an integer" "$tmp/wrong_type_int.json" "key \"max-steps\"" -- + --config "$tmp/wrong_type_int.json"
expect_error "repeated key" "$tmp/repeated_key.json" "key \"lr\" appears more than once" -- + --config "$tmp/repeated_key.json"
expect_error "config is a directory" "--config $tmp/config_dir: is a directory" -- + --config "$tmp/config_dir"

# ---- data
expect_error "no training shard" "--train-data" "$tmp/missing_*.bin" "no file matches" -- + --train-data "$tmp/missing_*.bin"
expect_error "no validation shard" "--val-data" "$tmp/nothing.bin" -- + --val-data "$tmp/nothing.bin"
expect_error "shard magic" "--train-data" "$tmp/bad_magic.bin" "magic" -- + --train-data "$tmp/bad_magic.bin"
expect_error "shard version" "$tmp/bad_version.bin" "version" -- + --train-data "$tmp/bad_version.bin"
expect_error "truncated shard" "$tmp/truncated.bin" "expected 1024 + 2*" -- + --train-data "$tmp/truncated.bin"
expect_error "shard smaller than a batch" "$tmp/too_small.bin" "fewer than one global batch" -- + --train-data "$tmp/too_small.bin"
expect_error "vocab mismatch (train)" "--train-data" "$tmp/big_vocab.bin" "vocab size 500" -- + --train-data "$tmp/big_vocab.bin"
expect_error "vocab mismatch (val)" "--val-data" "$tmp/big_vocab.bin" "vocab size 500" -- + --val-data "$tmp/big_vocab.bin"

# ---- model file
expect_error "missing model file" "--init-from" "$tmp/none.bin" "cannot open" -- + --init-from "$tmp/none.bin"
expect_error "truncated model file" "--init-from" "$tmp/truncated_model.bin" -- + --init-from "$tmp/truncated_model.bin"
expect_error "model file magic" "--init-from" "$tmp/bad_magic_model.bin" -- + --init-from "$tmp/bad_magic_model.bin"
expect_error "model file is a directory" "--init-from: $tmp: is a directory" -- + --init-from "$tmp"

# ---- output
expect_error "--out-dir is a file" "--out-dir $tmp/a_file" -- + --out-dir "$tmp/a_file"
expect_error "missing --resume directory" "--resume $tmp/none" "no such directory" -- + --resume "$tmp/none"
expect_error "--resume of a file" "--resume $ref/model.bin: not a complete checkpoint: not a directory" -- + --resume "$ref/model.bin"
expect_error "negative --checkpoint-every" "--checkpoint-every" "expected an integer >= 0" -- + --checkpoint-every -1
expect_error "negative --skip-loss-z" "--skip-loss-z" "expected a number >= 0" -- + --skip-loss-z -1

# A batch far beyond the device: refused by the memory plan before anything is allocated, naming
# the bytes and the --batch-size that would fit.
cases=$((cases + 1))
if "$bin" --model nano --batch-size 4000000 --seq-len 64 --out-dir "$out" --overwrite >"$tmp/stdout" 2>"$tmp/stderr"; then
  fail "a batch that cannot be allocated: exit status 0"
elif ! grep -qE "^error: the run needs [0-9.]+ GiB of device memory per rank and free device memory is .*largest --batch-size that fits" "$tmp/stderr" ||
    [ "$(wc -l < "$tmp/stderr")" -ne 1 ]; then
  fail "allocation failure message: $(cat "$tmp/stderr")"
else
  echo "ok: allocation failure: $(cat "$tmp/stderr")"
fi

if [ "$(snapshot)" != "$before" ]; then
  echo "FAIL: a failing run modified the existing --out-dir:"; ls -la "$out"; failures=$((failures + 1))
fi

# ---- --help: every flag with its default, exit 0, no device needed
if "$bin" --help >"$tmp/help" 2>&1; then
  for flag in config train-data val-data shuffle seed init-from model dtype batch-size seq-len total-batch-tokens \
      lr lr-schedule warmup-steps final-lr-frac weight-decay beta1 beta2 adam-eps grad-clip max-steps val-every \
      val-steps out-dir save-dtype; do
    grep -qE "^  --$flag " "$tmp/help" || { echo "FAIL: --help does not list --$flag"; failures=$((failures + 1)); }
  done
  listed=$(grep -cE '^  --[a-z]' "$tmp/help")
  defaults=$(grep -c 'default: ' "$tmp/help")
  # every flag but --help itself states its default
  [ "$defaults" -eq $((listed - 1)) ] || { echo "FAIL: --help: $listed flags but $defaults defaults"; failures=$((failures + 1)); }
  grep -q 'default: 0.95' "$tmp/help" || { echo "FAIL: --help does not show beta2's default"; failures=$((failures + 1)); }
else
  echo "FAIL: --help exited non-zero"; failures=$((failures + 1))
fi

echo "$cases error cases, $failures failures"
[ "$failures" -eq 0 ]
