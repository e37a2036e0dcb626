// metrics.h — what a run reports: one human-readable line per step on stdout and one JSON
// object per line in DIR/metrics.jsonl:
//   {"step": k, "train_loss": …, "lr": …, "grad_norm": …, "ms": …, "tokens_per_s": …, "mfu": …}
//   {"step": k, "val_loss": …}
//   {"step": k, "hellaswag_acc_norm": …, "hellaswag_acc": …, "hellaswag_examples": N}
//   {"step": k, "sample": "<prompt and continuation>"}   (--sample-every; invalid UTF-8 as U+FFFD)
// "mfu" is a fraction (0.41 = 41%), absent when the GPU's peak is unknown (src/run/throughput.h).
// A step whose update was skipped (src/model/step_guards.h) has one more key, "skipped": "<why>".
// Each line goes to the file with one write() on a descriptor opened for appending, so it lands
// whole at the end of the file as soon as the step is done: a crash of the process, or a
// `tail -f`, sees every finished record and never half of one. Non-finite values are written as
// JSON null (JSON has no NaN).
#pragma once
#include "src/base/durable_file.h"
#include "src/data/hellaswag.h"

#include <fcntl.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

struct StepRecord {
  long long step = 0, total_steps = 0;
  double train_loss = 0, lr = 0, grad_norm = 0, ms = 0, tokens_per_s = 0;
  double eta_seconds = 0;  // estimated time for the remaining steps
  double mfu = NAN;        // model FLOPs utilization (src/run/throughput.h); NaN: the GPU's peak is unknown
  std::string skipped;     // why the update was not applied (src/model/step_guards.h); empty: applied
};

// "45s", "12m05s", "3h07m".
inline std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  long long s = std::llround(seconds);
  char buf[48];
  if (s < 60) std::snprintf(buf, sizeof buf, "%llds", s);
  else if (s < 3600) std::snprintf(buf, sizeof buf, "%lldm%02llds", s / 60, s % 60);
  else std::snprintf(buf, sizeof buf, "%lldh%02lldm", s / 3600, (s % 3600) / 60);
  return buf;
}

inline std::string format_step_line(const StepRecord& r) {
  char mfu[32] = "";
  if (std::isfinite(r.mfu)) std::snprintf(mfu, sizeof mfu, " | MFU %.1f%%", 100.0 * r.mfu);
  char buf[288];
  std::snprintf(buf, sizeof buf, "step %*lld/%lld | loss %.6f | lr %.3e | norm %.4f | %.1f ms | %.0f tok/s%s | ETA %s",
                static_cast<int>(std::to_string(r.total_steps).size()), r.step, r.total_steps, r.train_loss, r.lr,
                r.grad_norm, r.ms, r.tokens_per_s, mfu, format_duration(r.eta_seconds).c_str());
  if (!r.skipped.empty()) return std::string(buf) + " | update skipped: " + r.skipped;
  return buf;
}

inline std::string format_val_line(long long step, long long total_steps, double val_loss) {
  char buf[128];
  std::snprintf(buf, sizeof buf, "step %*lld/%lld | val loss %.6f", static_cast<int>(std::to_string(total_steps).size()),
                step, total_steps, val_loss);
  return buf;
}

// "hellaswag acc_norm 0.2950 (2963/10042) | acc 0.2871 (2883/10042)"
inline std::string format_hellaswag(const ChoiceResult& r) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "hellaswag acc_norm %.4f (%lld/%lld) | acc %.4f (%lld/%lld)", r.acc_norm(),
                r.correct_norm, r.examples, r.acc(), r.correct_sum, r.examples);
  return buf;
}

inline std::string format_hellaswag_line(long long step, long long total_steps, const ChoiceResult& r) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step %*lld/%lld | ", static_cast<int>(std::to_string(total_steps).size()), step,
                total_steps);
  return buf + format_hellaswag(r);
}

