// metrics.h — what a run reports: one human-readable line per step on stdout and one JSON
// object per line in DIR/metrics.jsonl:
//   {"step": k, "train_loss": …, "lr": …, "grad_norm": …, "ms": …, "tokens_per_s": …}
//   {"step": k, "val_loss": …}
// A step whose update was skipped (src/step_guards.h) has one more key, "skipped": "<why>".
// Both are flushed line by line so a crash or a `tail -f` sees every finished step.
// Non-finite values are written as JSON null (JSON has no NaN).
#pragma once
#include "durable_file.h"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>

struct StepRecord {
  long long step = 0, total_steps = 0;
  double train_loss = 0, lr = 0, grad_norm = 0, ms = 0, tokens_per_s = 0;
  double eta_seconds = 0;  // estimated time for the remaining steps
  std::string skipped;     // why the update was not applied (src/step_guards.h); empty: applied
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
  char buf[256];
  std::snprintf(buf, sizeof buf, "step %*lld/%lld | loss %.6f | lr %.3e | norm %.4f | %.1f ms | %.0f tok/s | ETA %s",
                static_cast<int>(std::to_string(r.total_steps).size()), r.step, r.total_steps, r.train_loss, r.lr,
                r.grad_norm, r.ms, r.tokens_per_s, format_duration(r.eta_seconds).c_str());
  if (!r.skipped.empty()) return std::string(buf) + " | update skipped: " + r.skipped;
  return buf;
}

inline std::string format_val_line(long long step, long long total_steps, double val_loss) {
  char buf[128];
  std::snprintf(buf, sizeof buf, "step %*lld/%lld | val loss %.6f", static_cast<int>(std::to_string(total_steps).size()),
                step, total_steps, val_loss);
  return buf;
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
      : path_(path), file_(std::fopen(path.c_str(), append ? "a" : "w")) {
    if (!file_) throw std::runtime_error("cannot create " + path + ": " + std::strerror(errno));
  }
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;
  ~MetricsLog() { std::fclose(file_); }

  void train_step(const StepRecord& r) {
    nlohmann::ordered_json record = {{"step", r.step}, {"train_loss", r.train_loss}, {"lr", r.lr},
                                     {"grad_norm", r.grad_norm}, {"ms", r.ms}, {"tokens_per_s", r.tokens_per_s}};
    if (!r.skipped.empty()) record["skipped"] = r.skipped;
    write(record);
  }
  void validation(long long step, double val_loss) { write({{"step", step}, {"val_loss", val_loss}}); }

 private:
  void write(const nlohmann::ordered_json& record) {
    std::string line = record.dump() + "\n";
    if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0)
      throw std::runtime_error("cannot write " + path_ + ": " + std::strerror(errno));
  }

  std::string path_;
  std::FILE* file_;
};

// On resume: metrics.jsonl keeps the records of steps up to `step` (later ones belong to steps
// that will run again; a torn last line of a killed run is dropped). Rewritten atomically.
inline void keep_metrics_through_step(const std::string& path, long long step) {
  std::ifstream in(path);
  std::string kept, line;
  while (std::getline(in, line)) {
    nlohmann::json record;
    try {
      record = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error&) {
      continue;
    }
    if (record.is_object() && record.contains("step") && record["step"].is_number_integer() &&
        record["step"].get<long long>() <= step)
      kept += line + "\n";
  }
  AtomicFileWriter out(path);
  out.write(kept.data(), kept.size());
  out.commit();
}
