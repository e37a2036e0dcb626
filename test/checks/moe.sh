#!/usr/bin/env bash
# Mixtures of experts end to end (src/model/expert_mlp.h, docs/MOE.md) on the tiny Mixtral of
# dev/mixtral_reference.py (4 experts, top-2, aux coefficient 0.02), fp32:
#   - metrics.jsonl has each step's routing: aux_loss, expert_tokens (every layer's rows × K) and
#     expert_imbalance; the step line shows aux and imbalance;
#   - --moe-balanced-routing 1 routes exactly as many rows to each expert;
#   - --recompute 3 (the backward reruns the experts) gives the same records bit for bit;
#   - data parallel over 2 ranks (ZeRO 1 and ZeRO 3) gives one process's records with the same
#     micro-batches (gradient accumulation 2: each micro-batch's auxiliary loss is its own) within 1e-5,
#     the router figures too (summed over the ranks);
#   - a run resumed from step 2's checkpoint gives step 3's records within 1e-5;
#   - a random Hugging Face Mixtral directory (dev/hf_llama_check.py make --experts) loads with the
#     validation loss of the script's own forward, --export-hf writes model.bin's tensors back as a
#     MixtralForCausalLM, and a step from the export equals a step from model.bin byte for byte;
#   - --plan shows a Mixtral 8x7B's memory;
#   - the sigmoid router (dev/mixtral_reference.py --router sigmoid) with its balancing bias: 3 steps
#     equal 2 steps + --resume bit for bit (records and model.bin: the bias travels as a parameter,
#     its fp32 master in the checkpoint), the bias moves, and data parallel over 2 ranks (ZeRO 1
#     and ZeRO 3: each rank updates its own shard of the bias from the counts summed over both)
#     equals one process with gradient accumulation 2 within 1e-5, model.bin's bias exactly.
# Refusals are cli_errors.sh's.
# usage: moe.sh cpu|gpu
set -u
# shellcheck source=test/checks/lib/trainer.sh
source "$(dirname "$0")/lib/trainer.sh" "$@"
tiny_mixtrals
common=(--init-from "$mref/model.bin" --train-data "$mref/train.bin" --val-data "$mref/train.bin" --dtype fp32
        --shuffle 0 --batch-size 1 --seq-len 32 --total-batch-tokens 64 --lr 1e-3 --lr-schedule constant
        --warmup-steps 0 --val-every 2 --checkpoint-every 2)

run one 1 --max-steps 3 --val-steps 2
grep -qE '^step 1/3 .* \| aux [0-9.]+ \| imbalance [0-9.]+' "$tmp/one.log" || fail "the step line shows no aux/imbalance"
"$python" - "$tmp/one/metrics.jsonl" <<'PY' || fail "metrics.jsonl's routing records"
import json, sys
steps = [r for r in map(json.loads, open(sys.argv[1])) if "train_loss" in r]
assert len(steps) == 3, steps
for r in steps:
    tokens = r["expert_tokens"]
    # L=2 layers x 2 micro-batches x 32 rows x K=2 choices
    assert len(tokens) == 4 and sum(tokens) == 2 * 2 * 32 * 2, tokens
    assert abs(r["expert_imbalance"] - max(tokens) * 4 / sum(tokens)) < 1e-9, r
    assert 0 < r["aux_loss"] < 4, r  # E * sum(f*P): K for a uniform router, at most E = 4
PY

# --moe-balanced-routing (timing only): 2 layers x 64 rows x K=2 over E=4 experts, exactly 64 each.
run balanced 1 --max-steps 1 --val-steps 1 --moe-balanced-routing 1
"$python" - "$tmp/balanced/metrics.jsonl" <<'PY' || fail "--moe-balanced-routing did not balance the experts"
import json, sys
r = [r for r in map(json.loads, open(sys.argv[1])) if "train_loss" in r][0]
assert r["expert_tokens"] == [64] * 4 and r["expert_imbalance"] == 1.0, r
PY

# Records without their timing fields, equal.
same_records() {
  "$python" - "$tmp/$1/metrics.jsonl" "$tmp/$2/metrics.jsonl" <<'PY' || fail "$2's records differ from $1's"
import json, sys
a, b = ([{k: v for k, v in json.loads(l).items() if k not in ("ms", "tokens_per_s", "mfu")} for l in open(p)]
        for p in sys.argv[1:3])
if a != b:
    for x, y in zip(a, b):
        if x != y: print(f"  {x}\n  {y}"); break
    sys.exit(1)
PY
}
run recompute3 1 --max-steps 3 --val-steps 2 --recompute 3 && same_records one recompute3

require_ranks 2
run dp2 2 --max-steps 3 --val-steps 1 --zero 1 && same_steps one dp2 1e-5 && same_routing one dp2 1e-5
run dp2_zero3 2 --max-steps 3 --val-steps 1 --zero 3 && same_steps one dp2_zero3 1e-5

run resumed 1 --max-steps 2 --val-steps 2 && run resumed 1 --max-steps 3 --val-steps 2 --resume auto && same_step3 one resumed

