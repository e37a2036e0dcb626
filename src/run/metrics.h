// metrics.h — what a run reports: one human-readable line per step on stdout and one JSON
// object per line in DIR/metrics.jsonl:
//   {"step": k, "train_loss": …, "lr": …, "grad_norm": …, "ms": …, "tokens_per_s": …, "mfu": …}
//   {"step": k, "val_loss": …}
//   {"step": k, "hellaswag_acc_norm": …, "hellaswag_acc": …, "hellaswag_examples": N}
//   {"step": k, "sample": "<prompt and continuation>"}   (--sample-every; invalid UTF-8 as U+FFFD)
// "mfu" is a fraction (0.41 = 41%), absent when the GPU's peak is unknown (src/run/throughput.h).
// A step whose update was skipped (src/model/step_guards.h) has one more key, "skipped": "<why>".
// A mixture of experts adds the step's routing on rank 0 (src/model/expert_mlp.h): "aux_loss" (the
// load-balancing loss, mean over micro-batches), "expert_tokens" (rows routed to each expert, over
// every layer and micro-batch) and "expert_imbalance" (the most-loaded expert's tokens / the mean).
// Each line goes to the file with one write() on a descriptor opened for appending, so it lands
// whole at the end of the file as soon as the step is done: a crash of the process, or a
// `tail -f`, sees every finished record and never half of one. Non-finite values are written as
// JSON null (JSON has no NaN).
#pragma once
#include "src/data/hellaswag.h"

#include <nlohmann/json_fwd.hpp>

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

// A mixture of experts' routing in one step (see above).
struct ExpertFigures {
  std::vector<int64_t> tokens;
  double aux_loss = 0, imbalance = 0;
};

// ExpertFigures of a model's routing statistics (src/model/expert_mlp.h's ExpertStats).
template <typename Stats>
ExpertFigures expert_figures(const Stats& s) {
  return {s.tokens, s.aux_loss(), s.imbalance()};
}

struct StepRecord {
  long long step = 0, total_steps = 0;
  double train_loss = 0, lr = 0, grad_norm = 0, ms = 0, tokens_per_s = 0;
  double eta_seconds = 0;  // estimated time for the remaining steps
  double mfu = NAN;        // model FLOPs utilization (src/run/throughput.h); NaN: the GPU's peak is unknown
  std::string skipped;     // why the update was not applied (src/model/step_guards.h); empty: applied
  std::optional<ExpertFigures> experts;  // a mixture of experts' routing
};

// "45s", "12m05s", "3h07m".
std::string format_duration(double seconds);

std::string format_step_line(const StepRecord& r);

std::string format_val_line(long long step, long long total_steps, double val_loss);

// "hellaswag acc_norm 0.2950 (2963/10042) | acc 0.2871 (2883/10042)"
std::string format_hellaswag(const ChoiceResult& r);

std::string format_hellaswag_line(long long step, long long total_steps, const ChoiceResult& r);

// "step 40/100 | sample: \"Once upon a time...\"": the text as a JSON string, so that newlines in it
// keep the log one line per record.
std::string format_sample_line(long long step, long long total_steps, const std::string& text);

// Mean step time for the ETA; the first step is left out once others exist because it
// pays one-time costs (allocation, cuBLASLt heuristics, page faults).
class StepClock {
 public:
  void add(double ms);
  double eta_seconds(long long remaining_steps) const;

 private:
  long long count_ = 0;
  double first_ms_ = 0, later_ms_ = 0;
};

// Appends records to a metrics.jsonl it creates (truncating a previous run's file), or, for a
// resumed run (append = true), to the records the run kept.
class MetricsLog {
 public:
  explicit MetricsLog(const std::string& path, bool append = false);
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;
  ~MetricsLog();

  void train_step(const StepRecord& r);
  void validation(long long step, double val_loss);
  void sample(long long step, const std::string& text);
  void hellaswag(long long step, const ChoiceResult& r);

 private:
  void write(const nlohmann::ordered_json& record);

  std::string path_;
  int fd_;
};

// On resume: metrics.jsonl keeps the records of steps up to `step` (later ones belong to steps
// that will run again). Rewritten atomically. A line that is not such a record (damaged, e.g.
// the torn last line of a machine that lost power) is dropped too, and reported: the returned
// list has one "PATH line N: ..." per dropped line.
std::vector<std::string> keep_metrics_through_step(const std::string& path, long long step);
