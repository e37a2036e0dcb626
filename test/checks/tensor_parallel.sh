#!/usr/bin/env bash
# Tensor parallelism (--tp, --sequence-parallel) under mpirun against one process with the same
# global batch, on the tiny reference model (NH = 4, C = 64, V = 500, Vp = 512): TP 2 (1 x 2),
# TP 2 x DP 2 (4 ranks) at ZeRO 1 and 3, and TP 4, fp32 and bf16, with and without sequence
# parallelism, must reproduce the one-process per-step losses, gradient norms and validation
# losses (fp32: 1e-5 relative; bf16: 2e-3, the data-parallel checks' tolerance, since each rank
# rounds its partial products to bf16 before the group sums them); so must gradient accumulation
# at ZeRO 2 (the replicated tensors' accumulated gradients restored on one TP rank only) and
# --recompute 3 (the recomputed block's collectives). Each of these runs' communicators did per
# step what --plan counts for the same flags (the trainer's "measured ... communication" lines:
# calls and bytes of each collective), which values cannot show: an all-reduce in place of
# sequence parallelism's reduce-scatter leaves every value. The model file a TP run writes is an
# ordinary one: a one-process run that loads it reproduces the TP run's last validation loss, and
# an independent reader of llm.c's format (dev/hf_gpt2.py) finds the one-process run's tensors in
# the model.bin of TP 2 x DP 2 with and without sequence parallelism (every TP rank's copy of a
# replicated tensor is written: one rank's stale bias or wpe shows there, not in the losses). And
# HellaSwag-style evaluation, greedy samples and validation of a TP 2 run equal one process's.
# usage: tensor_parallel.sh cpu|gpu   (gpu: needs 4 GPUs, else skipped)
set -u
# shellcheck source=test/checks/lib/trainer.sh
source "$(dirname "$0")/lib/trainer.sh" "$@"
require_files "$bin" "$ref/model.bin" "$ref/train.bin"
require_ranks 4

# same_traffic NAME RANKS GROUPS ARGS...: what the communicators of run NAME did per step (its
# log's "measured ... communication" lines, GROUPS a regex of the lines' names) is what --plan
# counts for RANKS ranks and the run's flags (the check's `common` and ARGS), line for line:
# calls and bytes of each collective. Under sequence parallelism the reductions are
# reduce-scatters: an all-reduce in their place leaves every value and model.bin as they were.
same_traffic() {
  local name=$1 ranks=$2 groups=$3; shift 3
  if ! "$bin" "${common[@]}" "$@" --plan --world-size "$ranks" >"$tmp/$name.plan" 2>&1; then
    fail "$name: --plan exited non-zero"; tail -n 5 "$tmp/$name.plan"; return 1
  fi
  grep -E "^($groups) per optimizer step" "$tmp/$name.plan" >"$tmp/$name.planned"
  sed -En "s/^measured ($groups) per optimizer step \(([0-9]+ micro-step\(s\)), mean of [^:]*\), sent by/\1 per optimizer step (\2), sent by/p" \
    "$tmp/$name.log" >"$tmp/$name.measured"
  if [ ! -s "$tmp/$name.planned" ] || ! diff "$tmp/$name.planned" "$tmp/$name.measured" >"$tmp/$name.traffic"; then
    fail "$name: the communication it measured per step is not --plan's (< planned, > measured)"
    cat "$tmp/$name.traffic"
  fi
}
all_groups="communication|tensor-parallel communication"

common=(--init-from "$ref/model.bin" --train-data "$ref/train.bin" --val-data "$ref/train.bin" --val-every 2
        --val-steps 1 --seq-len 16 --max-steps 3 --lr 1e-3 --warmup-steps 0 --lr-schedule linear --bucket-mib 0.1)

