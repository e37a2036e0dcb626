#!/usr/bin/env bash
# Mixtures of experts under tensor parallelism (--tp with sequence parallelism; docs/MOE.md): the
# attention is split over the TP group as for any Llama, while each TP rank runs the router and the
# whole experts on its own rows of the sequence-parallel region, the experts' and router's
# gradients summed over the group like the norms', the micro-batch's routing figures pooled. On the
# tiny Mixtral of dev/mixtral_reference.py (4 experts, top-2, aux coefficient 0.02), fp32, 2
# micro-batches per step, the per-step loss, gradient norm and validation loss equal one process's
# within 1e-6 and so do the router's figures (each expert's tokens exactly, the aux loss):
#   - 2 ranks at --tp 2, at --recompute 0, 1, 2 and 3 (the collectives of each equal --plan's);
#   - 4 ranks at --tp 2 (two data-parallel replicas) at ZeRO 0, 1, 2 and 3, and with --ep 2 (each
#     TP rank's rows sent to the experts of the other replica's same TP rank; the attention's
#     gradients summed over the EP group, the experts' over the TP group), equal to 2 data-parallel
#     ranks;
#   - the sigmoid router (its balancing bias moved by the counts of both TP ranks' rows), also at
#     --tp 2 --ep 2 on 4 ranks;
#   - a checkpoint written at --tp 2 resumes at --tp 2 and 1, one written at --tp 1 at --tp 2, and
#     one written at --tp 2 --ep 2 at --tp 2 --ep 2, --tp 2 alone and --ep 2 alone, with the
#     uninterrupted run's step 3.
# The refusal of --sequence-parallel 0 is cli_errors.sh's.
# usage: moe_tp.sh cpu|gpu
set -u
# shellcheck source=test/checks/lib/trainer.sh
source "$(dirname "$0")/lib/trainer.sh" "$@"
tiny_mixtrals

require_ranks 2
run tp1 1 --total-batch-tokens 64
for r in 0 1 2 3; do
  run "tp2_recompute$r" 2 --tp 2 --recompute "$r" --total-batch-tokens 64 &&
    same_steps tp1 "tp2_recompute$r" 1e-6 && same_routing tp1 "tp2_recompute$r" 1e-6 &&
    plan_matches "tp2_recompute$r" 2 "tensor-parallel communication" --tp 2 --recompute "$r" --total-batch-tokens 64
done

# The sigmoid router: its bias moves by the counts of every TP rank's rows.
softmax=("${common[@]}")
with_flags softmax --init-from "$sref/model.bin" --moe-bias-rate 0.05
sigmoid=("${flags[@]}")
common=("${sigmoid[@]}")
run s_tp1 1 --total-batch-tokens 64
run s_tp2 2 --tp 2 --total-batch-tokens 64 && same_steps s_tp1 s_tp2 1e-6 && same_routing s_tp1 s_tp2 1e-6 &&
  plan_matches s_tp2 2 "tensor-parallel communication" --tp 2 --total-batch-tokens 64
common=("${softmax[@]}")

require_ranks 4
run dp2 2 --total-batch-tokens 128
for zero in 0 1 2 3; do
  run "dp2_tp2_zero$zero" 4 --tp 2 --zero "$zero" --total-batch-tokens 128 && same_steps dp2 "dp2_tp2_zero$zero" 1e-6 &&
    same_routing dp2 "dp2_tp2_zero$zero" 1e-6
  run "tp2_ep2_zero$zero" 4 --tp 2 --ep 2 --zero "$zero" --total-batch-tokens 128 &&
    same_steps dp2 "tp2_ep2_zero$zero" 1e-6 && same_routing dp2 "tp2_ep2_zero$zero" 1e-6
done
plan_matches tp2_ep2_zero1 4 "tensor-parallel communication" --tp 2 --ep 2 --zero 1 --total-batch-tokens 128
common=("${sigmoid[@]}")  # the bias moved by the counts of every TP, EP and data-parallel rank
run s_dp2 2 --total-batch-tokens 128 && run s_tp2_ep2 4 --tp 2 --ep 2 --total-batch-tokens 128 &&
  same_steps s_dp2 s_tp2_ep2 1e-6 && same_routing s_dp2 s_tp2_ep2 1e-6
common=("${softmax[@]}")

# Checkpoints at step 2, resumed at another --tp (its ranks the TP group's): the uninterrupted run's
# step 3.
with_flags softmax --save 1 --checkpoint-every 2 --total-batch-tokens 64
three=("${flags[@]}")
with_flags three --max-steps 2
common=("${flags[@]}")
run ck_tp2 2 --tp 2 && run ck_tp1 1
cp -r "$tmp/ck_tp2" "$tmp/ck_tp2_to1"
cp -r "$tmp/ck_tp1" "$tmp/ck_tp1_to2"
common=("${three[@]}")
run ck_full 2 --tp 2
run ck_tp2 2 --tp 2 --resume auto && same_step3 ck_full ck_tp2
run ck_tp2_to1 1 --resume auto && same_step3 ck_full ck_tp2_to1
run ck_tp1_to2 2 --tp 2 --resume auto && same_step3 ck_full ck_tp1_to2
# The same over 4 ranks with --ep 2 (2 data-parallel replicas, ZeRO 1).
with_flags softmax --save 1 --checkpoint-every 2 --total-batch-tokens 128 --zero 1
three=("${flags[@]}")
with_flags three --max-steps 2
common=("${flags[@]}")
run ck_tp2_ep2 4 --tp 2 --ep 2
for to in tp2 ep2; do cp -r "$tmp/ck_tp2_ep2" "$tmp/ck_tp2_ep2_to_$to"; done
common=("${three[@]}")
run ck_full_4 4 --tp 2 --ep 2
run ck_tp2_ep2 4 --tp 2 --ep 2 --resume auto && same_step3 ck_full_4 ck_tp2_ep2
run ck_tp2_ep2_to_tp2 4 --tp 2 --resume auto && same_step3 ck_full_4 ck_tp2_ep2_to_tp2
run ck_tp2_ep2_to_ep2 2 --ep 2 --resume auto && same_step3 ck_full_4 ck_tp2_ep2_to_ep2

[ "$failures" -eq 0 ] && echo "moe_tp: every tensor-parallel mixture equals one process"
[ "$failures" -eq 0 ]
