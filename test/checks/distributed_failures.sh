#!/usr/bin/env bash
# Start-up and failure behaviour of data-parallel runs: a rank that dies mid-run ends the whole
# job with an error (not a hang); a rank that never starts makes the others fail after
# --comm-timeout with an error naming the missing rank(s), for the file and the TCP rendezvous;
# the rendezvous paths work (under mpirun, where the CPU build's NCCL stand-in has its MPI world);
# a single process needs no mpirun; bad launch settings are one-line errors.
# usage: distributed_failures.sh cpu|gpu
set -u
# shellcheck source=test/checks/lib/trainer.sh
source "$(dirname "$0")/lib/trainer.sh" "$@"
require_files "$bin" "$ref/model.bin" "$ref/train.bin"
require_ranks 2

train=("$bin" --init-from "$ref/model.bin" --train-data "$ref/train.bin" --val-every 0 --seq-len 16 --batch-size 2
       --dtype fp32 --lr 1e-3)

# expect_error NAME PATTERN MAX_SECONDS CMD...: CMD exits non-zero within MAX_SECONDS and its
# output matches PATTERN (grep -E).
expect_error() {
  local name=$1 pattern=$2 limit=$3; shift 3
  local start end status
  start=$(date +%s)
  timeout $((limit + 60)) "$@" >"$tmp/$name.log" 2>&1; status=$?
  end=$(date +%s)
  if [ "$status" -eq 0 ]; then fail "$name: exited 0"; cat "$tmp/$name.log"; return; fi
  if [ "$status" -eq 124 ]; then fail "$name: still running after $((limit + 60)) s (hang)"; return; fi
  [ $((end - start)) -le "$limit" ] || fail "$name: took $((end - start)) s (limit $limit s)"
  grep -qE "$pattern" "$tmp/$name.log" || { fail "$name: output does not match '$pattern'"; cat "$tmp/$name.log"; }
}

# 1. A single process without mpirun: world size 1, no MPI needed, any --zero.
"${train[@]}" --max-steps 2 --zero 2 --out-dir "$tmp/single" >"$tmp/single.log" 2>&1 ||
  { fail "single process exited non-zero"; cat "$tmp/single.log"; }
grep -q '^distributed: world size 1 (single process), ZeRO stage 0' "$tmp/single.log" ||
  fail "single process: no 'world size 1' start-up line"

# 2. A rank dies after step 1 of 200 (either rank): the job ends with an error, nobody hangs.
for dying in 1 0; do
  TRAIN_GPT_TEST_EXIT_AFTER_STEP="$dying:1" expect_error "dies_$dying" "exiting after step 1" 60 \
    mpirun -np 2 "${mpi_opts[@]}" -x TRAIN_GPT_TEST_EXIT_AFTER_STEP "${train[@]}" --max-steps 200 --zero 1 \
    --out-dir "$tmp/dies_$dying"
  [ -e "$tmp/dies_$dying/model.bin" ] && fail "dies_$dying: a model.bin was written"
done

# 3. A rank that never starts (SLURM launch of 2, only one process started), each side missing.
slurm0=(env SLURM_NTASKS=2 SLURM_PROCID=0 SLURM_LOCALID=0)
slurm1=(env SLURM_NTASKS=2 SLURM_PROCID=1 SLURM_LOCALID=1)
port=$((20000 + RANDOM % 20000))
expect_error file_missing_1 "rank\(s\) 1 of 2 did not check in within --comm-timeout 2 s" 20 \
  "${slurm0[@]}" "${train[@]}" --max-steps 1 --rendezvous "file:$tmp/rdv_a" --comm-timeout 2 --out-dir "$tmp/x"
expect_error file_missing_0 "rank 1: .*rank 0 did not write the file within --comm-timeout 2 s" 20 \
  "${slurm1[@]}" "${train[@]}" --max-steps 1 --rendezvous "file:$tmp/rdv_b" --comm-timeout 2 --out-dir "$tmp/x"
expect_error tcp_missing_1 "rank\(s\) 1 of 2 did not connect within --comm-timeout 2 s" 20 \
  "${slurm0[@]}" "${train[@]}" --max-steps 1 --rendezvous "tcp:127.0.0.1:$port" --comm-timeout 2 --out-dir "$tmp/x"
expect_error tcp_missing_0 "rank 1: .*rank 0 was not reachable within --comm-timeout 2 s" 20 \
  "${slurm1[@]}" "${train[@]}" --max-steps 1 --rendezvous "tcp:127.0.0.1:$port" --comm-timeout 2 --out-dir "$tmp/x"
# Left-over rendezvous file, malformed --rendezvous, SLURM without one.
touch "$tmp/stale"
expect_error file_stale "already exists" 20 \
  "${slurm0[@]}" "${train[@]}" --max-steps 1 --rendezvous "file:$tmp/stale" --comm-timeout 2 --out-dir "$tmp/x"
expect_error bad_rendezvous "expected file:PATH or tcp:HOST:PORT" 20 \
  "${slurm0[@]}" "${train[@]}" --max-steps 1 --rendezvous "nfs:/x" --out-dir "$tmp/x"
expect_error no_rendezvous "without mpirun: give --rendezvous" 20 "${slurm0[@]}" "${train[@]}" --max-steps 1 --out-dir "$tmp/x"

# 4. The rendezvous paths exchange the id (ranks from mpirun's variables): same losses as MPI's.
mpirun -np 2 "${mpi_opts[@]}" "${train[@]}" --max-steps 2 --out-dir "$tmp/via_mpi" >"$tmp/via_mpi.log" 2>&1 ||
  { fail "mpirun run failed"; cat "$tmp/via_mpi.log"; }
for how in "file:$tmp/rdv_ok" "tcp:127.0.0.1:$((port + 1))"; do
  name=via_${how%%:*}
  if mpirun -np 2 "${mpi_opts[@]}" "${train[@]}" --max-steps 2 --rendezvous "$how" --comm-timeout 30 \
      --out-dir "$tmp/$name" >"$tmp/$name.log" 2>&1; then
    cmp -s "$tmp/via_mpi/model.bin" "$tmp/$name/model.bin" || fail "$name: model differs from the MPI bootstrap's"
  else
    fail "$name: run failed"; cat "$tmp/$name.log"
  fi
done
[ -e "$tmp/rdv_ok" ] && fail "file rendezvous: rank 0 left $tmp/rdv_ok behind"
# Both ranks of a SLURM launch present, without mpirun: the id exchange completes; the GPU build
# trains, the CPU build's MPI stand-in cannot form a 2-rank world and says so on every rank.
if [ "$mode" = cpu ]; then
  "${slurm1[@]}" "${train[@]}" --max-steps 1 --rendezvous "file:$tmp/rdv_c" --comm-timeout 20 --out-dir "$tmp/x" \
    >"$tmp/slurm_1.log" 2>&1 &
  expect_error slurm_pair "rank 0: .*launch multi-rank CPU runs with mpirun" 30 \
    "${slurm0[@]}" "${train[@]}" --max-steps 1 --rendezvous "file:$tmp/rdv_c" --comm-timeout 20 --out-dir "$tmp/x"
  wait $! && fail "slurm pair: rank 1 exited 0"
  grep -q "rank 1: .*launch multi-rank CPU runs with mpirun" "$tmp/slurm_1.log" ||
    { fail "slurm pair: rank 1's error"; cat "$tmp/slurm_1.log"; }
fi

[ "$failures" -eq 0 ] && echo "distributed_failures: all checks passed"
[ "$failures" -eq 0 ]
