// plan_report.h — the memory plan as a command (--plan: each rank's device memory, what fits) and
// as the check before a run allocates (a run that would not fit stops with its plan).
#pragma once
#include "src/base/device.h"
#include "src/base/durable_file.h"
#include "src/base/error_context.h"
#include "src/base/units.h"
#include "src/config/config_checks.h"
#include "src/dist/comm_plan.h"
#include "src/dist/pipeline_check.h"
#include "src/dist/rendezvous.h"
#include "src/dist/tensor_split.h"
#include "src/model/activations.h"
#include "src/model/attention.h"
#include "src/run/memory_plan.h"
#include "src/run/pipeline_setup.h"
#include "src/run/run_setup.h"

#include <cstdio>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

constexpr double kBytesPerGiB = 1073741824.0;

// Positions of rank 0's --sample-every decoder: the sampler's (prompt + --max-new-tokens - 1), or
// without one (--plan reads no vocabulary) the model's context, the most it can be; 0: no sampling.
inline int sampling_positions(const TrainConfig& cfg, const ModelConfig& model, const TextSampler* sampler) {
  if (cfg.sample_every == 0) return 0;
  return sampler != nullptr ? sampler->cache_positions() : model.max_seq_len;
}

// The budget the lm head's chunk is chosen against: --gpu-memory, else the device's total memory
// (0 without a device: the largest chunk).
inline size_t chunk_budget(const TrainConfig& cfg) {
  size_t budget = static_cast<size_t>(cfg.gpu_memory * kBytesPerGiB);
  int devices = 0;
  if (budget == 0 && cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0)
    budget = device_properties().totalGlobalMem;
  return budget;
}

// A run's tensor parallelism as the plan sees it (rank 0's: no rank holds more).
inline TensorParallelism run_tensor_parallelism(const TrainConfig& cfg) {
  return {cfg.tp, 0, cfg.sequence_parallel && cfg.tp > 1, cfg.ep};
}

// With --fp8 its amax history (memory_plan.h's fp8_history), else 0.
inline int run_fp8_history(const TrainConfig& cfg) { return cfg.fp8 ? cfg.fp8_amax_history : 0; }

// A run's lm-head chunk rows (memory_plan.h's lm_head_chunk_rows against chunk_budget, for the
// pipeline's last stage, which holds the head); `world`: every rank of the run; `micro_steps`: its
// gradient accumulation steps.
inline size_t run_logits_rows(const TrainConfig& cfg, const ModelConfig& model, int batch_size, int world,
                              int sample_positions, int micro_steps) {
  return lm_head_chunk_rows(model, batch_size, cfg.seq_len, stage_recompute(cfg, cfg.pp - 1), dtype_named(cfg.dtype),
                            cfg.zero, world,
                            cfg.bucket_mib, sample_positions, chunk_budget(cfg), cfg.zero3_prefetch,
                            run_tensor_parallelism(cfg), run_pipeline_memory(cfg, model, micro_steps, cfg.pp - 1), cfg.cp,
                            run_fp8_history(cfg));
}

// Pipeline rank `stage`'s plan (any rank without --pp), at its --recompute (stage_recompute).
inline MemoryPlan run_memory_plan(const TrainConfig& cfg, const ModelConfig& model, int batch_size, int world,
                                  int sample_positions, int micro_steps, int stage = 0) {
  return plan_memory(model, batch_size, cfg.seq_len, stage_recompute(cfg, stage), dtype_named(cfg.dtype), cfg.zero,
                     world, cfg.bucket_mib, sample_positions,
                     run_logits_rows(cfg, model, batch_size, world, sample_positions, micro_steps),
                     cfg.zero3_prefetch, run_tensor_parallelism(cfg),
                     run_pipeline_memory(cfg, model, micro_steps, stage), cfg.cp, run_fp8_history(cfg));
}

// The pipeline rank whose plan is the largest (0 without --pp): the one that decides what fits.
inline int largest_stage(const TrainConfig& cfg, const ModelConfig& model, int batch_size, int world,
                         int sample_positions, int micro_steps) {
  int largest = 0;
  size_t most = 0;
  for (int s = 0; s < cfg.pp; ++s) {
    const size_t total = run_memory_plan(cfg, model, batch_size, world, sample_positions, micro_steps, s).total();
    if (total > most) most = total, largest = s;
  }
  return largest;
}

