// comm_plan.h — what one rank's gradient and parameter collectives move in an optimizer step at
// each ZeRO stage, from the gradient buckets alone: --plan's communication line, and the counts
// the communicator's own tallies are checked against (test/mpi/mpi_grad_sync.cu).
#pragma once
#include "src/dist/grad_buckets.h"

#include <cstddef>

// Calls of one collective per optimizer step and the bytes each rank sends in them, on NCCL's ring
// algorithms: (R - 1)/R of the buffer for a reduce-scatter or an all-gather, twice that for an
// all-reduce (its reduce-scatter and its all-gather).
struct CollectiveTraffic {
  long long calls = 0;
  double bytes_sent = 0;
};
struct StepTraffic {
  CollectiveTraffic all_reduce, reduce_scatter, all_gather;
};

// One training step of `micro_steps` micro-steps over `world_size` ranks at ZeRO `stage` (the
// effective one: 0 on one rank) over `buckets` (as gradient_buckets() makes them for the run),
// `elem_bytes` per element; at stage 3, `prefetch` buckets gathered ahead (src/dist/param_shards.h: the first pass after the update gathers every bucket,
// each later pass all but the prefetch + 1 its predecessor left in the windows). The step's own
// scalars (loss, norm) are not counted.
StepTraffic step_traffic(const GradientBuckets& buckets, int world_size, int stage, int micro_steps, int prefetch,
                         size_t elem_bytes);
