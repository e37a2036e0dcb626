#!/usr/bin/env bash
# Expert parallelism end to end (--ep: src/model/expert_parallel.h, docs/MOE.md) on the tiny Mixtral
# of dev/mixtral_reference.py (4 experts, top-2, aux coefficient 0.02), fp32, 2 micro-batches per
# step: each rank holds E/N experts and sends its rows to them, and the per-step loss, gradient
# norm, validation loss and router figures (every rank's tokens per expert, exactly; the aux loss)
# equal the same data-parallel world's at --ep 1 within 1e-6:
#   - 2 ranks at --ep 2 (one EP group: each expert on one rank, no ZeRO sharding left), at
#     --recompute 0, 1 and 3;
#   - 4 ranks at --ep 2 (two EP groups; each expert's gradient averaged over its 2 holders and
#     the rest summed over the EP group first) at ZeRO 0, 1, 2 and 3, and at --ep 4;
#   - at --ep = ranks no gradient goes beyond the EP group (which sums them), and --plan counts a
#     rank's E/N experts; under balanced routing (--moe-balanced-routing 1) --plan's expert-parallel
#     and data-parallel traffic equal the measured, at --recompute 1 and 3 and on 4 ranks;
#   - the sigmoid router (dev/mixtral_reference.py --router sigmoid, 8 experts) at 2 ranks --ep 2
#     and 4 ranks --ep 2 ZeRO 1: its balancing bias moves by every data-parallel rank's counts;
#   - a checkpoint written at --ep 2 resumes at --ep 2, 1 and 4, and one written at --ep 1 at --ep 2,
#     with the uninterrupted run's step 3 (within 1e-5);
#   - HellaSwag scores, samples and the Hugging Face export at --ep 2 are --ep 1's.
# Refusals are cli_errors.sh's.
# usage: moe_ep.sh cpu|gpu
set -u
# shellcheck source=test/checks/lib/trainer.sh
source "$(dirname "$0")/lib/trainer.sh" "$@"
tiny_mixtrals

require_ranks 2
run ep1 2 --ep 1 --total-batch-tokens 128
run ep2 2 --ep 2 --total-batch-tokens 128 && same_steps ep1 ep2 1e-6 && same_routing ep1 ep2 1e-6
for r in 0 3; do  # the products kept, or the whole block (its exchanges too) rerun in the backward
  run "ep2_recompute$r" 2 --ep 2 --total-batch-tokens 128 --recompute "$r" && same_steps ep1 "ep2_recompute$r" 1e-6
done
grep -q "^measured communication" "$tmp/ep2.log" &&
  fail "--ep 2 over 2 ranks: a gradients' group beyond the EP group (each expert has one holder)"

# Under balanced routing (every expert the same rows of each rank) --plan's expert-parallel and
# data-parallel lines are the measured ones.
ep_lines="expert-parallel communication;communication"
for r in 1 3; do  # --recompute 3: the forward's exchanges twice
  run "balanced$r" 2 --ep 2 --total-batch-tokens 128 --moe-balanced-routing 1 --recompute "$r" &&
    plan_matches "balanced$r" 2 "$ep_lines" --ep 2 --total-batch-tokens 128 --moe-balanced-routing 1 --recompute "$r"
done

# --plan --world-size 2 --ep 2: a rank's parameters are the router, the rest and half the experts
# (822,528 bytes in fp32; 1.3 MiB at --ep 1). (The run's own start-up lines are the plan's.)
with_flags common --ep 2 --total-batch-tokens 128 --plan --world-size 2
"$bin" "${flags[@]}" >"$tmp/plan.log" 2>&1 || fail "--plan --ep 2 exited non-zero"
grep -qE "^  parameters +822528 B" "$tmp/plan.log" || fail "--plan --ep 2: not half the experts' parameters"

# The sigmoid router: its bias moves by the counts summed over every data-parallel rank (the
# expert-DP group's sums, then the EP group's).
softmax=("${common[@]}")
with_flags softmax --init-from "$sref/model.bin" --moe-bias-rate 0.05
sigmoid=("${flags[@]}")
common=("${sigmoid[@]}")
run s_ep1 2 --ep 1 --total-batch-tokens 128 && run s_ep2 2 --ep 2 --total-batch-tokens 128 && same_steps s_ep1 s_ep2 1e-6 &&
  same_routing s_ep1 s_ep2 1e-6
