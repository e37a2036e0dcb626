#!/usr/bin/env bash
# Mixtures of experts under pipeline parallelism (--pp with experts, and --pp with --ep; docs/MOE.md
# "Pipeline parallelism"): the load-balancing loss pools every layer of a micro-batch, so its
# routing counts and probability sums travel along the pipeline with the activations and back with
# the gradients (expert_mlp.h's routing tail). On a 4-layer tiny Mixtral (dev/mixtral_reference.py:
# 4 experts, top-2, aux coefficient 0.02), fp32, 4 micro-batches per step, the per-step loss,
# gradient norm, auxiliary loss and validation loss equal one pipeline stage's (--pp 1) within 1e-6,
# and the expert token counts exactly (every stage reports the whole model's):
#   - 2 ranks at --pp 2 with 1f1b (two layers per stage), interleaved (--pp-virtual 2: one layer per
#     chunk, two chunks per rank), zb-h1 (--recompute 0: the experts' weight gradients stay in the
#     input backward) and 1f1b at --recompute 3 (the backward reruns each block);
#   - 4 ranks at --pp 2 --tp 2 (each TP rank's tail its own rows', pooled over the TP group);
#   - 4 ranks at --pp 2 --ep 2 (each stage's two data-parallel ranks one EP group; several
#     micro-batches in flight, each with its own routes) against 2 data-parallel ranks at --pp 1;
#   - the sigmoid router (build/reference/mixtral-sigmoid, 2 layers: one per stage) at --pp 2, its
#     balancing bias moving at --moe-bias-rate 0.05 by each stage's own layers' counts;
#   - a checkpoint written at --pp 2 resumes on one process with the uninterrupted run's step 3;
#   - --plan --pp 2 with experts counts the routing tail in what each stage sends.
# usage: moe_pp.sh cpu|gpu
set -u
# shellcheck source=test/checks/lib/trainer.sh
source "$(dirname "$0")/lib/trainer.sh" "$@"
tiny_mixtrals
require_ranks 4
"$python" dev/mixtral_reference.py --experts 4 --top-k 2 --no-tied --rope 3.1 --seed 23 --layers 4 --steps 1 \
  --aux-loss-coef 0.02 --out "$tmp/mixtral4" >/dev/null 2>&1 || { echo "FAIL: dev/mixtral_reference.py --layers 4"; exit 1; }
common=(--init-from "$tmp/mixtral4/model.bin" --train-data "$mref/train.bin" --val-data "$mref/train.bin" --dtype fp32
        --shuffle 0 --batch-size 1 --seq-len 32 --lr 1e-3 --lr-schedule constant --warmup-steps 0 --max-steps 3
        --val-every 2 --val-steps 1 --save 0 --total-batch-tokens 128)

run pp1 1
run pp2 2 --pp 2 && same_steps pp1 pp2 1e-6 && same_routing pp1 pp2 1e-6
run interleaved 2 --pp 2 --pp-schedule interleaved --pp-virtual 2 &&
  same_steps pp1 interleaved 1e-6 && same_routing pp1 interleaved 1e-6
run zb 2 --pp 2 --pp-schedule zb-h1 --recompute 0 && same_steps pp1 zb 1e-6 && same_routing pp1 zb 1e-6
run pp2_recompute3 2 --pp 2 --recompute 3 &&
  same_steps pp1 pp2_recompute3 1e-6 && same_routing pp1 pp2_recompute3 1e-6
# With --tp 2 too: each TP rank's tail carries its rows' figures, summed over the TP group before use.
run pp2_tp2 4 --pp 2 --tp 2 && same_steps pp1 pp2_tp2 1e-6 && same_routing pp1 pp2_tp2 1e-6

softmax=("${common[@]}")
with_flags softmax --total-batch-tokens 256  # 4 micro-batches per data-parallel rank
common=("${flags[@]}")
run dp2 2
run pp2_ep2 4 --pp 2 --ep 2 && same_steps dp2 pp2_ep2 1e-6 && same_routing dp2 pp2_ep2 1e-6
common=("${softmax[@]}")

with_flags common --init-from "$sref/model.bin" --train-data "$sref/train.bin" --val-data "$sref/train.bin" \
  --moe-bias-rate 0.05
common=("${flags[@]}")
run sigmoid_pp1 1 && run sigmoid_pp2 2 --pp 2 &&
  same_steps sigmoid_pp1 sigmoid_pp2 1e-6 && same_routing sigmoid_pp1 sigmoid_pp2 1e-6
common=("${softmax[@]}")

# A checkpoint written at --pp 2 (each stage's experts and routers) resumes on one process with the
# uninterrupted run's step 3.
with_flags softmax --save 1 --checkpoint-every 2 --max-steps 2
common=("${flags[@]}")
run ck_pp2 2 --pp 2
common=("${softmax[@]}")
run ck_resumed 1 --resume "$tmp/ck_pp2/checkpoint_00000002" && same_step3 pp1 ck_resumed

# Each stage sends 4 activations (or gradients) of 32 rows x 64 fp32 (8192 B) and 4 routing tails
# of 8·E = 32 B per step.
with_flags common --pp 2 --plan --world-size 2
if "$bin" "${flags[@]}" >"$tmp/plan.log" 2>&1; then
  [ "$(grep -c 'sends 32896 B per step in 4 transfer(s)' "$tmp/plan.log")" -eq 2 ] ||
    fail "--plan --pp 2 with experts: expected each stage to send 4 x (8192 + 32) B; got: $(grep sends "$tmp/plan.log")"
else
  fail "--plan --pp 2 with experts exited non-zero"; tail -n 5 "$tmp/plan.log"
fi

[ "$failures" -eq 0 ] && echo "moe_pp: every pipeline run with experts equals --pp 1"
[ "$failures" -eq 0 ]
