#!/usr/bin/env bash
# Point-to-point transfers (test/mpi/mpi_p2p.cu: Communicator's send, recv and exchange over
# ncclSend/ncclRecv) under mpirun with 2 and 3 ranks (a ring of 3 needs its group), both thread
# orders: the CPU build's MPI stand-in, or real NCCL in the GPU build (2 ranks on 2 GPUs or more;
# not applicable with fewer). CPU only: the stream checker's planted violation (the hidden case
# "[.hazard]": a kernel on another stream writes a send buffer unordered with the send) must end
# the run with a "simt: stream hazard:" line naming the kernel and ncclSend.
# usage: distributed_p2p.sh cpu|gpu
set -u
cd "$(dirname "$0")/../.." || exit 1
mode=${1:-cpu}
bin=build/$mode/test/mpi/mpi_p2p
[ -x "$bin" ] || { echo "FAIL: $bin is missing (make test builds it)"; exit 1; }
ranks_list="2 3"
orders="forward reverse"
if [ "$mode" = gpu ]; then
  gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
  [ "$gpus" -ge 2 ] || { echo "not applicable: point-to-point needs 2 GPUs, nvidia-smi sees $gpus"; exit 77; }
  ranks_list=2; [ "$gpus" -ge 3 ] && ranks_list="2 3"
  orders=forward
fi
mpi_opts=(--oversubscribe -x SIMT_THREADS=1 -x SIMT_SCHEDULE)
[ "$(id -u)" -eq 0 ] && mpi_opts+=(--allow-run-as-root)
failures=0
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for ranks in $ranks_list; do
  for order in $orders; do
    if SIMT_THREADS=1 SIMT_SCHEDULE=$order timeout 120 mpirun -np "$ranks" "${mpi_opts[@]}" "$bin" >"$log" 2>&1 &&
        [ "$(grep -c 'All tests passed' "$log")" -eq "$ranks" ]; then
      echo "mpi_p2p, $ranks ranks [$order]: $(grep -m1 'All tests passed' "$log")"
    else
      echo "FAIL: mpi_p2p, $ranks ranks [$order]"; cat "$log"; failures=$((failures + 1))
    fi
  done
done
if [ "$mode" = cpu ]; then
  SIMT_THREADS=1 SIMT_SCHEDULE=forward timeout 60 mpirun -np 2 "${mpi_opts[@]}" "$bin" '[.hazard]' >"$log" 2>&1
  status=$?
  hazard=$(grep -m1 '^simt: stream hazard: ncclSend' "$log")
  if [ "$status" -ne 0 ] && [[ $hazard == *p2p_probe::fill_kernel* ]]; then
    echo "stream checker: an unordered kernel write before ncclSend is reported"
  else
    echo "FAIL: the unordered kernel write before ncclSend was not reported (exit $status)"; cat "$log"
    failures=$((failures + 1))
  fi
fi
[ "$failures" -eq 0 ]
