#!/usr/bin/env bash
# Data-parallel training under mpirun against one process with the same global batch: 2 and 4
# ranks with --zero 0, 1, 2 and 3, fp32 and bf16, shuffling off and on, with and without gradient
# accumulation, must reproduce the single-process per-step losses and gradient norms (fp32:
# 1e-5 relative; bf16: 2e-3 relative, since each rank rounds its own gradients to bf16 before
# they are averaged, where one process rounds the whole batch's gradient once). Also: ZeRO 1 is
# bit-identical to ZeRO 0 (same final model.bin, fp32 and bf16, no clipping) because the sharded
# AdamW rounds by the element's index within its tensor; the optimizer state per rank at ZeRO 1
# is 1/R of ZeRO 0's (up to the chunk padding), ZeRO 2 holds a gradient shard plus working
# windows (two layer buckets' and wte/wpe/lnf's) instead of the whole gradient, and ZeRO 3 holds
# the parameters' shard alone (its gather windows are in the memory plan). Gradients travel in a
# bucket per layer (--bucket-mib 0.1): all-reduce at ZeRO 0, reduce-scatter at 1, 2 and 3.
# usage: distributed_train.sh cpu|gpu   (gpu: needs as many GPUs as ranks, else skipped)
set -u
# shellcheck source=test/checks/lib/trainer.sh
source "$(dirname "$0")/lib/trainer.sh" "$@"
require_files "$bin" "$ref/model.bin" "$ref/train.bin"
command -v mpirun >/dev/null || { echo "FAIL: mpirun not found"; exit 1; }
max_ranks=4
if [ "$mode" = gpu ]; then
  gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
  [ "$gpus" -ge 2 ] || { echo "skipped: needs at least 2 GPUs"; exit 77; }
  [ "$gpus" -lt 4 ] && max_ranks=2
fi
mpi_opts=(--oversubscribe -x SIMT_THREADS=1)
[ "$(id -u)" -eq 0 ] && mpi_opts+=(--allow-run-as-root)
export SIMT_THREADS=1

common=(--init-from "$ref/model.bin" --train-data "$ref/train.bin" --val-data "$ref/train.bin" --val-every 2
        --val-steps 1 --seq-len 16 --max-steps 3 --lr 1e-3 --warmup-steps 0 --lr-schedule linear --bucket-mib 0.1)

# 1. R ranks x B = 4/R rows against one process with B = 4 (same slots of the data, so also
#    with shuffling); and with 2 accumulation steps against one process with B = 2 x 2 steps.
#    Validation: each rank evaluates its rows of the (unshuffled) validation batches.
for dtype in fp32 bf16; do
  tol=1e-5; [ "$dtype" = bf16 ] && tol=2e-3
  for shuffle in 0 1; do
    run "ref_${dtype}_s$shuffle" 1 --dtype "$dtype" --shuffle "$shuffle" --batch-size 4 || continue
    for ranks in 2 4; do
      [ "$ranks" -le "$max_ranks" ] || continue
      for zero in 0 1 2 3; do
        name="r${ranks}_z${zero}_${dtype}_s$shuffle"
        run "$name" "$ranks" --dtype "$dtype" --shuffle "$shuffle" --batch-size $((4 / ranks)) --zero "$zero" &&
          same_steps "ref_${dtype}_s$shuffle" "$name" "$tol"
      done
    done
  done
  run "accref_$dtype" 1 --dtype "$dtype" --batch-size 2 --total-batch-tokens 64 || continue
  for zero in 0 1 2 3; do
    name="acc_r2_z${zero}_$dtype"
    run "$name" 2 --dtype "$dtype" --batch-size 1 --total-batch-tokens 64 --zero "$zero" &&
      same_steps "accref_$dtype" "$name" "$tol"
  done
done
grep -q '2 data-parallel rank(s) x 2 accumulation step(s)' "$tmp/acc_r2_z1_fp32.log" || fail "accumulation run: batch line"

# 2. ZeRO 1 = ZeRO 0 bit for bit (the norm is summed in another order, so no clipping here).
for dtype in fp32 bf16; do
  run "bits_z0_$dtype" 2 --dtype "$dtype" --batch-size 2 --grad-clip 0 --zero 0 &&
    run "bits_z1_$dtype" 2 --dtype "$dtype" --batch-size 2 --grad-clip 0 --zero 1 &&
    { cmp -s "$tmp/bits_z0_$dtype/model.bin" "$tmp/bits_z1_$dtype/model.bin" ||
      fail "$dtype: ZeRO 1 model.bin differs from ZeRO 0's"; }