// "largest --batch-size that fits: --recompute 0: 3, 1: 5, 2: 6, 3: 9" (0: not even 1), on
// pipeline rank `stage`.
inline std::string fitting_batch_sizes(const TrainConfig& cfg, const ModelConfig& model, int world, size_t budget,
                                       int sample_positions, int micro_steps, int stage) {
  std::string out = "largest --batch-size that fits " + format_bytes(budget) + ":";
  for (int r = 0; r <= kRecomputeMax; ++r)
    out += std::string(r == 0 ? "" : ",") + " --recompute " + std::to_string(r) + ": " +
           std::to_string(largest_fitting_batch(model, cfg.seq_len, r, dtype_named(cfg.dtype), cfg.zero, world, budget,
                                                cfg.bucket_mib, sample_positions, cfg.zero3_prefetch,
                                                run_tensor_parallelism(cfg),
                                                run_pipeline_memory(cfg, model, micro_steps, stage), cfg.cp,
                                                run_fp8_history(cfg)));
  return out;
}

// " all-reduce 1.2 GiB in 13 call(s), reduce-scatter ..., all-gather ..." per step of `t`, the
// traffic of `steps` steps (a mean number of calls that is not whole shows two decimals).

// " 1.2 MiB in 4 call(s)": the mean over `steps` (a mean that is not whole: two decimals).
inline std::string format_calls(const CollectiveTraffic& c, const char* unit, long long steps) {
  char calls[32];
  if (c.calls % steps == 0) std::snprintf(calls, sizeof calls, "%lld", c.calls / steps);
  else std::snprintf(calls, sizeof calls, "%.2f", static_cast<double>(c.calls) / static_cast<double>(steps));
  return " " + format_bytes(static_cast<size_t>(c.bytes_sent / static_cast<double>(steps))) + " in " + calls + " " +
         unit;
}

inline std::string format_traffic(const StepTraffic& t, long long steps = 1) {
  std::string out;
  const std::pair<const char*, const CollectiveTraffic*> kinds[] = {
      {"all-reduce", &t.all_reduce}, {"reduce-scatter", &t.reduce_scatter}, {"all-gather", &t.all_gather}};
  for (const auto& [name, c] : kinds)
    out += std::string(" ") + name + format_calls(*c, "call(s)", steps) + (c == &t.all_gather ? "" : ",");
  return out;
}
// " all-reduce 1.2 MiB in 4 call(s), sends 140 GiB in 86016 transfer(s)": an EP group's.
inline std::string format_traffic(const ExpertTraffic& t, long long steps = 1) {
  return " all-reduce" + format_calls(t.all_reduce, "call(s)", steps) + ", sends" +
         format_calls(t.sends, "transfer(s)", steps);
}

