#!/usr/bin/env bash
# --plan (src/run/memory_plan.h) end to end: the table without a GPU run or data, ZeRO and
# --world-size in it, the batch sizes that fit (a plan that does not fit exits 2); Llama 3's plans
# (3.1 8B on 8 x 80 GB at ZeRO 1; 70B with TP 8 at ZeRO 3 on 2 nodes; a TP size that splits a K/V
# head refused); a run whose plan
# exceeds --gpu-memory stops before allocating, with the table and one line naming the flag, and
# leaves --out-dir alone;
# impossible settings give one line and a non-zero exit.
# usage: memory_plan.sh cpu|gpu
set -u
# shellcheck source=test/checks/lib/trainer.sh
source "$(dirname "$0")/lib/trainer.sh" "$@"
require_files "$bin"

# The plan needs neither data nor an output directory: point both at nothing.
plan=("$bin" --plan --train-data "$tmp/none_*.bin" --out-dir "$tmp/never")
if out=$("${plan[@]}" --model d12 --batch-size 64 --seq-len 1024 --gpu-memory 80 2>&1) &&
   grep -q "^  total per rank  *17.49 GiB of 80.00 GiB: fits$" <<<"$out" &&
   grep -q "^largest --batch-size that fits 80.00 GiB: --recompute 0: [0-9]*, --recompute 1: [0-9]*," <<<"$out" &&
   [ ! -e "$tmp/never" ]; then
  echo "ok: --plan for GPT-2 124M, B=64 T=1024: $(grep 'total per rank' <<<"$out" | tr -s ' ')"
else
  fail "--plan for GPT-2 124M:"; echo "$out"
fi
# A plan that does not fit: exit status 2 (scripts can test it).
status=0
out=$("${plan[@]}" --model d12 --batch-size 64 --zero 1 --world-size 8 --gpu-memory 10 2>&1) || status=$?
if [ "$status" -eq 2 ] && grep -q "ZeRO stage 1 over 8 rank(s)" <<<"$out" &&
   grep -q "of 10.00 GiB: does NOT fit" <<<"$out"; then
  echo "ok: --plan --zero 1 --world-size 8 --gpu-memory 10: does not fit (status 2), and says which batch sizes do"
else
  fail "--plan with ZeRO-1 over 8 ranks:"; echo "$out"
fi

# Llama 3.1 8B, T = 8192, on 8 x 80 GB at ZeRO 1: parameters, gradients, optimizer state and the
# RoPE table (8192 x 128 fp32), 72.82 GiB in all.
if out=$("${plan[@]}" --model llama3.1-8b --seq-len 8192 --batch-size 1 --zero 1 --world-size 8 --gpu-memory 80 2>&1) &&
   grep -q "(8,030,261,248 parameters) from preset llama3.1-8b, .* ZeRO stage 1 over 8 rank(s)$" <<<"$out" &&
   grep -q "^  RoPE table (fp32)  *4.0 MiB$" <<<"$out" &&
   grep -q "^  total per rank  *72.82 GiB of 80.00 GiB: fits$" <<<"$out"; then
  echo "ok: --plan for Llama 3.1 8B on 8 x 80 GB at ZeRO 1: $(grep 'total per rank' <<<"$out" | tr -s ' ')"
else
  fail "--plan for Llama 3.1 8B:"; echo "$out"
fi
# Llama 3.1 70B, TP 8 (sequence parallel) x 2 nodes at ZeRO 3, --recompute 3: fits; at --recompute 1
# it does not (exit 2).
seventy=(--model llama3.1-70b --seq-len 8192 --batch-size 1 --tp 8 --sequence-parallel 1 --zero 3 --world-size 16
         --total-batch-tokens 16384 --gpu-memory 80)
if out=$("${plan[@]}" "${seventy[@]}" --recompute 3 2>&1) &&
   grep -q "ZeRO stage 3 over 16 rank(s) in tensor-parallel groups of 8 (sequence parallel)$" <<<"$out" &&
   grep -q "^  total per rank  *70.55 GiB of 80.00 GiB: fits$" <<<"$out" &&
   grep -q "^tensor-parallel communication per optimizer step" <<<"$out"; then
  echo "ok: --plan for Llama 3.1 70B, TP 8 x 2 at ZeRO 3: $(grep 'total per rank' <<<"$out" | tr -s ' ')"
else
  fail "--plan for Llama 3.1 70B at TP 8, ZeRO 3:"; echo "$out"
fi
status=0
out=$("${plan[@]}" "${seventy[@]}" --recompute 1 2>&1) || status=$?
if [ "$status" -ne 2 ] || ! grep -q "does NOT fit" <<<"$out"; then
  fail "70B at --recompute 1 on 2 nodes: status $status"; echo "$out"
fi

# A run that would not fit stops before allocating anything or touching --out-dir.
if "$bin" --model d12 --batch-size 4 --seq-len 64 --gpu-memory 0.5 --max-steps 1 --out-dir "$tmp/run" \
    >"$tmp/out" 2>"$tmp/err"; then
  fail "a run over --gpu-memory exited 0"
elif [ "$(wc -l <"$tmp/err")" -eq 1 ] && grep -q "error: the run needs .* per rank and --gpu-memory is 512.0 MiB; largest --batch-size that fits" "$tmp/err" &&
     grep -q "does NOT fit" "$tmp/out" && [ ! -e "$tmp/run" ]; then
  echo "ok: a run over --gpu-memory: $(cat "$tmp/err")"
else
  fail "a run over --gpu-memory:"; cat "$tmp/out" "$tmp/err"
fi

for spec in "--plan --model d12 --seq-len 2048|--seq-len 2048 exceeds the maximum sequence length 1024" \
            "--plan --resume auto|--plan takes the architecture from --model or --init-from" \
            "--world-size 4|--world-size is for --plan only" \
            "--plan --gpu-memory -1|--gpu-memory: expected" \
            "--plan --model llama3.1-70b --tp 16 --world-size 16|--tp 16: each rank holds whole K/V heads, so it must divide NKV = 8"; do
  read -r -a flags <<<"${spec%%|*}"
  pattern=${spec#*|}
  if "$bin" "${flags[@]}" >"$tmp/out" 2>"$tmp/err"; then
    fail "${spec%%|*}: exited 0"
  elif [ "$(wc -l <"$tmp/err")" -eq 1 ] && grep -qF -- "$pattern" "$tmp/err"; then
    echo "ok: ${spec%%|*}: $(cat "$tmp/err")"
  else
    fail "${spec%%|*}: expected one line with '$pattern', got:"; cat "$tmp/err"
  fi
done
[ "$failures" -eq 0 ]