// "step 40/100 | sample: \"Once upon a time...\"": the text as a JSON string, so that newlines in it
// keep the log one line per record.
inline std::string format_sample_line(long long step, long long total_steps, const std::string& text) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step %*lld/%lld | sample: ", static_cast<int>(std::to_string(total_steps).size()),
                step, total_steps);
  return buf + nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// Mean step time for the ETA; the first step is left out once others exist because it
// pays one-time costs (allocation, cuBLASLt heuristics, page faults).
class StepClock {
 public:
  void add(double ms) {
    if (count_ == 0) first_ms_ = ms;
    else later_ms_ += ms;
    ++count_;
  }
  double eta_seconds(long long remaining_steps) const {
    if (count_ == 0) return NAN;
    double mean_ms = count_ == 1 ? first_ms_ : later_ms_ / static_cast<double>(count_ - 1);
    return mean_ms * static_cast<double>(remaining_steps) / 1000.0;
  }

 private:
  long long count_ = 0;
  double first_ms_ = 0, later_ms_ = 0;
};

// Appends records to a metrics.jsonl it creates (truncating a previous run's file), or, for a
// resumed run (append = true), to the records the run kept.
class MetricsLog {
 public:
  explicit MetricsLog(const std::string& path, bool append = false)
      : path_(path), fd_(::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | (append ? 0 : O_TRUNC), 0644)) {
    if (fd_ < 0) throw std::runtime_error("cannot create " + path + ": " + std::strerror(errno));
  }
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;
  ~MetricsLog() { ::close(fd_); }

  void train_step(const StepRecord& r) {
    nlohmann::ordered_json record = {{"step", r.step}, {"train_loss", r.train_loss}, {"lr", r.lr},
                                     {"grad_norm", r.grad_norm}, {"ms", r.ms}, {"tokens_per_s", r.tokens_per_s}};
    if (std::isfinite(r.mfu)) record["mfu"] = r.mfu;
    if (!r.skipped.empty()) record["skipped"] = r.skipped;
    write(record);
  }
  void validation(long long step, double val_loss) { write({{"step", step}, {"val_loss", val_loss}}); }
  void sample(long long step, const std::string& text) { write({{"step", step}, {"sample", text}}); }
  void hellaswag(long long step, const ChoiceResult& r) {
    write({{"step", step}, {"hellaswag_acc_norm", r.acc_norm()}, {"hellaswag_acc", r.acc()},
           {"hellaswag_examples", r.examples}});
  }

 private:
  void write(const nlohmann::ordered_json& record) {
    // A sample's bytes may cut a UTF-8 sequence: replaced (U+FFFD), as JSON holds Unicode text only.
    const std::string line = record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    for (size_t done = 0; done < line.size();) {
      const ssize_t n = ::write(fd_, line.data() + done, line.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) throw std::runtime_error("cannot write " + path_ + ": " + std::strerror(n < 0 ? errno : ENOSPC));
      done += static_cast<size_t>(n);
    }
  }

  std::string path_;
  int fd_;
};

// On resume: metrics.jsonl keeps the records of steps up to `step` (later ones belong to steps
// that will run again). Rewritten atomically. A line that is not such a record (damaged, e.g.
// the torn last line of a machine that lost power) is dropped too, and reported: the returned
// list has one "PATH line N: ..." per dropped line.
inline std::vector<std::string> keep_metrics_through_step(const std::string& path, long long step) {
  std::ifstream in(path);
  std::string kept, line;
  std::vector<std::string> damaged;
  for (long long number = 1; std::getline(in, line); ++number) {
    const nlohmann::json record = nlohmann::json::parse(line, nullptr, false);  // not JSON: "discarded", no object
    if (!record.is_object() || !record.contains("step") || !record.at("step").is_number_integer()) {
      const std::string shown = line.size() > 60 ? line.substr(0, 60) + "..." : line;
      damaged.push_back(path + " line " + std::to_string(number) + ": not a metrics record, dropped: '" + shown + "'");
      continue;
    }
    if (record.at("step").get<long long>() <= step) kept += line + "\n";
  }
  AtomicFileWriter out(path);
  out.write(kept.data(), kept.size());
  out.commit();
  return damaged;
}