// "communication per optimizer step, sent by each rank: ..." (comm_plan.h) for a run of `world`
// ranks: the gradients' and parameters' over the data-parallel group (the CP ranks with it), with
// --tp the activations' over the tensor-parallel group, with --cp the ring's K/V and dK/dV
// (context_attention.h; one line each; empty where a group has one rank); with --pp, pipeline rank
// `pipeline_rank`'s (its stage's part).
inline std::string communication_lines(const TrainConfig& cfg, const ModelConfig& model, int world, int micro_steps,
                                       int pipeline_rank = 0) {
  const TensorParallelism tp = run_tensor_parallelism(cfg);
  const StagePart part = cfg.pp > 1 ? run_pipeline_memory(cfg, model, micro_steps, pipeline_rank).stage
                                    : StagePart::whole(model.num_layers);
  const ParameterLayout layout = TensorSplit(model, tp.size, 0, part, tp.experts, 0).local();
  ModelConfig stage_model = model;  // the stage's layers
  stage_model.num_layers = static_cast<int>(part.layers.size());
  const size_t elem = dtype_named(cfg.dtype) == DType::fp32 ? sizeof(float) : sizeof(bf16);
  // --ep: the gradients' data-parallel group is the ranks holding the same experts.
  const int data_ranks = world / (tp.size * cfg.pp * tp.experts), stage = effective_zero_stage(cfg.zero, data_ranks);
  const GradientBuckets buckets =
      gradient_buckets(layout, data_ranks, stage, layers_per_bucket(layout, cfg.bucket_mib, elem), tp.size,
                       tp.experts > 1);
  const std::string per_step = " per optimizer step (" + std::to_string(micro_steps) + " micro-step(s)), sent by each ";
  std::string out;
  if (data_ranks > 1)
    out += "communication" + per_step + "rank on NCCL's rings:" +
           format_traffic(step_traffic(buckets, data_ranks, stage, micro_steps, cfg.zero3_prefetch, elem)) + "\n";
  const int local_T = cfg.seq_len / cfg.cp;  // each sequence's tokens on a rank
  if (tp.size > 1) {
    const size_t rows = static_cast<size_t>(cfg.batch_size) * local_T;
    const size_t chunk = run_logits_rows(cfg, model, cfg.batch_size, world, sampling_positions(cfg, model, nullptr),
                                         micro_steps);
    const int head_chunks = static_cast<int>((rows + chunk - 1) / chunk);
    out += "tensor-parallel communication" + per_step + "rank within its group of " + std::to_string(tp.size) + ":" +
           format_traffic(tp_step_traffic(stage_model, cfg.batch_size, local_T, tp,
                                          stage_recompute(cfg, pipeline_rank), head_chunks,
                                          micro_steps, buckets, stage >= 2, elem, part.embedding, part.head)) + "\n";
  }
  if (cfg.cp > 1) {
    // Each layer's attention passes K/V once per forward (twice where the recompute setting reruns
    // the block's forward in the backward) and K/V with their gradient once per backward.
    const int c = cfg.seq_len / (2 * cfg.cp), C = model.channels / tp.size, NH = model.num_heads / tp.size,
              NKV = model.kv_heads() / tp.size, B = cfg.batch_size;
    const bool reruns = !block_keeps(BlockTensor::other, stage_recompute(cfg, pipeline_rank));
    const size_t forward = ContextAttention<float>::forward_send_bytes(cfg.cp, B, c, C, NH, NKV, elem);
    const size_t backward = ContextAttention<float>::backward_send_bytes(cfg.cp, B, c, C, NH, NKV, elem);
    const size_t layers = part.layers.size() * static_cast<size_t>(micro_steps);
    const std::string n = std::to_string(cfg.cp), n1 = std::to_string(cfg.cp - 1);
    out += "context-parallel communication" + per_step + "rank to the next of its ring of " + n + ": K/V " +
           format_bytes(layers * forward * (reruns ? 2 : 1)) + " forward" + (reruns ? " (its forward run twice)" : "") +
           ", K/V and dK/dV " + format_bytes(layers * backward) + " backward; per layer and micro-batch " +
           format_bytes(forward) + " in " + n1 + " K/V pass(es) and " + format_bytes(backward) + " in " + n1 +
           " K/V and " + n + " fp32 dK/dV pass(es), each behind a block's attention\n";
  }
  if (tp.experts > 1 && model.moe()) {
    const int rows = cfg.batch_size * local_T / (tp.sequence_parallel ? tp.size : 1);  // routed on a rank
    const bool reruns = !block_keeps(BlockTensor::other, stage_recompute(cfg, pipeline_rank));
    out += "expert-parallel communication" + per_step + "rank within its EP group of " + std::to_string(tp.experts) +
           " (balanced routing; real routing moves the rows):" +
           format_traffic(ep_step_traffic(stage_model, rows, tp.experts, reruns, micro_steps, buckets, stage >= 2, elem)) +
           "\n";
  }
  return out;
}

// "0-9, 20-29": a pipeline rank's layers as ranges.
inline std::string layer_ranges(const std::vector<int>& layers) {
  std::string out;
  for (size_t i = 0; i < layers.size();) {
    size_t j = i;
    while (j + 1 < layers.size() && layers[j + 1] == layers[j] + 1) ++j;
    out += (out.empty() ? "" : ", ") + std::to_string(layers[i]) + (j > i ? "-" + std::to_string(layers[j]) : "");
    i = j + 1;
  }
  return out;
}

