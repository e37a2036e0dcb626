#!/usr/bin/env bash
# HellaSwag-style evaluation (--eval, --eval-every, --eval-data, --eval-losses) against PyTorch.
# A fresh model (dev/gpt2_reference.py) and an eval file written here by Python (13 examples of
# 2 to 5 completions, one context longer than the sequence, so it is cut from the left); PyTorch
# (the reference's forward) scores every completion. train_gpt --eval at batch sizes 1, 3 and 5,
# and with 2 ranks under mpirun, must give the same accuracies (exactly, fp32) and per-completion
# loss sums (1e-4 relative; bf16: 3e-2). Training with --eval-every logs and records each eval.
# Bad eval files (wrong magic, token outside the vocabulary, truncated) stop with one line naming
# the file. data/hellaswag.sh fails clearly without a network.
# usage: hellaswag.sh cpu|gpu
set -u
# shellcheck source=test/checks/lib/trainer.sh
source "$(dirname "$0")/lib/trainer.sh" "$@"
require_files "$bin"
export SIMT_THREADS=1

T=16
if ! "$python" dev/gpt2_reference.py --out "$tmp/ref" --layers 2 --heads 2 --channels 32 --vocab 300 \
    --max-seq-len 32 --batch 2 --seq-len 16 --steps 3 --seed 77 >/dev/null 2>&1; then
  echo "FAIL: dev/gpt2_reference.py failed"; exit 1
fi
model=$tmp/ref/model.bin

# eval.bin (the format as docs/FORMATS.md states it) and expected.json: PyTorch's loss sums per
# completion and the accuracies, with the context cut as docs/EVALUATION.md states (to T + 1 - longest
# completion tokens).
"$python" - "$model" "$tmp/eval.bin" "$tmp/expected.json" "$T" <<'PY' || { echo "FAIL: writing the eval file"; exit 1; }
import json, sys
import numpy as np
import torch
sys.path.insert(0, "dev")
sys.path.insert(0, "test/checks/lib")
import gpt2_reference as ref
from eval_file import write_eval_file

model_path, eval_path, expected_path, T = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
cfg, params = ref.read_model_file(model_path)

rng = np.random.default_rng(5)
examples = []
for i in range(13):
    n_comp = [4, 4, 4, 2, 3, 5][i % 6]
    ctx_len = 40 if i == 6 else int(rng.integers(1, 9))
    ctx = rng.integers(0, cfg.vocab, ctx_len).tolist()
    comps = [rng.integers(0, cfg.vocab, int(rng.integers(1, 7))).tolist() for _ in range(n_comp)]
    examples.append((int(rng.integers(0, n_comp)), ctx, comps))

write_eval_file(eval_path, examples)

sums, correct_norm, correct_sum, cut = [], 0, 0, 0
with torch.no_grad():
    for label, ctx, comps in examples:
        keep = T + 1 - max(len(c) for c in comps)
        if len(ctx) > keep:
            ctx, cut = ctx[-keep:], cut + 1
        mine = []
        for c in comps:
            seq = torch.tensor([ctx + c])
            logits, _ = ref.forward(params, seq[:, :-1], seq[:, 1:], cfg)
            logp = torch.log_softmax(logits[0, :, :cfg.vocab].double(), dim=-1)
            targets = seq[0, 1:]
            token_losses = -logp[torch.arange(len(targets)), targets]
            mine.append(float(token_losses[len(ctx) - 1:].sum()))
        means = [s / len(c) for s, c in zip(mine, comps)]
        correct_norm += int(np.argmin(means)) == label
        correct_sum += int(np.argmin(mine)) == label
        sums += mine
assert cut == 1, "the long example was not cut"
json.dump({"sums": sums, "examples": len(examples), "correct_norm": correct_norm, "correct_sum": correct_sum},
          open(expected_path, "w"))
print(f"PyTorch: acc_norm {correct_norm}/{len(examples)}, acc {correct_sum}/{len(examples)}, {len(sums)} completions")
PY

