#!/usr/bin/env bash
# The multi-rank test binaries under mpirun: the communicator's collectives (test/mpi/mpi_nccl.cu:
# all-reduce, reduce-scatter, all-gather, broadcast, host sums), communicators split from others
# (test/mpi/mpi_comm_split.cu: ncclCommSplit and Communicator's split) and how gradients travel
# in buckets at each ZeRO stage (test/mpi/mpi_grad_sync.cu), what tensor parallelism sends on each
# group (test/mpi/mpi_tensor_parallel.cu), pipeline stages that train as one process does
# (test/mpi/mpi_pipeline.cu), ring attention over a context-parallel group equal to unsplit causal
# attention (test/mpi/mpi_context_attention.cu), context-parallel training equal to one process
# (test/mpi/mpi_context_parallel.cu), --fp8 scales the same on every TP and DP rank
# (test/mpi/mpi_fp8.cu), an expert-parallel mixture-of-experts layer equal to the one-process layer
# (test/mpi/mpi_expert_parallel.cu), with 2 and 4 ranks: the CPU build's MPI-backed NCCL stand-in, or
# real NCCL in the GPU build (one GPU per rank: 2 and 4 ranks as the GPUs allow, one rank on a
# one-GPU machine). CPU: both thread orders, like every other test binary.
# usage: distributed_nccl.sh cpu|gpu
set -u
cd "$(dirname "$0")/../.." || exit 1
mode=${1:-cpu}
bins=(build/"$mode"/test/mpi/mpi_nccl build/"$mode"/test/mpi/mpi_comm_split build/"$mode"/test/mpi/mpi_grad_sync
      build/"$mode"/test/mpi/mpi_tensor_parallel build/"$mode"/test/mpi/mpi_pipeline build/"$mode"/test/mpi/mpi_context_parallel
      build/"$mode"/test/mpi/mpi_context_attention build/"$mode"/test/mpi/mpi_fp8 build/"$mode"/test/mpi/mpi_expert_parallel)
for bin in "${bins[@]}"; do
  [ -x "$bin" ] || { echo "FAIL: $bin is missing (make test builds it)"; exit 1; }
done
ranks_list="2 4"
orders="forward reverse"
if [ "$mode" = gpu ]; then
  gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
  [ "$gpus" -ge 1 ] || { echo "FAIL: nvidia-smi sees no GPU"; exit 1; }
  ranks_list=1; [ "$gpus" -ge 2 ] && ranks_list=2; [ "$gpus" -ge 4 ] && ranks_list="2 4"
  orders=forward
fi
mpi_opts=(--oversubscribe -x SIMT_THREADS=1 -x SIMT_SCHEDULE)
[ "$(id -u)" -eq 0 ] && mpi_opts+=(--allow-run-as-root)
failures=0
for bin in "${bins[@]}"; do
  for ranks in $ranks_list; do
    for order in $orders; do
      log=$(mktemp)
      if SIMT_THREADS=1 SIMT_SCHEDULE=$order timeout 300 mpirun -np "$ranks" "${mpi_opts[@]}" "$bin" >"$log" 2>&1 &&
          [ "$(grep -c 'All tests passed' "$log")" -eq "$ranks" ]; then
        echo "$(basename "$bin"), $ranks ranks [$order]: $(grep -m1 'All tests passed' "$log")"
      else
        echo "FAIL: $(basename "$bin"), $ranks ranks [$order]"; cat "$log"; failures=$((failures + 1))
      fi
      rm -f "$log"
    done
  done
done
[ "$failures" -eq 0 ]