// --plan's pipeline lines: the schedule and its bubble (the unit-cost simulator's,
// pipeline_check.h), each stage's layers, activation sets in flight and total, and the
// activations and gradients each stage sends per optimizer step (with experts, each with its
// routing tail).
inline std::string pipeline_plan_lines(const TrainConfig& cfg, const ModelConfig& model, int world, int sampling,
                                       int micro_steps, int largest) {
  const PipelineShape shape = run_pipeline_shape(cfg, micro_steps);
  const std::vector<PipelineTable> tables = build_pipeline_schedule(shape);
  const PipelineTiming timing = time_pipeline_schedule(shape, tables);
  const TensorParallelism tp = run_tensor_parallelism(cfg);
  const size_t elem = dtype_named(cfg.dtype) == DType::fp32 ? sizeof(float) : sizeof(bf16);
  const size_t boundary = static_cast<size_t>(cfg.batch_size) * (cfg.seq_len / cfg.cp) /
                          (tp.sequence_parallel ? tp.size : 1) * model.channels * elem +
                          (model.moe() ? 2 * sizeof(int) * model.num_experts : 0);  // the routing tail (expert_mlp.h)
  char line[256];
  std::snprintf(line, sizeof line,
                "pipeline: %s, %d stage(s)%s, %d micro-batch(es) per step; rank = (d·%d + s)·%d + t (data-parallel "
                "replica d, stage s, TP rank t)\n  bubble (unit costs): %.1f%% of the step, %.1f%% over the ideal\n",
                pipeline_kind_name(shape.kind), cfg.pp,
                cfg.pp_virtual > 1 ? (" x " + std::to_string(cfg.pp_virtual) + " chunks").c_str() : "", micro_steps, cfg.pp,
                cfg.tp, 100.0 * timing.bubble(), 100.0 * timing.bubble_over_ideal());
  std::string out = line;
  for (int s = 0; s < cfg.pp; ++s) {
    const PipelineMemory m = run_pipeline_memory(cfg, model, micro_steps, s);
    const MemoryPlan plan = run_memory_plan(cfg, model, cfg.batch_size, world, sampling, micro_steps, s);
    int sends = 0;
    for (const PipelineAction& a : tables[s]) sends += is_send(a.op) ? 1 : 0;
    std::snprintf(line, sizeof line, "  stage %d: layers %s%s%s, %d activation set(s) in flight at --recompute %d, %s "
                  "per rank%s; sends %s per step in %d transfer(s)\n",
                  s, layer_ranges(m.stage.layers).c_str(), m.stage.embedding ? " + embedding" : "",
                  m.stage.head ? " + final norm, lm head and loss" : "", m.in_flight, stage_recompute(cfg, s),
                  format_bytes(plan.total()).c_str(),
                  s == largest ? " (the largest: its terms below)" : "", format_bytes(sends * boundary).c_str(), sends);
    out += line;
  }
  return out;
}

// --pp-timeline FILE: the run's schedule at unit costs as pipeline_timeline_json (atomically).
inline void write_pipeline_timeline(const TrainConfig& cfg, int micro_steps) {
  const PipelineShape shape = run_pipeline_shape(cfg, micro_steps);
  const std::string json = pipeline_timeline_json(shape, time_pipeline_schedule(shape, build_pipeline_schedule(shape))) + "\n";
  AtomicFileWriter file(cfg.pp_timeline);
  file.write(json.data(), json.size());
  file.commit();
  std::printf("  timeline written to %s (draw it: dev/pipeline_timeline.py %s -o TIMELINE.png)\n", cfg.pp_timeline.c_str(),
              cfg.pp_timeline.c_str());
}

// --plan's exit status when the plan exceeds the budget (scripts can test it; 1 is a bad input).
constexpr int kPlanDoesNotFitStatus = 2;

