// config_checks.h — checks that need several flags together (or the model), and the learning-rate
// schedule the flags describe. Errors are std::invalid_argument naming the flags.
#pragma once
#include "src/config/config.h"
#include "src/config/lr_schedule.h"
#include "src/config/model_config.h"

#include <climits>
#include <stdexcept>
#include <string>

// Checks that need several flags together; resolves total_batch_tokens' default.
// Returns the gradient accumulation steps per optimizer step.
int validate_config(TrainConfig& cfg, int world_size);

// Checks the sequence length against the model (max_seq_len from the preset or file header).
void validate_against_model(const TrainConfig& cfg, int max_seq_len, const std::string& model_source);

// With --fp8: every width of the blocks' products (per TP rank) and the rank's rows B*T/--cp are
// multiples of 16 (kernels/matmul_fp8.cuh). model_source names the model in the error.
void validate_fp8_shapes(const TrainConfig& cfg, const ModelConfig& model, const std::string& model_source);
// Throws on expert flags for a model without experts, and on what experts do not compose with yet.
void validate_experts(const TrainConfig& cfg, const ModelConfig& model, const std::string& model_source);

LrSchedule make_lr_schedule(const TrainConfig& cfg);
