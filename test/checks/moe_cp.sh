#!/usr/bin/env bash
# Mixtures of experts under context parallelism (--cp; docs/MOE.md "Context parallelism"): each CP
# rank runs the router and experts on its own tokens of every sequence, and the auxiliary loss pools
# the micro-batch's rows over the CP group (its ranks hold parts of one micro-batch). On the tiny
# Mixtral of dev/mixtral_reference.py (4 experts, top-2, aux coefficient 0.02), fp32, 2
# micro-batches per step, the per-step loss, gradient norm, validation loss and router figures
# (each expert's tokens exactly, the aux loss) equal one process's within 1e-6:
#   - 2 ranks at --cp 2, at --recompute 1 and 3;
#   - 4 ranks at --cp 2 --tp 2;
#   - 4 ranks at --cp 2 --ep 2 (the EP group is the CP group) equal --cp 2 --ep 1.
# usage: moe_cp.sh cpu|gpu
set -u
# shellcheck source=test/checks/lib/trainer.sh
source "$(dirname "$0")/lib/trainer.sh" "$@"
tiny_mixtrals
require_ranks 2
run one 1 --total-batch-tokens 64
for r in 1 3; do
  run "cp2_recompute$r" 2 --cp 2 --recompute "$r" --total-batch-tokens 64 &&
    same_steps one "cp2_recompute$r" 1e-6 && same_routing one "cp2_recompute$r" 1e-6
done
require_ranks 4
run cp2_tp2 4 --cp 2 --tp 2 --total-batch-tokens 64 && same_steps one cp2_tp2 1e-6 && same_routing one cp2_tp2 1e-6
run cp2_dp2 4 --cp 2 --total-batch-tokens 128 &&
  run cp2_ep2 4 --cp 2 --ep 2 --total-batch-tokens 128 && same_steps cp2_dp2 cp2_ep2 1e-6 &&
  same_routing cp2_dp2 cp2_ep2 1e-6

[ "$failures" -eq 0 ] && echo "moe_cp: every context-parallel mixture equals one process"
[ "$failures" -eq 0 ]
