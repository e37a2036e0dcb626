// pipeline_setup.h — a run's pipeline from its flags: the schedule's shape (--pp, --pp-schedule,
// --pp-virtual; the gradient accumulation steps are its micro-batches), each pipeline rank's part
// (its layers from src/dist/pipeline_stages.h' cut, the activation sets its table keeps in flight)
// for the memory plan, and this rank's place for the model (the groups' communicators).
#pragma once
#include "src/config/config.h"
#include "src/dist/parallel_groups.h"
#include "src/dist/pipeline_schedule.h"
#include "src/dist/pipeline_stages.h"
#include "src/dist/tensor_split.h"
#include "src/run/memory_plan.h"

#include <vector>

inline PipelineShape run_pipeline_shape(const TrainConfig& cfg, int micro_steps) {
  PipelineShape shape;
  shape.stages = cfg.pp;
  shape.microbatches = micro_steps;
  shape.virtual_stages = cfg.pp_virtual;
  shape.kind = parse_pipeline_kind(cfg.pp_schedule);
  return shape;
}

// Pipeline rank `rank`'s share of the run (none without --pp); `micro_steps`: the gradient
// accumulation steps, the schedule's micro-batches.
inline PipelineMemory run_pipeline_memory(const TrainConfig& cfg, const ModelConfig& model, int micro_steps, int rank) {
  if (cfg.pp == 1) return {};
  const PipelineShape shape = run_pipeline_shape(cfg, micro_steps);
  const PipelineStages stages = plan_pipeline_stages(model, cfg.pp, cfg.pp_virtual, cfg.pp_layers, cfg.seq_len);
  PipelineMemory m;
  m.stage = StagePart::of_rank(stages.chunk_layers, cfg.pp, rank);
  m.stages = cfg.pp;
  m.in_flight = pipeline_activation_sets(build_pipeline_schedule(shape)[rank]);
  m.split_backward = shape.kind == PipelineKind::zb_h1;
  return m;
}

// Every pipeline rank's part of `model` (none without --pp), and this rank's place in the groups.
inline PipelineParts run_pipeline_parts(const TrainConfig& cfg, const ModelConfig& model, int micro_steps,
                                        ParallelGroups& groups) {
  if (cfg.pp == 1) return {};
  PipelineParts parts;
  for (int r = 0; r < cfg.pp; ++r) parts.stages.push_back(run_pipeline_memory(cfg, model, micro_steps, r).stage);
  parts.rank = groups.pp_rank();
  parts.comm = groups.pp();
  parts.tied = model.tied_embeddings ? groups.tied_embedding() : nullptr;
  const PipelineMemory mine = run_pipeline_memory(cfg, model, micro_steps, parts.rank);
  parts.in_flight = mine.in_flight;
  parts.split_backward = mine.split_backward;
  return parts;
}