# compare NAME TOL: NAME.log's accuracy line and NAME.jsonl's loss sums against PyTorch.
compare() {
  "$python" - "$tmp/expected.json" "$tmp/$1.log" "$tmp/$1.jsonl" "$2" "$1" <<'PY' || fail "$1 differs from PyTorch"
import json, re, sys
want = json.load(open(sys.argv[1]))
log, tol, name = open(sys.argv[2]).read(), float(sys.argv[4]), sys.argv[5]
lines = [json.loads(l) for l in open(sys.argv[3])]
got = [s for l in lines for s in l["loss_sum"]]
ok = len(got) == len(want["sums"]) and [l["example"] for l in lines] == list(range(want["examples"]))
worst = max(abs(g - w) / abs(w) for g, w in zip(got, want["sums"])) if ok else float("inf")
m = re.search(r"hellaswag acc_norm [0-9.]+ \((\d+)/(\d+)\) \| acc [0-9.]+ \((\d+)/(\d+)\)", log)
acc = tuple(map(int, m.groups())) if m else None
acc_want = (want["correct_norm"], want["examples"], want["correct_sum"], want["examples"])
exact = tol < 1e-3  # fp32: the same picks; bf16 may flip a near tie
good = ok and worst <= tol and (acc == acc_want if exact else acc is not None)
print(f"{'ok' if good else 'FAIL'}: {name}: {len(got)} completion loss sums, max rel err {worst:.1e} (limit {tol:g}); "
      f"acc_norm, acc {acc} (PyTorch {acc_want})")
sys.exit(0 if good else 1)
PY
}

# eval NAME [mpirun -np N ...] -- FLAGS...: one --eval run into NAME.log / NAME.jsonl.
eval_run() {
  local name=$1; shift
  local launch=()
  while [ "$1" != -- ]; do launch+=("$1"); shift; done
  shift
  if ! "${launch[@]}" "$bin" --eval --init-from "$model" --eval-data "$tmp/eval.bin" --seq-len $T \
      --eval-losses "$tmp/$name.jsonl" "$@" >"$tmp/$name.log" 2>&1; then
    fail "$name: exited non-zero"; tail -n 5 "$tmp/$name.log"; return 1
  fi
}

for B in 1 3 5; do
  eval_run "fp32_b$B" -- --dtype fp32 --batch-size "$B" && compare "fp32_b$B" 1e-4
done
grep -q "1 context(s) cut from the left to fit --seq-len $T" "$tmp/fp32_b1.log" ||
  fail "the start-up summary does not report the cut context"
eval_run bf16_b4 -- --dtype bf16 --batch-size 4 && compare bf16_b4 3e-2

mpi=(mpirun -np 2 --oversubscribe -x SIMT_THREADS=1)
[ "$(id -u)" -eq 0 ] && mpi+=(--allow-run-as-root)
if [ "$mode" = gpu ] && [ "$(nvidia-smi -L 2>/dev/null | wc -l)" -lt 2 ]; then
  echo "note: 2 ranks skipped (needs 2 GPUs)"
else
  eval_run fp32_2ranks "${mpi[@]}" -- --dtype fp32 --batch-size 3 && compare fp32_2ranks 1e-4
fi

