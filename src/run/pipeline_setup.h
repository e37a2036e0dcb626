// pipeline_setup.h — a run's pipeline from its flags: the schedule's shape (--pp, --pp-schedule,
// --pp-virtual; the gradient accumulation steps are its micro-batches) and this rank's place in it
// (every stage's layers from src/dist/pipeline_stages.h, the groups' communicators, the activation
// sets its table needs).
#pragma once
#include "src/config/config.h"
#include "src/dist/parallel_groups.h"
#include "src/dist/pipeline_schedule.h"
#include "src/dist/pipeline_stages.h"
#include "src/dist/tensor_split.h"
#include "src/model/pipeline_step.h"

inline PipelineShape run_pipeline_shape(const TrainConfig& cfg, int grad_accum_steps) {
  PipelineShape shape;
  shape.stages = cfg.pp;
  shape.microbatches = grad_accum_steps;
  shape.virtual_stages = cfg.pp_virtual;
  shape.kind = parse_pipeline_kind(cfg.pp_schedule);
  return shape;
}

// Every pipeline rank's part of `model` (none without --pp), and this rank's place.
inline PipelineParts run_pipeline_parts(const TrainConfig& cfg, const ModelConfig& model, int grad_accum_steps,
                                        ParallelGroups& groups) {
  if (cfg.pp == 1) return {};
  const PipelineShape shape = run_pipeline_shape(cfg, grad_accum_steps);
  const PipelineStages stages = plan_pipeline_stages(model, cfg.pp, cfg.pp_virtual, cfg.pp_layers);
  PipelineParts parts;
  for (int r = 0; r < cfg.pp; ++r) parts.stages.push_back(StagePart::of_rank(stages.chunk_layers, cfg.pp, r));
  parts.rank = groups.pp_rank();
  parts.comm = groups.pp();
  parts.tied = model.tied_embeddings ? groups.tied_embedding() : nullptr;
  parts.in_flight = pipeline_activation_sets(build_pipeline_schedule(shape)[parts.rank]);
  parts.split_backward = shape.kind == PipelineKind::zb_h1;
  return parts;
}
