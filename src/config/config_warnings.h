// config_warnings.h — the warnings at the start of a run about flag values that are valid but
// unlikely to be meant (they would otherwise cost a run before anyone noticed).
#pragma once
#include "src/config/config.h"

#include <cstdint>
#include <string>
#include <vector>

// More accumulation steps than this per optimizer step draw a warning: a larger --batch-size
// usually does the same work in fewer, larger (faster) micro-batches.
constexpr long long kManyAccumulationSteps = 64;

// Flag values that are valid but unlikely to be meant, one line each, for warnings at the start of
// a run. val_batches: the distinct batches --val-data holds (0: no validation).
std::vector<std::string> config_warnings(const TrainConfig& cfg, int grad_accum_steps, uint64_t val_batches);
