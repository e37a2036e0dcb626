// eval_report.h — --eval-losses: each example's completion losses (sum and mean per completion)
// as JSON lines, written atomically.
#pragma once
#include "src/data/hellaswag.h"

#include <string>
#include <vector>

// `sums`: every completion's summed loss, examples in order, completions in order within each.
void write_eval_losses(const std::string& path, const ChoiceEvalSet& eval, const std::vector<double>& sums);