// --plan: each rank's device memory for --world-size ranks (else the launch's), against --gpu-memory or the device's
// total memory (none without a device). Reads only the model's architecture: no data, no GPU
// needed, nothing written. Returns the exit status: 0, or kPlanDoesNotFitStatus.
inline int print_memory_plan(TrainConfig cfg) {
  if (!cfg.resume.empty())
    throw std::invalid_argument("--plan takes the architecture from --model or --init-from, not --resume");
  // Without --world-size: the launch's (mpirun, srun), as the run would have. Every rank of a launch
  // plans the same run; rank 0 alone prints it.
  const LaunchInfo launch = with_context("--plan", [] { return detect_launch(); });
  const int world = cfg.world_size > 0 ? cfg.world_size : launch.world_size;
  const int micro_steps = validate_config(cfg, world);
  std::string source;
  const ModelConfig model = resolve_model(cfg, std::nullopt, &source);
  validate_against_model(cfg, model.max_seq_len, source);
  validate_fp8_shapes(cfg, model, source);
  validate_experts(cfg, model, source);
  with_context("model " + source, [&] { choose_attention(cfg.attention, dtype_named(cfg.dtype), model); });
  check_micro_batch(model, cfg.batch_size, cfg.seq_len, cfg.recompute);
  check_tensor_split(model, cfg.tp, "--tp");
  check_pipeline_split(model, cfg);
  const size_t budget = chunk_budget(cfg);
  const int sampling = sampling_positions(cfg, model, nullptr);
  const int largest = largest_stage(cfg, model, cfg.batch_size, world, sampling, micro_steps);
  const MemoryPlan plan = run_memory_plan(cfg, model, cfg.batch_size, world, sampling, micro_steps, largest);
  const int status = budget > 0 && plan.total() > budget ? kPlanDoesNotFitStatus : 0;
  if (launch.rank != 0) return status;
  const int data_ranks = world / (cfg.tp * cfg.pp * cfg.ep);  // the gradients' group (--ep: the expert-DP group)
  std::printf("memory plan per rank: %s (%s parameters) from %s, --batch-size %d --seq-len %d, %s, --recompute %d, "
              "ZeRO stage %d over %d rank(s)%s%s%s%s\n",
              describe(model).c_str(), thousands(ParameterLayout(model).total).c_str(), source.c_str(), cfg.batch_size,
              cfg.seq_len, cfg.dtype.c_str(), stage_recompute(cfg, largest), effective_zero_stage(cfg.zero, data_ranks), world,
              cfg.tp > 1 ? (" in tensor-parallel groups of " + std::to_string(cfg.tp) +
                            (cfg.sequence_parallel ? " (sequence parallel)" : "")).c_str()
                         : "",
              cfg.pp > 1 ? (", " + std::to_string(cfg.pp) + " pipeline stages").c_str() : "",
              cfg.cp > 1 ? (", context-parallel groups of " + std::to_string(cfg.cp) + " (" +
                            std::to_string(cfg.seq_len / cfg.cp) + " tokens of each sequence per rank)").c_str()
                         : "",
              cfg.ep > 1 ? (", expert-parallel groups of " + std::to_string(cfg.ep) + " (" +
                            std::to_string(model.num_experts / cfg.ep) + " expert(s) per rank)").c_str()
                         : "");
  if (cfg.pp > 1) std::printf("%s", pipeline_plan_lines(cfg, model, world, sampling, micro_steps, largest).c_str());
  if (!cfg.pp_timeline.empty()) with_context("--pp-timeline " + cfg.pp_timeline, [&] { write_pipeline_timeline(cfg, micro_steps); });
  std::printf("%s", format_memory_plan(plan, budget).c_str());
  if (budget > 0) std::printf("%s\n", fitting_batch_sizes(cfg, model, world, budget, sampling, micro_steps, largest).c_str());
  else std::printf("no device and no --gpu-memory: pass --gpu-memory GiB to see what fits\n");
  std::printf("not counted: the CUDA context and NCCL's buffers (leave ~1 GiB per GPU)\n");
  std::printf("%s", communication_lines(cfg, model, world, micro_steps, largest).c_str());
  return status;
}

// Before a run allocates: its plan against --gpu-memory or the device's free memory. A run that
// would not fit stops here with the plan, not with an out-of-memory error halfway through.
inline void check_memory_fits(const RunSetup& setup, int world) {
  const TrainConfig& cfg = setup.cfg;
  size_t budget = static_cast<size_t>(cfg.gpu_memory * kBytesPerGiB), total = 0;
  const char* source = "--gpu-memory";
  if (budget == 0) {
    cuda_check(cudaMemGetInfo(&budget, &total), "querying free device memory");
    source = "free device memory";
  }
  const int sampling = sampling_positions(cfg, setup.model, setup.sampler.get());
  const int m = setup.grad_accum_steps;
  // Every rank decides alike: by the pipeline stage that needs the most.
  const int stage = largest_stage(cfg, setup.model, cfg.batch_size, world, sampling, m);
  const MemoryPlan plan = run_memory_plan(cfg, setup.model, cfg.batch_size, world, sampling, m, stage);
  if (plan.total() <= budget) return;
  std::printf("memory plan per rank (%s%s):\n%s", model_sizing(setup).c_str(),
              cfg.pp > 1 ? (", pipeline stage " + std::to_string(stage)).c_str() : "",
              format_memory_plan(plan, budget).c_str());
  std::fflush(stdout);
  throw std::runtime_error("the run needs " + format_bytes(plan.total()) + " of device memory per rank and " + source +
                           " is " + format_bytes(budget) + "; " +
                           fitting_batch_sizes(cfg, setup.model, world, budget, sampling, m, stage) + " (see --plan)");
}