# Training with --eval-every 2 for 3 steps: evals after steps 2 and 3, logged and recorded.
if "$bin" --init-from "$model" --train-data "$tmp/ref/train.bin" --eval-data "$tmp/eval.bin" --eval-every 2 \
    --val-every 0 --batch-size 2 --seq-len $T --max-steps 3 --warmup-steps 0 --out-dir "$tmp/train" \
    >"$tmp/train.log" 2>&1; then
  lines=$(grep -cE '^step [23]/3 \| hellaswag acc_norm [0-9.]+ \([0-9]+/13\) \| acc [0-9.]+ \([0-9]+/13\)$' "$tmp/train.log")
  records=$("$python" -c 'import json, sys
rs = [json.loads(l) for l in open(sys.argv[1])]
print(sum(1 for r in rs if set(r) == {"step", "hellaswag_acc_norm", "hellaswag_acc", "hellaswag_examples"}
          and r["hellaswag_examples"] == 13 and 0 <= r["hellaswag_acc"] <= 1))' "$tmp/train/metrics.jsonl")
  if [ "$lines" -eq 2 ] && [ "$records" -eq 2 ]; then echo "ok: --eval-every 2: 2 log lines, 2 metrics records"
  else fail "--eval-every 2: $lines log lines, $records metrics records (expected 2 each)"; cat "$tmp/train.log"; fi
else
  fail "training with --eval-every exited non-zero"; tail -n 5 "$tmp/train.log"
fi

# --eval on the trained model (its file, and its checkpoint via --resume) gives the accuracy the
# run logged after its last step.
logged=$(grep -E '^step 3/3 \| hellaswag' "$tmp/train.log" | sed 's/^step 3\/3 | //')
for source in "--init-from $tmp/train/model.bin" "--resume $tmp/train/checkpoint_00000003"; do
  # shellcheck disable=SC2086  # $source is two words: the flag and its path
  if "$bin" --eval $source --eval-data "$tmp/eval.bin" --batch-size 2 --seq-len $T >"$tmp/after.log" 2>&1 &&
      [ -n "$logged" ] && grep -qF "$logged | " "$tmp/after.log"; then
    echo "ok: --eval ${source%% *} of the trained model: $logged"
  else
    fail "--eval ${source%% *} of the trained model does not give the logged '$logged': $(tail -n 2 "$tmp/after.log")"
  fi
done

# Bad inputs: one line on stderr naming the file, non-zero exit.
"$python" - "$tmp/eval.bin" "$tmp" <<'PY'
import sys
d = bytearray(open(sys.argv[1], "rb").read())
bad = bytearray(d); bad[0] ^= 1
open(sys.argv[2] + "/bad_magic.bin", "wb").write(bad)
bad = bytearray(d); bad[1024 + 12:1024 + 14] = (1000).to_bytes(2, "little")  # first context token (vocab 300)
open(sys.argv[2] + "/bad_token.bin", "wb").write(bad)
open(sys.argv[2] + "/truncated.bin", "wb").write(d[:len(d) - 7])
PY
expect_bad() {
  local file=$1 want=$2
  if "$bin" --eval --init-from "$model" --eval-data "$tmp/$file" --seq-len $T >"$tmp/out" 2>"$tmp/err"; then
    fail "$file: exit 0"
  elif [ "$(wc -l <"$tmp/err")" -ne 1 ] || ! grep -q "$tmp/$file" "$tmp/err" || ! grep -q "$want" "$tmp/err"; then
    fail "$file: expected one line naming the file and '$want', got: $(cat "$tmp/err")"
  else
    echo "ok: $file: $(cat "$tmp/err")"
  fi
}
expect_bad bad_magic.bin "magic number"
expect_bad bad_token.bin "token 1000"
expect_bad truncated.bin "truncated"
if "$bin" --eval --init-from "$model" --seq-len $T >"$tmp/out" 2>"$tmp/err" || ! grep -q -- "--eval-data" "$tmp/err"; then
  fail "--eval without --eval-data: $(cat "$tmp/err")"
fi

# data/hellaswag.sh without a network (a closed local port): a clear error, non-zero exit.
if HELLASWAG_URL=http://127.0.0.1:9/hellaswag_val.jsonl bash data/hellaswag.sh "$tmp/hs" >"$tmp/hs.log" 2>&1; then
  fail "data/hellaswag.sh succeeded without a network"
elif grep -q "hellaswag: cannot download" "$tmp/hs.log"; then
  echo "ok: data/hellaswag.sh without a network: $(grep 'cannot download' "$tmp/hs.log")"
else
  fail "data/hellaswag.sh without a network: $(cat "$tmp/hs.log")"
fi
[ "$failures" -eq 0 ]
