// metrics.cpp — the log lines and metrics.jsonl: formatting, whole-line appends, resume's truncation
#include "src/run/metrics.h"

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

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  long long s = std::llround(seconds);
  char buf[48];
  if (s < 60) std::snprintf(buf, sizeof buf, "%llds", s);
  else if (s < 3600) std::snprintf(buf, sizeof buf, "%lldm%02llds", s / 60, s % 60);
  else std::snprintf(buf, sizeof buf, "%lldh%02lldm", s / 3600, (s % 3600) / 60);
  return buf;
}

std::string format_step_line(const StepRecord& r) {
  char mfu[32] = "";
  if (std::isfinite(r.mfu)) std::snprintf(mfu, sizeof mfu, " | MFU %.1f%%", 100.0 * r.mfu);
  char buf[288];
  std::snprintf(buf, sizeof buf, "step %*lld/%lld | loss %.6f | lr %.3e | norm %.4f | %.1f ms | %.0f tok/s%s | ETA %s",
                static_cast<int>(std::to_string(r.total_steps).size()), r.step, r.total_steps, r.train_loss, r.lr,
                r.grad_norm, r.ms, r.tokens_per_s, mfu, format_duration(r.eta_seconds).c_str());
  std::string line = buf;
  if (r.experts) {
    char experts[96];
    std::snprintf(experts, sizeof experts, " | aux %.4f | imbalance %.2f", r.experts->aux_loss, r.experts->imbalance);
    line += experts;
  }
  if (!r.skipped.empty()) line += " | update skipped: " + r.skipped;
  return line;
}

std::string format_val_line(long long step, long long total_steps, double val_loss) {
  char buf[128];
  std::snprintf(buf, sizeof buf, "step %*lld/%lld | val loss %.6f", static_cast<int>(std::to_string(total_steps).size()),
                step, total_steps, val_loss);
  return buf;
}

std::string format_hellaswag(const ChoiceResult& r) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "hellaswag acc_norm %.4f (%lld/%lld) | acc %.4f (%lld/%lld)", r.acc_norm(),
                r.correct_norm, r.examples, r.acc(), r.correct_sum, r.examples);
  return buf;
}

std::string format_hellaswag_line(long long step, long long total_steps, const ChoiceResult& r) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step %*lld/%lld | ", static_cast<int>(std::to_string(total_steps).size()), step,
                total_steps);
  return buf + format_hellaswag(r);
}

std::string format_sample_line(long long step, long long total_steps, const std::string& text) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step %*lld/%lld | sample: ", static_cast<int>(std::to_string(total_steps).size()),
                step, total_steps);
  return buf + nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

void StepClock::add(double ms) {
  if (count_ == 0) first_ms_ = ms;
  else later_ms_ += ms;
  ++count_;
}

double StepClock::eta_seconds(long long remaining_steps) const {
  if (count_ == 0) return NAN;
  double mean_ms = count_ == 1 ? first_ms_ : later_ms_ / static_cast<double>(count_ - 1);
  return mean_ms * static_cast<double>(remaining_steps) / 1000.0;
}

MetricsLog::MetricsLog(const std::string& path, bool append)
    : path_(path), fd_(::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | (append ? 0 : O_TRUNC), 0644)) {
  if (fd_ < 0) throw std::runtime_error("cannot create " + path + ": " + std::strerror(errno));
}

MetricsLog::~MetricsLog() { ::close(fd_); }

void MetricsLog::validation(long long step, double val_loss) { write({{"step", step}, {"val_loss", val_loss}}); }

void MetricsLog::sample(long long step, const std::string& text) { write({{"step", step}, {"sample", text}}); }

void MetricsLog::hellaswag(long long step, const ChoiceResult& r) {
  write({{"step", step}, {"hellaswag_acc_norm", r.acc_norm()}, {"hellaswag_acc", r.acc()},
         {"hellaswag_examples", r.examples}});
}

void MetricsLog::train_step(const StepRecord& r) {
  nlohmann::ordered_json record = {{"step", r.step}, {"train_loss", r.train_loss}, {"lr", r.lr},
                                   {"grad_norm", r.grad_norm}, {"ms", r.ms}, {"tokens_per_s", r.tokens_per_s}};
  if (std::isfinite(r.mfu)) record["mfu"] = r.mfu;
  if (r.experts) {
    record["aux_loss"] = r.experts->aux_loss;
    record["expert_tokens"] = r.experts->tokens;
    record["expert_imbalance"] = r.experts->imbalance;
  }
  if (!r.skipped.empty()) record["skipped"] = r.skipped;
  write(record);
}

void MetricsLog::write(const nlohmann::ordered_json& record) {
  // A sample's bytes may cut a UTF-8 sequence: replaced (U+FFFD), as JSON holds Unicode text only.
  const std::string line = record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  for (size_t done = 0; done < line.size();) {
    const ssize_t n = ::write(fd_, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw std::runtime_error("cannot write " + path_ + ": " + std::strerror(n < 0 ? errno : ENOSPC));
    done += static_cast<size_t>(n);
  }
}

std::vector<std::string> keep_metrics_through_step(const std::string& path, long long step) {
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
