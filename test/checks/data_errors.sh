#!/usr/bin/env bash
# Bad token data found mid-run loses nothing. Three training shards of three batches each; the
# second holds a token id outside the vocabulary in its last batch. The loader checks a whole shard
# before handing out its first batch, so the run stops when it reaches that shard (step 4), not at
# the batch with the bad id (step 6): it writes a checkpoint of the 3 completed steps, exits 1
# naming the shard, the position and the id, and keeps metrics.jsonl's records. With the shard
# replaced, --resume auto continues from step 3 and ends exactly as a run on good data does.
# A bad id in a validation shard that validation reads only later is found before anything is
# written. A shard of one tokenizer's kind for a model of the other's vocabulary is refused in one
# line before anything is written: Llama 3 shards (./tokenize --encoding llama3) for the tiny GPT-2
# model, GPT-2 shards for a GPT-2 model of Llama 3's vocabulary size (V=128256), and a pattern
# matching shards of both kinds.
# usage: data_errors.sh cpu|gpu
set -u
# shellcheck source=test/checks/lib/trainer.sh
source "$(dirname "$0")/lib/trainer.sh" "$@"
require_files "$bin" "$ref/model.bin" "$ref/train.bin"

# shard PATH N SEED [BAD_POSITION]: N token ids < 500 (the tiny model's vocabulary), 500 at BAD_POSITION.
shard() {
  "$python" - "$@" <<'EOF'
import random, struct, sys
path, n, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
random.seed(seed)
tokens = [random.randrange(500) for _ in range(n)]
if len(sys.argv) > 4: tokens[int(sys.argv[4])] = 500
with open(path, "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
    f.write(struct.pack(f"<{n}H", *tokens))
EOF
}
good=$tmp/good
bad=$tmp/bad
mkdir -p "$good" "$bad"
for s in 0 1 2; do shard "$good/train_00$s.bin" 200 "$s"; done  # (200 - 1) / 64 = 3 batches of 2 x 32 each
cp "$good"/train_00[02].bin "$bad/"
shard "$bad/train_001.bin" 200 1 180  # in batch 3 of the shard: tokens [128, 193)

common=(--init-from "$ref/model.bin" --val-data "$ref/train.bin" --shuffle 0 --batch-size 2 --seq-len 32
        --max-steps 8 --lr 2e-3 --warmup-steps 2 --val-every 2 --val-steps 1)
straight=$tmp/straight
"$bin" "${common[@]}" --train-data "$good/train_*.bin" --out-dir "$straight" >"$straight.log" 2>&1 ||
  { fail "the run on good data failed"; cat "$straight.log"; }

run=$tmp/run
if "$bin" "${common[@]}" --train-data "$bad/train_*.bin" --out-dir "$run" >"$run.log" 2>"$run.err"; then
  fail "a run over a shard with a bad token id exited 0"
else
  status=$?
  [ "$status" -eq 1 ] || fail "bad token id: exit status $status, expected 1"
  expected="error: --train-data: $bad/train_001.bin: token id 500 at token position 180 is >= the vocab size 500; the 3 completed step(s) are in $run/checkpoint_00000003 (replace the shard, then continue with --resume auto)"
  [ "$(tail -n 1 "$run.err")" = "$expected" ] || fail "bad token id message: $(tail -n 1 "$run.err")"
  [ -f "$run/checkpoint_00000003/manifest.json" ] || fail "no complete checkpoint of step 3: $(ls "$run")"
  ! grep -q '^step 4/8 | loss' "$run.log" || fail "step 4 was trained on the shard with the bad id"
  # metrics.jsonl: the records of steps 1-3, whole, exactly those of the good run
  "$python" - "$straight/metrics.jsonl" "$run/metrics.jsonl" <<'EOF' || fail "metrics.jsonl of the stopped run"
import json, sys
def load(p, last=None):
    records = [json.loads(l) for l in open(p)]
    return [{k: v for k, v in r.items() if k not in ("ms", "tokens_per_s", "mfu")} for r in records
            if last is None or r["step"] <= last]
want, got = load(sys.argv[1], 3), load(sys.argv[2])
if want != got: print(f"  good run's first 3 steps {want}\n  stopped run {got}"); sys.exit(1)
EOF
  cp "$good/train_001.bin" "$bad/train_001.bin"
  if "$bin" "${common[@]}" --train-data "$bad/train_*.bin" --resume auto --out-dir "$run" >"$run.resume.log" 2>&1; then
    grep -q "resumed from $run/checkpoint_00000003: 3 step" "$run.resume.log" || fail "did not resume from step 3"
    "$python" - "$straight/metrics.jsonl" "$run/metrics.jsonl" <<'EOF' || fail "the resumed run differs from the good run"
import json, sys
def load(p):
    return [{k: v for k, v in json.loads(l).items() if k not in ("ms", "tokens_per_s", "mfu")} for l in open(p)]
sys.exit(0 if load(sys.argv[1]) == load(sys.argv[2]) else 1)
EOF
    cmp -s "$straight/model.bin" "$run/model.bin" || fail "the resumed run's model.bin differs from the good run's"
  else
    fail "resuming after the shard was replaced failed"; cat "$run.resume.log"
  fi
fi

# Validation reads 12 batches: 10 from the tiny reference, 2 from a shard whose first batch holds
# an id outside the vocabulary. The error comes before the out-dir is created.
val=$tmp/val
mkdir -p "$val"
cp "$ref/train.bin" "$val/val_0.bin"
shard "$val/val_1.bin" 200 5 10
with_flags common --val-data "$val/val_*.bin" --val-steps 12 --val-every 4
if "$bin" "${flags[@]}" --train-data "$good/train_*.bin" --out-dir "$tmp/val_run" >"$tmp/val_run.log" 2>&1; then
  fail "a run whose validation reads a bad token id exited 0"
else
  grep -q "^error: --val-data: $val/val_1.bin: token id 500 at token position 10 is >= the vocab size 500$" \
    "$tmp/val_run.log" || fail "bad validation id message: $(tail -n 1 "$tmp/val_run.log")"
  [ ! -e "$tmp/val_run" ] || fail "the bad validation shard was found after the out-dir was created"
fi

# refused FLAG WANT ARGS...: the run exits 1 with one line "error: FLAG: WANT" and creates no out-dir.
refused() {
  local flag=$1 want=$2 out=$tmp/refused_run
  shift 2
  if "$bin" "$@" --out-dir "$out" >"$tmp/refused.log" 2>"$tmp/refused.err"; then
    fail "$flag: exit 0, expected: $want"
  elif [ "$(cat "$tmp/refused.err")" != "error: $flag: $want" ]; then
    fail "$flag: expected 'error: $flag: $want', got: $(cat "$tmp/refused.err")"
  elif [ -e "$out" ]; then
    fail "$flag: the refused run created its out-dir"
  else
    echo "ok: $(cat "$tmp/refused.err")"
  fi
}
# Llama 3 shards: ./tokenize's when its vocabulary is installed, else the same layout written here.
llama=$tmp/llama
mkdir -p "$llama"
if [ -f data/llama3_bpe/tokenizer.model ]; then
  ./tokenize --encoding llama3 --quiet --out-dir "$llama" --name x README.md >/dev/null || fail "tokenize --encoding llama3"
else
  echo "note: data/llama3_bpe is missing (scripts/install_deps.sh): a Llama 3 shard written by Python instead"
  "$python" -c 'import struct, sys
n = 500
open(sys.argv[1], "wb").write(struct.pack("<256i", 20240801, 7, n, *[0] * 253) + struct.pack(f"<{n}I", *[128000 + i for i in range(n)]))' \
    "$llama/x_train_000000.bin"
fi
tiny=(--init-from "$ref/model.bin" --batch-size 2 --seq-len 32 --max-steps 2)
refused --train-data "$llama/x_train_000000.bin: a Llama 3 token shard (magic 20240801, uint32 ids); the model's vocabulary (V=500) fits uint16 ids, GPT-2's kind: tokenize with --encoding gpt2" \
  "${tiny[@]}" --val-every 0 --train-data "$llama/x_train_*.bin"
refused --val-data "$llama/x_train_000000.bin: a Llama 3 token shard (magic 20240801, uint32 ids); the model's vocabulary (V=500) fits uint16 ids, GPT-2's kind: tokenize with --encoding gpt2" \
  "${tiny[@]}" --train-data "$good/train_*.bin" --val-data "$llama/x_train_*.bin" --val-every 1
cp "$good/train_000.bin" "$llama/x_train_.bin"  # sorts first
refused --train-data "$llama/x_train_000000.bin: a Llama 3 token shard (magic 20240801, uint32 ids), but $llama/x_train_.bin, matched by the same pattern, is a GPT-2 token shard (magic 20240520, uint16 ids): one pattern's shards must come from one tokenizer" \
  "${tiny[@]}" --val-every 0 --train-data "$llama/x_train_*.bin"
"$python" -W ignore::UserWarning test/checks/lib/wide_vocab_model.py "$tmp/wide.bin" || fail "writing a model of V=128256"
refused --train-data "$good/train_000.bin: a GPT-2 token shard (magic 20240520, uint16 ids); the model has Llama 3's vocabulary (V=128256): tokenize with --encoding llama3" \
  --init-from "$tmp/wide.bin" --batch-size 2 --seq-len 32 --max-steps 2 --val-every 0 --train-data "$good/train_000.bin"

[ "$failures" -eq 0 ] && echo "data_errors: all checks passed"
[ "$failures" -eq 0 ]
