// memory_plan.h — the device memory one rank of a run allocates, term by term, computed from the
// same sizing functions the allocations use (activations.h, grad_sync.h, generate.h, matmul.cuh);
// whether it fits a GPU; and the largest micro-batch that fits at each --recompute setting (--plan).
// NCCL's own buffers and the CUDA context are not allocated by train_gpt and not counted: leave
// headroom for them (a few hundred MiB to 1 GiB per GPU).
#pragma once
#include "kernels/matmul.cuh"
#include "src/model/activations.h"
#include "src/model/context_attention.h"
#include "src/model/fp8_state.h"
#include "src/model/optimizer.h"
#include "src/gen/generate.h"
#include "src/config/model_config.h"
#include "src/base/units.h"
#include "src/dist/grad_sync.h"
#include "src/dist/param_shards.h"
#include "src/dist/tensor_split.h"

#include <algorithm>
#include <numeric>
#include <cstdio>
#include <string>
#include <vector>

// A pipeline rank's share of a run (none: `stage` empty): its stage's part of the model, the
// pipeline's ranks, the activation sets its schedule keeps in flight (pipeline_schedule.h's
// pipeline_activation_sets) and whether its backward is split (zb-h1: output gradients kept).
struct PipelineMemory {
  StagePart stage;
  int stages = 1, in_flight = 1;
  bool split_backward = false;
};

struct MemoryTerm {
  std::string name;
  size_t bytes;
};

struct MemoryPlan {
  std::vector<MemoryTerm> terms;
  size_t total() const {
    size_t sum = 0;
    for (const MemoryTerm& t : terms) sum += t.bytes;
    return sum;
  }
};

// The bytes of the term called `name` (0 if the plan has none).
inline size_t term_bytes(const MemoryPlan& plan, const std::string& name) {
  for (const MemoryTerm& t : plan.terms)
    if (t.name == name) return t.bytes;
  return 0;
}

// One rank's device allocations (rank 0's: no other rank holds more) for a model of `cfg` trained
// with micro-batch B×T at `recompute`, `dtype`, ZeRO stage `zero_stage` over `world_size` ranks,
// gradients in buckets of ~bucket_mib; sample_positions > 0: rank 0's --sample-every decoder of
// that many positions (at ZeRO 3 with every parameter gathered for it); the lm head in chunks of
// logits_rows rows; at ZeRO 3, zero3_prefetch buckets gathered ahead. With tensor parallelism `tp`
// (its size divides world_size) the rank holds its TP part of the model and activations, and the
// ZeRO stage shards over its data-parallel group of world_size / tp.size ranks. With a pipeline
// (PipelineMemory), the rank holds its stage's part and its schedule's activation sets (the first
// whole, each further one what a pass keeps: activations.h), over world_size / (tp.size · stages)
// data-parallel ranks. With context parallelism over `cp` ranks (included in those data-parallel
// ranks: parallel_groups.h) the rank's activations are of T/cp tokens per sequence, and it holds
// the ring's buffers (context_attention.h) and the group's gathered losses. fp8_history > 0: with
// --fp8 and that amax history, its weight copies, cast buffers and scaling state (fp8_state.h).
inline MemoryPlan plan_memory(const ModelConfig& cfg, int B, int T, int recompute, DType dtype, int zero_stage,
                              int world_size, double bucket_mib = kDefaultBucketMiB, int sample_positions = 0,
                              size_t logits_rows = kLogitsChunkRows, int zero3_prefetch = kDefaultZero3Prefetch,
                              const TensorParallelism& tp = {}, const PipelineMemory& pipeline = {}, int cp = 1,
                              int fp8_history = 0) {
  const bool piped = !pipeline.stage.layers.empty();
  const StagePart stage = piped ? pipeline.stage : StagePart::whole(cfg.num_layers);
  const ParameterLayout layout = TensorSplit(cfg, tp.size, 0, stage, tp.experts, 0).local();
  // --ep: the gradients' and ZeRO's group is the ranks holding the same experts.
  const int data_ranks = std::max(world_size / (tp.size * pipeline.stages * tp.experts), 1);
  const size_t elem = dtype == DType::fp32 ? sizeof(float) : sizeof(bf16);
  const GradientBuckets buckets =
      gradient_buckets(layout, data_ranks, zero_stage, layers_per_bucket(layout, bucket_mib, elem), tp.size,
                       tp.experts > 1);
  const size_t state = buckets.state_count(0);
  ModelConfig chunk = cfg;  // an activation set holds the rank's largest chunk
  chunk.num_layers = *std::max_element(stage.chunks.begin(), stage.chunks.end());
  const int local_T = T / cp;
  ActivationCounts counts = activation_counts(chunk, B, local_T, recompute, logits_rows, tp, tp.experts);
  if (pipeline.split_backward) counts.douts = chunk.num_layers * deferred_gradients(cfg, B, local_T, tp).per_layer;
  const size_t ring = cp > 1 ? ContextAttention<float>::workspace_bytes(B, T / (2 * cp), cfg.channels / tp.size,
                                                                        cfg.num_heads / tp.size, cfg.kv_heads() / tp.size,
                                                                        elem) +
                                   sizeof(float) * B * static_cast<size_t>(T)
                             : 0;
  const ActivationCounts first = piped ? pipeline_slot_counts(counts, true, stage.head) : counts;
  const ActivationBytes activations = activation_bytes(first, dtype);
  const size_t more_sets =
      piped ? (pipeline.in_flight - 1) * activation_bytes(pipeline_slot_counts(counts, false, stage.head), dtype).total() : 0;
  const size_t logits = elem * first.logits;
  const int zero = effective_zero_stage(zero_stage, data_ranks);
  const bool whole_elsewhere = zero == 3 || tp.size > 1 || tp.experts > 1 || piped;  // no rank holds every parameter
  const ParameterShardCounts shards = parameter_shard_counts(buckets, zero3_prefetch);
  MemoryPlan plan;
  plan.terms = {
      {"parameters", elem * (zero == 3 ? shards.shard : layout.total)},
      {"parameter gather windows", zero == 3 ? elem * (shards.total() - shards.shard) : 0},
      {"gradients", elem * gradient_buffer_counts(buckets, zero).total()},
      // The lm head's weight: wte when tied, else lm_head (lm_head.h).
      {"lm head weight gradient (fp32)", stage.head ? sizeof(float) * layout[cfg.tied_embeddings ? kWte : kLmHead].count : 0},
      {"master weights (fp32)", dtype == DType::bf16 ? sizeof(float) * state : 0},
      {"AdamW moments (fp32)", 2 * sizeof(float) * state},
      {"AdamW segment table", AdamWUpdate<bf16>::table_bytes(buckets.segments(0).size())},
      {"activations: blocks", activations.blocks},
      {"activations: logits chunk", logits},
      {"activations: other buffers", activations.other - logits},
      {"activations: more micro-batches in flight", more_sets},
      {"context parallelism: ring, losses", ring},
      {"RoPE table (fp32)", cfg.positions == Positions::rope ? sizeof(float) * static_cast<size_t>(T) * static_cast<size_t>(cfg.head_size()) : 0},
      {"FP8 weight copies and casts",
       fp8_history > 0 ? fp8_state_bytes(fp8_product_shapes(cfg, tp.size),
                                         std::accumulate(stage.chunks.begin(), stage.chunks.end(), 0),
                                         static_cast<size_t>(B) * local_T, fp8_history)
                       : 0},
      {"cuBLASLt workspace", kMatmulWorkspaceBytes + kBiasPartialFloats * sizeof(float)},
      {"step and communication scalars", (kStepScalars + 1) * sizeof(double)},
      {"text sampling (--sample-every)", sample_positions > 0 ? kv_decoder_counts(cfg, sample_positions).bytes(elem) : 0},
      {"parameters gathered for sampling",
       sample_positions > 0 && whole_elsewhere ? elem * ParameterLayout(cfg).total : 0},
  };
  return plan;
}

