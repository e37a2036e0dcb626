#!/usr/bin/env bash
# Llama 3 under the parallelisms against one process with the same global batch: a random
# llama-nano (GQA: 4 query heads on 2 K/V heads, RoPE, SwiGLU, tied) on Llama 3 token shards,
# fp32, 3 steps, at 2 ranks with ZeRO 3 (parameters sharded) and with TP 2 and sequence
# parallelism (K/V heads split by rank) must reproduce the single process's per-step losses,
# gradient norms and validation losses within 1e-5; the TP 2 run's step-2 checkpoint resumes on
# one rank (resharded) and its step 3 matches too; and TP 2 on llama-micro (one K/V head) is
# refused in one line naming NKV.
# usage: llama_parallel.sh cpu|gpu   (gpu: needs 2 GPUs, else skipped)
set -u
# shellcheck source=test/checks/lib/trainer.sh
source "$(dirname "$0")/lib/trainer.sh" "$@"
require_files "$bin" ./tokenize
require_ranks 2
[ -s data/llama3_bpe/tokenizer.model ] || { echo "skipped: Llama 3's vocabulary is missing (scripts/install_deps.sh)"; exit 77; }
./tokenize --encoding llama3 --out-dir "$tmp/data" --name doc --val-tokens 2000 docs/*.md README.md >/dev/null 2>&1 ||
  { echo "FAIL: tokenize --encoding llama3"; exit 1; }

common=(--model llama-nano --train-data "$tmp/data/doc_train_*.bin" --val-data "$tmp/data/doc_val_*.bin" --seq-len 32
        --max-steps 3 --val-every 2 --val-steps 1 --dtype fp32 --seed 7 --bucket-mib 0.1)
run single 1 --batch-size 2 --save 0 && run zero3 2 --batch-size 1 --zero 3 --save 0 && same_steps single zero3 1e-5
run tp2 2 --batch-size 2 --tp 2 --sequence-parallel 1 --checkpoint-every 2 && same_steps single tp2 1e-5
run resumed 1 --batch-size 2 --save 0 --resume "$tmp/tp2/checkpoint_00000002" && same_step3 single resumed
if mpirun -np 2 "${mpi_opts[@]}" "$bin" --model llama-micro --train-data "$tmp/data/doc_train_*.bin" --seq-len 32 \
    --max-steps 1 --save 0 --tp 2 --out-dir "$tmp/refused" >"$tmp/refused.log" 2>&1; then
  fail "TP 2 with one K/V head: exited 0"
fi
grep -q -- "--tp 2: each rank holds whole K/V heads, so it must divide NKV = 1" "$tmp/refused.log" ||
  fail "TP 2 with one K/V head: no line naming NKV: $(head -n 3 "$tmp/refused.log")"
! grep -q '^step ' "$tmp/refused.log" || fail "TP 2 with one K/V head: it trained"
[ "$failures" -eq 0 ] && echo "llama_parallel: ZeRO 3 and TP 2 + SP match one process, TP 2 resumes on one rank; NKV % TP refused"
exit $((failures > 0))
