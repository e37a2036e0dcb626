// eval_report.cpp — the --eval-losses file: checked against the inputs, opened early, one JSON line per example
#include "src/run/eval_report.h"

#include "src/base/durable_file.h"
#include "src/base/same_file.h"
#include "src/config/config.h"
#include "src/data/dataloader.h"

#include <nlohmann/json.hpp>

#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

std::unique_ptr<AtomicFileWriter> open_eval_losses(const TrainConfig& cfg, const std::string& model_path, bool lead) {
  if (cfg.eval_losses.empty()) return nullptr;
  std::vector<std::pair<std::string, std::string>> inputs = {
      {"the model file", model_path}, {"--eval-data", cfg.eval_data}, {"--config", cfg.config_file}};
  for (const auto& [flag, pattern] : {std::pair<std::string, std::string>{"--train-data", cfg.train_data},
                                      {"--val-data", cfg.val_data}}) {
    try {
      for (const std::string& shard : dataloader_detail::matching_files(pattern)) inputs.emplace_back(flag, shard);
    } catch (const std::exception&) {  // nothing matches: no shard to replace
    }
  }
  for (const auto& [what, path] : inputs)
    if (!path.empty() && same_file(cfg.eval_losses, path))
      throw std::runtime_error("--eval-losses " + cfg.eval_losses + " is " + what + " " + path +
                               ": the losses would replace an input; choose another path");
  if (!lead) return nullptr;
  try {
    return std::make_unique<AtomicFileWriter>(cfg.eval_losses);
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string("--eval-losses: ") + e.what());
  }
}

void write_eval_losses(AtomicFileWriter& out, const ChoiceEvalSet& eval, const std::vector<double>& sums) {
  std::string lines;
  size_t at = 0;
  for (size_t i = 0; i < eval.examples.size(); ++i) {
    const ChoiceExample& ex = eval.examples[i];
    nlohmann::ordered_json sum = nlohmann::json::array(), mean = nlohmann::json::array();
    for (size_t k = 0; k < ex.completions.size(); ++k, ++at) {
      sum.push_back(sums[at]);
      mean.push_back(sums[at] / static_cast<double>(ex.completions[k].size()));
    }
    lines += nlohmann::ordered_json{{"example", i}, {"label", ex.label}, {"loss_sum", sum}, {"loss_mean", mean}}.dump() +
             "\n";
  }
  out.write(lines.data(), lines.size());
  out.commit();
}