# Hugging Face Mixtral directories in and out.
check=(dev/hf_llama_check.py)
data=(--train-data "$mref/train.bin" --val-data "$mref/train.bin" --val-steps 1 --batch-size 2 --seq-len 32 --dtype fp32)
"$python" "${check[@]}" make "$tmp/M" --experts 4 --top-k 2 --aux-loss-coef 0.02 >/dev/null || fail "hf_llama_check.py make --experts"
loss=$("$bin" --init-from "$tmp/M" "${data[@]}" --max-steps 0 2>&1 | sed -nE 's/^val loss ([0-9.]+) .*/\1/p')
[ -n "$loss" ] || fail "no validation loss from --init-from a Mixtral directory"
"$python" "${check[@]}" check "$tmp/M" --data "$mref/train.bin" --batch 2 --seq-len 32 --loss "${loss:-0}" >"$tmp/M.check" ||
  { fail "--init-from a Mixtral directory: the loss is not the Hugging Face forward's"; cat "$tmp/M.check"; }
step() {  # step SOURCE NAME FLAGS...: one fp32 step into $tmp/NAME
  local source=$1 name=$2
  shift 2
  "$bin" --init-from "$source" "${data[@]}" --max-steps 1 --val-every 0 --save-dtype fp32 --out-dir "$tmp/$name" "$@" \
    >"$tmp/$name.log" 2>&1 || { fail "$name: exited non-zero"; tail -n 5 "$tmp/$name.log"; }
}
step "$tmp/M" hf_run --export-hf "$tmp/E"
grep -q '"MixtralForCausalLM"' "$tmp/E/config.json" || fail "--export-hf of experts did not write a MixtralForCausalLM"
"$python" "${check[@]}" check "$tmp/E" --model-bin "$tmp/hf_run/model.bin" >"$tmp/E.check" ||
  { fail "the exported Mixtral is not model.bin's model"; cat "$tmp/E.check"; }
step "$tmp/hf_run/model.bin" from_bin
step "$tmp/E" from_hf
cmp -s "$tmp/from_bin/model.bin" "$tmp/from_hf/model.bin" || fail "a step from the export differs from one from model.bin"

"$bin" --plan --model mixtral-8x7b --seq-len 4096 --batch-size 1 --world-size 16 --zero 3 --recompute 3 \
  --gpu-memory 80 >"$tmp/plan.log" 2>&1 || fail "--plan of mixtral-8x7b exited non-zero"
grep -q "E=8 K=2 softmax router (46,702,792,704 parameters)" "$tmp/plan.log" || fail "--plan: no Mixtral 8x7B"

# The sigmoid router: its model.bin (router kind 1, expert_bias zeros), a fast bias rate, bf16 (the
# bias lives in the fp32 master weights: a master not updated would never move the bf16 bias); the
# data-parallel comparison in fp32.
common=(--init-from "$sref/model.bin" --train-data "$mref/train.bin" --val-data "$mref/train.bin" --moe-bias-rate 0.01
        --shuffle 0 --batch-size 1 --seq-len 32 --total-batch-tokens 64 --lr 1e-3 --lr-schedule constant
        --warmup-steps 0 --val-every 2 --checkpoint-every 2 --save-dtype fp32)
# bias DIR: model.bin's expert_bias (L × E) as JSON (before lnfw and lm_head: L=2, E=8, C=64, Vp=256).
bias() {
  "$python" - "$tmp/$1/model.bin" <<'PY'
import json, sys
import numpy as np
body = np.fromfile(sys.argv[1], dtype="<f4", offset=1024)
tail = 64 + 256 * 64  # lnfw, then lm_head (Vp × C)
print(json.dumps(body[-tail - 16:-tail].tolist()))
PY
}
run s_one 1 --max-steps 3 --val-steps 2
run s_resumed 1 --max-steps 2 --val-steps 2 && run s_resumed 1 --max-steps 3 --val-steps 2 --resume auto &&
  same_step3 s_one s_resumed && same_records s_one s_resumed
cmp -s "$tmp/s_one/model.bin" "$tmp/s_resumed/model.bin" || fail "sigmoid: 2 steps + resume differ from 3 steps (model.bin)"
one_bias=$(bias s_one)
"$python" -c 'import json, sys; b = json.loads(sys.argv[1]); assert len(b) == 16 and any(b) and all(abs(abs(x) - k * 0.01) <= 0.01 / 64 and k <= 3 for x in b for k in [round(abs(x) / 0.01)]), b' "$one_bias" ||
  fail "sigmoid: the bias did not move by multiples of the rate ($one_bias)"
run s_dp2 2 --max-steps 3 --val-steps 1 --zero 1 --dtype fp32 && run s_accum 1 --max-steps 3 --val-steps 2 --dtype fp32 &&
  same_steps s_accum s_dp2 1e-5
[ "$(bias s_dp2)" = "$(bias s_accum)" ] || fail "sigmoid: DP 2's bias $(bias s_dp2) differs from one process's $(bias s_accum)"
run s_dp2_zero3 2 --max-steps 3 --val-steps 1 --zero 3 --dtype fp32 && same_steps s_accum s_dp2_zero3 1e-5
[ "$(bias s_dp2_zero3)" = "$(bias s_accum)" ] || fail "sigmoid: ZeRO 3's bias differs from one process's"

[ "$failures" -eq 0 ] || exit 1
echo "moe: routing records, recompute, data parallel, resume, Hugging Face Mixtral, --plan and the sigmoid router OK"
