#!/usr/bin/env bash
# The communication watchdog (src/dist/comm_watchdog.h) under mpirun with 2 ranks and --comm-timeout 5:
# a peer that hangs mid-run (TRAIN_GPT_TEST_HANG_AT_STEP) or dies without mpirun ending the job
# (TRAIN_GPT_TEST_EXIT_AFTER_STEP, orte_abort_on_non_zero_status 0) makes the other rank print
# one line naming its rank, the collective and the step, and exit with status 1 — not before the
# timeout, and within it plus start-up — without spinning a core while it waits; nothing is
# written to --out-dir's model file.
# usage: distributed_watchdog.sh cpu|gpu
set -u
# shellcheck source=test/checks/lib/trainer.sh
source "$(dirname "$0")/lib/trainer.sh" "$@"
require_files "$bin" "$ref/model.bin" "$ref/train.bin"
require_ranks 2

timeout_s=5
train=("$bin" --init-from "$ref/model.bin" --train-data "$ref/train.bin" --val-every 0 --seq-len 16 --batch-size 2
       --dtype fp32 --lr 1e-3 --max-steps 200 --comm-timeout "$timeout_s")
# Each rank runs under this wrapper (first argument: a path prefix): it reports its exit status on
# stderr and its CPU time (bash's `times`, children's line last) in PREFIX.RANK.times.
# shellcheck disable=SC2016  # expanded by the rank's shell
report_rank='prefix=$1; shift; "$@"; status=$?
times > "$prefix.$OMPI_COMM_WORLD_RANK.times"
echo "rank $OMPI_COMM_WORLD_RANK exited $status" >&2
exit $status'

# expect_abort NAME RANK MESSAGE [MPIRUN OPTIONS...] -- [TRAINER FLAGS...]: the job ends, and
# rank RANK prints "rank RANK: MESSAGE; aborting" and exits 1, between
# --comm-timeout and --comm-timeout + 25 s after the start, with under 3 s of CPU.
expect_abort() {
  local name=$1 rank=$2 message=$3; shift 3
  local mpi_extra=() start end status cpu
  while [ "$1" != -- ]; do mpi_extra+=("$1"); shift; done
  shift
  start=$(date +%s)
  timeout 120 mpirun -np 2 "${mpi_opts[@]}" "${mpi_extra[@]}" bash -c "$report_rank" rank "$tmp/$name" "${train[@]}" "$@" \
    --out-dir "$tmp/$name" >"$tmp/$name.log" 2>&1; status=$?
  end=$(date +%s)
  if [ "$status" -eq 124 ]; then fail "$name: still running after 120 s (hang)"; cat "$tmp/$name.log"; return; fi
  grep -qF "rank $rank: $message; aborting" "$tmp/$name.log" ||
    { fail "$name: no line 'rank $rank: $message; aborting'"; cat "$tmp/$name.log"; return; }
  grep -q "^rank $rank exited 1$" "$tmp/$name.log" ||
    { fail "$name: rank $rank did not exit with status 1"; grep "exited" "$tmp/$name.log"; }
  [ $((end - start)) -ge "$timeout_s" ] || fail "$name: ended after $((end - start)) s, before --comm-timeout"
  [ $((end - start)) -le $((timeout_s + 25)) ] || fail "$name: took $((end - start)) s (limit $((timeout_s + 25)) s)"
  cpu=$(tail -n 1 "$tmp/$name.$rank.times" 2>/dev/null |
        awk '{ split($1, u, /[ms]/); split($2, s, /[ms]/); printf "%.1f", u[1] * 60 + u[2] + s[1] * 60 + s[2] }')
  awk -v c="${cpu:-99}" 'BEGIN { exit !(c < 3.0) }' ||
    fail "$name: rank $rank used ${cpu:-?} s of CPU while waiting (spinning?)"
  [ -e "$tmp/$name/model.bin" ] && fail "$name: a model.bin was written"
  echo "$name: rank $rank aborted after $((end - start)) s (${cpu} s CPU)"
}

# 1. A peer that hangs at the start of a step, under ZeRO 0 (all-reduce) and ZeRO 2 (reduce-scatter).
TRAIN_GPT_TEST_HANG_AT_STEP=1:3 expect_abort hang_1 0 \
  "all-reduce of gradients at step 3 did not finish within $timeout_s s (--comm-timeout)" \
  -x TRAIN_GPT_TEST_HANG_AT_STEP -- --zero 0
TRAIN_GPT_TEST_HANG_AT_STEP=0:2 expect_abort hang_0_zero2 1 \
  "reduce-scatter of gradients at step 2 did not finish within $timeout_s s (--comm-timeout)" \
  -x TRAIN_GPT_TEST_HANG_AT_STEP -- --zero 2
# 2. A peer that dies after step 2 while mpirun lets the job go on: the survivor ends itself.
TRAIN_GPT_TEST_EXIT_AFTER_STEP=1:2 expect_abort dies_1 0 \
  "all-reduce of gradients at step 3 did not finish within $timeout_s s (--comm-timeout)" \
  -x TRAIN_GPT_TEST_EXIT_AFTER_STEP --mca orte_abort_on_non_zero_status 0 --

[ "$failures" -eq 0 ] && echo "distributed_watchdog: all checks passed"
[ "$failures" -eq 0 ]
