// config_warnings.cpp — the start-up warnings about valid but unlikely flag values
#include "src/config/config_warnings.h"

#include "src/config/config.h"

#include <cstdint>
#include <string>
#include <vector>

std::vector<std::string> config_warnings(const TrainConfig& cfg, int grad_accum_steps, uint64_t val_batches) {
  std::vector<std::string> warnings;
  if (cfg.max_steps > 0 && cfg.warmup_steps >= cfg.max_steps)
    warnings.push_back("--warmup-steps " + std::to_string(cfg.warmup_steps) + " >= --max-steps " +
                       std::to_string(cfg.max_steps) + ": the whole run is warm-up (the learning rate rises every step "
                       "and never decays)");
  if (cfg.max_steps > 0 && grad_accum_steps > kManyAccumulationSteps)
    warnings.push_back("--total-batch-tokens " + std::to_string(cfg.total_batch_tokens) + " means " +
                       std::to_string(grad_accum_steps) + " accumulation steps of batch-size x seq-len x ranks per "
                       "optimizer step (more than " + std::to_string(kManyAccumulationSteps) +
                       "; a larger --batch-size takes fewer)");
  if (val_batches > 0 && static_cast<uint64_t>(cfg.val_steps) > val_batches)
    warnings.push_back("--val-steps " + std::to_string(cfg.val_steps) + " > the " + std::to_string(val_batches) +
                       " distinct batches of " + std::to_string(cfg.batch_size) + " x " + std::to_string(cfg.seq_len) +
                       " tokens per rank in --val-data: each validation repeats batches");
  if (!cfg.eval_data.empty() && cfg.eval_every == 0 && !cfg.eval && cfg.max_steps > 0)
    warnings.push_back("--eval-data " + cfg.eval_data + " is never evaluated (--eval-every is 0; --eval evaluates a "
                       "model alone)");
  if (cfg.sample_every > cfg.max_steps && cfg.max_steps > 0 && !cfg.generate)
    warnings.push_back("--sample-every " + std::to_string(cfg.sample_every) + " > --max-steps " +
                       std::to_string(cfg.max_steps) + ": no sample is drawn");
  if (cfg.sample_every == 0 && !cfg.generate && cfg.was_set("prompt"))
    warnings.push_back("--prompt is never used (--sample-every is 0; --generate generates from a model alone)");
  return warnings;
}
