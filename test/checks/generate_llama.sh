#!/usr/bin/env bash
# Text generation from a Llama 3 model end to end (src/gen/; the decoder itself is checked against
# the training forward in test/model/test_generate.cu):
#  1. a 2-step llama-nano run (GQA, RoPE, SwiGLU) on Llama 3 shards of the docs, with
#     --sample-every 1, logs two samples that continue --prompt, decoded with Llama 3's tokenizer
#     (found without --vocab-dir), and records them in metrics.jsonl;
#  2. --generate on the run's model.bin: the prompt is BOS + its 2 tokens (3 in the summary), and
#     greedy text equals the step-2 sample (both greedy on the final weights);
#  3. a missing Llama 3 vocabulary is one line naming --vocab-dir and scripts/install_deps.sh.
# usage: generate_llama.sh cpu|gpu
# Exits 77 when data/llama3_bpe/tokenizer.model is missing because scripts/install_deps.sh could
# not fetch it (as tokenizer_llama3.sh).
set -u
# shellcheck source=test/checks/lib/trainer.sh
source "$(dirname "$0")/lib/trainer.sh" "$@"
vocab=data/llama3_bpe/tokenizer.model
if [ ! -f "$vocab" ] && [ -f data/llama3_bpe/fetch_failed.txt ]; then
  echo "skipped: $vocab is missing and scripts/install_deps.sh could not fetch it"
  exit 77
fi
require_files "$bin" ./tokenize "$vocab"
./tokenize --encoding llama3 --out-dir "$tmp/data" --name doc docs/*.md README.md >/dev/null 2>&1 ||
  { echo "FAIL: tokenize --encoding llama3"; exit 1; }

# 1. Samples during a 2-step run.
out=$tmp/run
if "$bin" --model llama-nano --train-data "$tmp/data/doc_train_*.bin" --val-every 0 --batch-size 1 --seq-len 32 \
     --max-steps 2 --dtype fp32 --out-dir "$out" --sample-every 1 --prompt "Once upon" --max-new-tokens 8 \
     --temperature 0 >"$tmp/train.log" 2>&1; then
  [ "$(grep -c '^step [12]/2 | sample: "Once upon' "$tmp/train.log")" -eq 2 ] ||
    fail "training log: expected 2 sample lines: $(grep sample "$tmp/train.log")"
  last=$("$python" - "$out/metrics.jsonl" <<'EOF'
import json, sys
samples = [(r["step"], r["sample"]) for r in map(json.loads, open(sys.argv[1])) if "sample" in r]
assert [s for s, _ in samples] == [1, 2], samples
assert all(text.startswith("Once upon") and len(text) > len("Once upon") for _, text in samples), samples
print(samples[-1][1], end="")
EOF
) || fail "metrics.jsonl: expected sample records at steps 1 and 2"

  # 2. --generate on the run's model file.
  gen=(--generate --init-from "$out/model.bin" --prompt "Once upon" --max-new-tokens 8 --temperature 0 --dtype fp32)
  if text=$("$bin" "${gen[@]}" 2>"$tmp/gen.err"); then
    grep -q "after a 3-token prompt (greedy" "$tmp/gen.err" ||
      fail "--generate: expected BOS + 2 prompt tokens: $(cat "$tmp/gen.err")"
    [ "$text" = "$last" ] || fail "--generate on model.bin: '$text', the step-2 sample: '$last'"
  else
    fail "--generate on the Llama model failed: $(cat "$tmp/gen.err")"
  fi

  # 3. A missing vocabulary.
  if err=$("$bin" "${gen[@]}" --vocab-dir "$tmp/none" 2>&1 >/dev/null); then
    fail "--generate with a missing Llama 3 vocabulary succeeded"
  elif [ "$(printf '%s\n' "$err" | wc -l)" -ne 1 ] ||
       [[ $err != *"--vocab-dir $tmp/none"*"scripts/install_deps.sh"* ]]; then
    fail "a missing Llama 3 vocabulary: expected one line naming --vocab-dir and scripts/install_deps.sh, got: $err"
  fi
else
  fail "the llama-nano run with --sample-every failed: $(tail -n 3 "$tmp/train.log")"
fi

[ "$failures" -eq 0 ] && echo "generate_llama: all checks passed"
[ "$failures" -eq 0 ]
