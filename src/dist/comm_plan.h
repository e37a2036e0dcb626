// comm_plan.h — what one rank's gradient and parameter collectives move in an optimizer step at
// each ZeRO stage, from the gradient buckets alone, and what its tensor-parallel group's
// activation collectives move: --plan's communication lines, and the counts the communicators'
// own tallies are checked against (test/mpi/mpi_grad_sync.cu, test/mpi/mpi_tensor_parallel.cu;
// a run's, src/run/step_traffic.h, in test/checks/tensor_parallel.sh).
#pragma once
#include "src/config/model_config.h"
#include "src/dist/grad_buckets.h"
#include "src/dist/tensor_split.h"

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

// Bytes each of `ranks` ranks sends in one ring collective over a buffer of `buffer_bytes` (every
// rank's part): `passes` 1 for a reduce-scatter or an all-gather, 2 for an all-reduce.
inline double ring_bytes_sent(double buffer_bytes, int ranks, int passes) {
  return passes * buffer_bytes * (ranks - 1) / ranks;
}

// One training step of `micro_steps` micro-steps over `world_size` ranks at ZeRO `stage` (the
// effective one: 0 on one rank) over `buckets` (as gradient_buckets() makes them for the run),
// `elem_bytes` per element; at stage 3, `prefetch` buckets gathered ahead (src/dist/param_shards.h: the first pass after the update gathers every bucket,
// each later pass all but the prefetch + 1 its predecessor left in the windows). The step's own
// scalars (loss, norm) are not counted.
StepTraffic step_traffic(const GradientBuckets& buckets, int world_size, int stage, int micro_steps, int prefetch,
                         size_t elem_bytes);

// One training step's collectives on a tensor-parallel group of tp.size > 1 ranks
// (tp_collectives.h, lm_head.h, grad_sync.h), `micro_steps` micro-steps of B·T token rows of
// model `cfg`, each the forward, the lm head over its rows, and the backward:
//   the embedding's sum: 1 reduction of the (B·T, C) rows
//   each layer's forward: 2 reductions (after the row-parallel projections) and, under sequence
//     parallelism, 2 all-gathers (ln1, ln2), plus lnf's all-gather
//   the lm head, in `head_chunks` chunks of rows: per chunk an all-reduce of each row's maximum
//     and one of its two sums (fp32; the bytes are counted as for equal chunks), then 1 reduction
//     of d lnf
//   each layer's backward: 2 reductions (d ln2, d ln1) and, under sequence parallelism, 2
//     all-gathers of the residual gradient, plus one before the embedding's backward; --recompute 2
//     re-gathers ln1 and ln2, --recompute 3 reruns the block (ln1's gather, a reduction, ln2's)
//   under sequence parallelism each bucket's replicated prefix of `buckets` summed (an all-reduce)
//     on the last micro-step, or on every one when `every_micro_step` (ZeRO 2 and 3 with data
//     parallelism)
//   with experts (which run on each rank's own rows, whole) one reduction and one gather fewer per
//     layer in each pass (only attention's; --recompute 2 and 3 re-gather ln1 alone), an all-reduce
//     of the micro-batch's 2·E routing sums (fp64), and the sigmoid router's L·E step counts
// A reduction is a reduce-scatter under sequence parallelism, else an all-reduce. The step's own
// scalars (loss, norm) are not counted. A pipeline stage (cfg.num_layers: its layers) has the
// embedding's collectives only when it `embeds` and lnf's and the head's only when it holds the `head`.
StepTraffic tp_step_traffic(const ModelConfig& cfg, int B, int T, const TensorParallelism& tp, int recompute,
                            int head_chunks, int micro_steps, const GradientBuckets& buckets, bool every_micro_step,
                            size_t elem_bytes, bool embeds = true, bool head = true);

// What one rank sends on an EP group of `ranks` > 1 in one training step (expert_parallel.h,
// grad_sync.h, docs/MOE.md): its all-reduces and its point-to-point sends.
struct ExpertTraffic {
  CollectiveTraffic all_reduce, sends;
};
// `micro_steps` micro-steps of `rows` rows routed on this rank through the `cfg.num_layers`
// mixture layers of model `cfg`:
//   sends, under balanced routing (every expert gets rows·K/E of each rank's rows, which real
//     routing moves): per layer and micro-batch the forward's route (E + 1 ints to each other
//     rank), dispatch and combine (R = rows·K·(ranks − 1)/ranks rows of C elements each way, one
//     transfer per remote expert and per source rank and local expert), and the backward's two
//     dispatches (x's rows, d y) and combine (d rows); the forward's run twice when the backward
//     reruns it (`forward_reruns`);
//   all-reduces: each bucket's EP-replicated range of `buckets` (every tensor but the experts),
//     on the last micro-step or on every one when `every_micro_step` (ZeRO 2 and 3 with
//     expert-data parallelism), and the sigmoid router's L·E step counts (fp64).
ExpertTraffic ep_step_traffic(const ModelConfig& cfg, int rows, int ranks, bool forward_reruns, int micro_steps,
                              const GradientBuckets& buckets, bool every_micro_step, size_t elem_bytes);
