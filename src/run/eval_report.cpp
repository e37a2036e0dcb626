// eval_report.cpp — the --eval-losses file: one JSON line per example.
#include "src/run/eval_report.h"

#include "src/base/durable_file.h"

#include <nlohmann/json.hpp>

void write_eval_losses(const std::string& path, const ChoiceEvalSet& eval, const std::vector<double>& sums) {
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
  AtomicFileWriter out(path);
  out.write(lines.data(), lines.size());
  out.commit();
}