common=("${softmax[@]}")

require_ranks 4
common=("${sigmoid[@]}")
run s_ep1_4 4 --ep 1 --zero 1 --total-batch-tokens 256 &&
  run s_ep2_4 4 --ep 2 --zero 1 --total-batch-tokens 256 && same_steps s_ep1_4 s_ep2_4 1e-6
common=("${softmax[@]}")
run ep1_4 4 --ep 1 --zero 1 --total-batch-tokens 256
for zero in 0 1 2 3; do
  run "ep2_4_zero$zero" 4 --ep 2 --zero "$zero" --total-batch-tokens 256 && same_steps ep1_4 "ep2_4_zero$zero" 1e-6 &&
    same_routing ep1_4 "ep2_4_zero$zero" 1e-6
done
run ep4_4 4 --ep 4 --zero 1 --total-batch-tokens 256 && same_steps ep1_4 ep4_4 1e-6 && same_routing ep1_4 ep4_4 1e-6
run balanced_4 4 --ep 2 --zero 1 --total-batch-tokens 256 --moe-balanced-routing 1 &&
  plan_matches balanced_4 4 "$ep_lines" --ep 2 --zero 1 --total-batch-tokens 256 --moe-balanced-routing 1

# Checkpoints: written at --ep 2 over 4 ranks (ZeRO 1) at step 2, resumed at --ep 2, 1 and 4, and
# one written at --ep 1 resumed at --ep 2, give the uninterrupted run's step 3 (a rank's state file
# holds its experts' state; the reader maps every rank's split, parallel_groups.h's order).
with_flags softmax --save 1 --checkpoint-every 2 --zero 1 --total-batch-tokens 256
three=("${flags[@]}")
with_flags three --max-steps 2
common=("${flags[@]}")
run ck_ep2 4 --ep 2 && run ck_ep1 4 --ep 1
for to in 1 4; do cp -r "$tmp/ck_ep2" "$tmp/ck_ep2_to$to"; done
cp -r "$tmp/ck_ep1" "$tmp/ck_ep1_to2"
common=("${three[@]}")
run ck_full 4 --ep 2
run ck_ep2 4 --ep 2 --resume auto && same_step3 ck_full ck_ep2
run ck_ep2_to1 4 --ep 1 --resume auto && same_step3 ck_full ck_ep2_to1
run ck_ep2_to4 4 --ep 4 --resume auto && same_step3 ck_full ck_ep2_to4
run ck_ep1_to2 4 --ep 2 --resume auto && same_step3 ck_full ck_ep1_to2
common=("${softmax[@]}")

# What the whole model serves with its experts spread: HellaSwag (--eval-data: the forward's
# dispatch), samples (--sample-every: rank 0 gathers every expert) and the Hugging Face export (of
# the model file the EP group gathers) equal --ep 1's.
"$python" - "$tmp/eval.bin" <<'PY' || fail "writing the eval file"
import sys
import numpy as np
sys.path.insert(0, "test/checks/lib")
from eval_file import write_eval_file
rng = np.random.default_rng(5)
write_eval_file(sys.argv[1], [(i % 2, rng.integers(0, 250, 3).tolist(),
                               [rng.integers(0, 250, 2).tolist() for _ in range(2 + i % 2)]) for i in range(6)])
PY
with_flags softmax --eval-data "$tmp/eval.bin" --eval-every 2 --prompt a --sample-every 2 --max-new-tokens 8 \
  --save 1 --save-dtype fp32 --total-batch-tokens 128
common=("${flags[@]}")
run serve_ep1 2 --ep 1 && run serve_ep2 2 --ep 2 --export-hf "$tmp/hf_ep2" && same_eval_and_samples serve_ep1 serve_ep2
"$python" dev/hf_llama_check.py check "$tmp/hf_ep2" --model-bin "$tmp/serve_ep2/model.bin" >"$tmp/hf_ep2.check" ||
  { fail "--ep 2's --export-hf is not its model.bin"; cat "$tmp/hf_ep2.check"; }
common=("${softmax[@]}")

[ "$failures" -eq 0 ] && echo "moe_ep: every expert-parallel run equals --ep 1"
[ "$failures" -eq 0 ]
