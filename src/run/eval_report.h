// eval_report.h — --eval-losses: each example's completion losses (sum and mean per completion) as
// JSON lines, written atomically; the file is checked and opened before the evaluation.
#pragma once
#include "src/base/durable_file.h"
#include "src/config/config.h"
#include "src/data/hellaswag.h"

#include <memory>
#include <string>
#include <vector>

// --eval-losses, before the evaluation: refused (one line) if it names one of the command's inputs
// (the model file `model_path`, --eval-data, --config, a --train-data or --val-data shard; by device
// and inode), then on rank 0 (`lead`) opened for writing — its temp file created, so an unwritable
// path fails now. Nothing replaces the path until write_eval_losses commits. Null without
// --eval-losses, and on the other ranks.
std::unique_ptr<AtomicFileWriter> open_eval_losses(const TrainConfig& cfg, const std::string& model_path, bool lead);

// `sums`: every completion's summed loss, examples in order, completions in order within each.
void write_eval_losses(AtomicFileWriter& out, const ChoiceEvalSet& eval, const std::vector<double>& sums);