// The lm head's chunk rows for a run: min(B·T, kLogitsChunkRows), halved while the plan exceeds
// `budget` (0: no limit), down to kLogitsChunkRowsMin (or B·T when smaller). The budget is a
// property of the device, not of the moment (the caller passes its total memory, not the free),
// so a run's chunking, and with it the rounding of its fp32 lm head gradient, is reproducible.
inline size_t lm_head_chunk_rows(const ModelConfig& cfg, int B, int T, int recompute, DType dtype, int zero_stage,
                                 int world_size, double bucket_mib, int sample_positions, size_t budget,
                                 int zero3_prefetch = kDefaultZero3Prefetch, const TensorParallelism& tp = {},
                                 const PipelineMemory& pipeline = {}, int cp = 1, int fp8_history = 0) {
  const size_t N = static_cast<size_t>(B) * (T / cp);
  size_t rows = std::min(N, kLogitsChunkRows);
  while (budget > 0 && rows > kLogitsChunkRowsMin &&
         plan_memory(cfg, B, T, recompute, dtype, zero_stage, world_size, bucket_mib, sample_positions, rows,
                     zero3_prefetch, tp, pipeline, cp, fp8_history)
                 .total() > budget)
    rows = std::max(rows / 2, kLogitsChunkRowsMin);
  return rows;
}

// The largest micro-batch size (≤ limit) whose plan fits in `budget` bytes; 0 if not even B = 1.
inline int largest_fitting_batch(const ModelConfig& cfg, int T, int recompute, DType dtype, int zero_stage,
                                 int world_size, size_t budget, double bucket_mib = kDefaultBucketMiB,
                                 int sample_positions = 0, int zero3_prefetch = kDefaultZero3Prefetch,
                                 const TensorParallelism& tp = {}, const PipelineMemory& pipeline = {}, int cp = 1,
                                 int fp8_history = 0, int limit = 1 << 16) {
  auto fits = [&](int B) {
    return plan_memory(cfg, B, T, recompute, dtype, zero_stage, world_size, bucket_mib, sample_positions,
                       kLogitsChunkRows, zero3_prefetch, tp, pipeline, cp, fp8_history)
               .total() <= budget;
  };
  if (!fits(1)) return 0;
  int lo = 1, hi = limit;  // fits(lo); the answer is in [lo, hi]
  while (lo < hi) {
    const int mid = lo + (hi - lo + 1) / 2;
    if (fits(mid)) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// The plan as a table: one line per term, the total, and (budget > 0) whether it fits.
inline std::string format_memory_plan(const MemoryPlan& plan, size_t budget) {
  std::string out;
  char line[128];
  for (const MemoryTerm& t : plan.terms) {
    if (t.bytes == 0) continue;
    std::snprintf(line, sizeof line, "  %-32s %12s\n", t.name.c_str(), format_bytes(t.bytes).c_str());
    out += line;
  }
  std::snprintf(line, sizeof line, "  %-32s %12s", "total per rank", format_bytes(plan.total()).c_str());
  out += line;
  if (budget > 0) {
    std::snprintf(line, sizeof line, " of %s: %s", format_bytes(budget).c_str(),
                  plan.total() <= budget ? "fits" : "does NOT fit");
    out += line;
  }
  return out + "\n";
}