done

# 3. Memory per rank from the start-up line.
"$python" - "$tmp" <<'PY' || fail "per-rank memory report"
import re, sys
tmp = sys.argv[1]
def report(name):
    line = [l for l in open(f"{tmp}/{name}.log") if l.startswith("distributed:")][0]
    m = re.search(r"world size (\d+) .*ZeRO stage (\d+); per rank: parameters (\d+) bytes, gradients (\d+) bytes, "
                  r"optimizer state (\d+) bytes", line)
    return [int(x) for x in m.groups()]
bad = False
for ranks in (2, 4):
    try:
        z0, z1, z2, z3 = (report(f"r{ranks}_z{z}_bf16_s0") for z in (0, 1, 2, 3))
    except (OSError, IndexError):
        continue
    if [z0[0], z0[1], z1[1], z2[1], z3[1]] != [ranks, 0, 1, 2, 3]:
        print(f"  {ranks} ranks: world size / stage {z0[:2]} {z1[:2]} {z2[:2]} {z3[:2]}"); bad = True
    opt0, opt1 = z0[4], z1[4]
    # Tiny model: L=2, C=64, Vp=512, maxT=64; bf16 gradients; --bucket-mib 0.1: a bucket per layer
    # (97.6 KiB each), then wte/wpe/lnf. Each bucket is chunked per rank: ceil(n/R) rounded up to 8.
    L, C, Vp, maxT = 2, 64, 512, 64
    layer, embed = 12 * C * C + 13 * C, Vp * C + maxT * C + 2 * C
    chunk = lambda n: -(-(-(-n // ranks)) // 8) * 8
    buckets = [layer] * L + [embed]
    S = sum(chunk(n) for n in buckets)
    # ZeRO 1: 12 bytes (m, v, fp32 master) for each of the rank's S elements, less rank 0's padding.
    if not (0 <= opt1 * ranks - opt0 <= ranks * 8 * 12 * len(buckets)) or opt1 > 12 * S:
        print(f"  {ranks} ranks: optimizer bytes ZeRO 1 {opt1} x {ranks} vs ZeRO 0 {opt0}"); bad = True
    if z2[4] != opt1: print(f"  {ranks} ranks: ZeRO 2 optimizer bytes {z2[4]} != ZeRO 1 {opt1}"); bad = True
    if z1[3] != 2 * S * ranks: print(f"  {ranks} ranks: ZeRO 1 gradient bytes {z1[3]} != all chunked buckets {2 * S * ranks}"); bad = True
    windows = 2 * ranks * chunk(layer) + ranks * chunk(embed)
    if z2[3] != 2 * (S + windows):
        print(f"  {ranks} ranks: ZeRO 2 gradient bytes {z2[3]} != shard + working windows {2 * (S + windows)}"); bad = True
    if z3[3:] != z2[3:]: print(f"  {ranks} ranks: ZeRO 3 gradients/optimizer {z3[3:]} != ZeRO 2's {z2[3:]}"); bad = True
    if z0[2] != 2 * sum(buckets) or z3[2] != 2 * S:
        print(f"  {ranks} ranks: parameter bytes ZeRO 0 {z0[2]}, ZeRO 3 {z3[2]}: expected {2 * sum(buckets)}, {2 * S}"); bad = True
    print(f"  {ranks} ranks: optimizer state {opt0} -> {opt1} bytes, gradients {z1[3]} -> {z2[3]} bytes, "
          f"parameters {z0[2]} -> {z3[2]} bytes")
sys.exit(1 if bad else 0)
PY

# 4. Only rank 0 writes: one metrics.jsonl and model.bin, and no rank's lines doubled in the log.
[ "$(grep -c '^step .* | loss ' "$tmp/r2_z1_fp32_s0.log")" -eq 3 ] || fail "2-rank log: expected 3 step lines (rank 0 only)"
[ "$(grep -c 'val loss' "$tmp/r2_z1_fp32_s0.log")" -eq 2 ] || fail "2-rank log: expected 2 validation lines"

[ "$failures" -eq 0 ] && echo "distributed_train: all checks passed"
[ "$failures" -eq 0 ]