for dtype in fp32 bf16; do
  tol=1e-5; [ "$dtype" = bf16 ] && tol=2e-3
  run "ref_$dtype" 1 --dtype "$dtype" --batch-size 4 || continue
  for sp in 1 0; do
    name="tp2_sp${sp}_$dtype"
    flags=(--dtype "$dtype" --batch-size 4 --tp 2 --sequence-parallel "$sp")
    run "$name" 2 "${flags[@]}" && same_steps "ref_$dtype" "$name" "$tol" && same_traffic "$name" 2 "$all_groups" "${flags[@]}"
    for zero in 1 3; do
      name="tp2dp2_z${zero}_sp${sp}_$dtype"
      flags=(--dtype "$dtype" --batch-size 2 --tp 2 --zero "$zero" --sequence-parallel "$sp")
      # At ZeRO 3 the step after validation gathers fewer parameters than --plan counts (it did).
      groups=$all_groups; [ "$zero" = 3 ] && groups="tensor-parallel communication"
      run "$name" 4 "${flags[@]}" && same_steps "ref_$dtype" "$name" "$tol" && same_traffic "$name" 4 "$groups" "${flags[@]}"
    done
    name="tp4_sp${sp}_$dtype"
    flags=(--dtype "$dtype" --batch-size 4 --tp 4 --sequence-parallel "$sp")
    run "$name" 4 "${flags[@]}" && same_steps "ref_$dtype" "$name" "$tol" && same_traffic "$name" 4 "$all_groups" "${flags[@]}"
  done
  name="tp2_rc3_$dtype"
  flags=(--dtype "$dtype" --batch-size 4 --tp 2 --recompute 3)
  run "$name" 2 "${flags[@]}" && same_steps "ref_$dtype" "$name" "$tol" && same_traffic "$name" 2 "$all_groups" "${flags[@]}"
  run "accref_$dtype" 1 --dtype "$dtype" --batch-size 2 --total-batch-tokens 64 || continue
  name="acc_tp2dp2_z2_$dtype"
  flags=(--dtype "$dtype" --batch-size 1 --total-batch-tokens 64 --tp 2 --zero 2)
  run "$name" 4 "${flags[@]}" && same_steps "accref_$dtype" "$name" "$tol" && same_traffic "$name" 4 "$all_groups" "${flags[@]}"
done
grep -q "tensor parallel 2" "$tmp/tp2dp2_z1_sp1_fp32.log" || fail "the start-up report does not describe the TP grid"

# The TP run's model.bin in one process: --max-steps 0 evaluates it on the same validation batch.
if [ -s "$tmp/tp2dp2_z3_sp1_fp32/model.bin" ]; then
  "$bin" --init-from "$tmp/tp2dp2_z3_sp1_fp32/model.bin" --val-data "$ref/train.bin" --val-steps 1 --batch-size 4 \
    --seq-len 16 --max-steps 0 >"$tmp/load.log" 2>&1 || fail "one process cannot load the TP run's model.bin"
  "$python" - "$tmp/tp2dp2_z3_sp1_fp32/metrics.jsonl" "$tmp/load.log" <<'PY' || fail "the TP run's model.bin does not reproduce its last validation loss"
import json, re, sys
last = [json.loads(l)["val_loss"] for l in open(sys.argv[1]) if "val_loss" in l][-1]
m = re.search(r"val(?:idation)? loss\D*([0-9.]+)", open(sys.argv[2]).read())
if not m: print("  no validation loss in the one-process log"); sys.exit(1)
got = float(m.group(1))
if abs(got - last) > 1e-4 * abs(last): print(f"  {got} vs the TP run's {last}"); sys.exit(1)
PY
fi
# llm.c's format as an independent reader sees it (dev/hf_gpt2.py): the TP runs' model.bin holds
# the one-process run's tensors (both trained the same 3 steps; Adam turns last-bit differences of
# tiny gradients into ~1e-5 of a tensor's largest value, a misplaced element would differ by ~1,
# a replicated tensor one rank never updated by its 3 steps' moves), its padding rows of wte zero.
for name in tp2dp2_z3_sp1_fp32 tp2dp2_z3_sp0_fp32; do
  [ -s "$tmp/$name/model.bin" ] || continue
  "$python" - "$tmp/ref_fp32/model.bin" "$tmp/$name/model.bin" <<'PY' || fail "$name: its model.bin read by dev/hf_gpt2.py differs from one process's"
import sys
import numpy as np
sys.path.insert(0, "dev")
import hf_gpt2
(ca, a, _), (cb, b, _) = (hf_gpt2.read_model(p) for p in sys.argv[1:3])
bad = ca != cb or a.keys() != b.keys()
for name in a:
    x, y = np.asarray(a[name], dtype=np.float64), np.asarray(b[name], dtype=np.float64)
    d = np.abs(x - y).max() / max(np.abs(x).max(), 1e-6)
    if d > 1e-3: print(f"  {name}: relative difference {d:.2e}"); bad = True
if np.asarray(b["wte"])[cb["V"]:].any(): print("  padding rows of wte are not zero"); bad = True
sys.exit(1 if bad else 0)
PY
done

# Everything else a run does under TP 2: on a GPT-2-vocabulary model, HellaSwag-style evaluation,
# greedy samples (rank 0 decodes from the gathered parameters) and validation equal one process's.
write_gpt2vocab_eval
model=$tmp/gpt2vocab
common=(--init-from "$model/model.bin" --train-data "$model/train.bin" --val-data "$model/train.bin" --val-every 2
        --val-steps 1 --batch-size 2 --seq-len 8 --max-steps 2 --lr 1e-2 --warmup-steps 0 --eval-data "$tmp/eval.bin"
        --eval-every 2 --sample-every 2 --prompt "Once upon" --max-new-tokens 6 --temperature 0 --dtype fp32)
run all_ref 1 && run all_tp2 2 --tp 2 && same_eval_and_samples all_ref all_tp2
[ "$failures" -eq 0 ] && echo "ok"
exit $((failures > 0))
