// step_guards.cpp — the bad-step guards' decisions
#include "src/model/step_guards.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <limits>
#include <string>
#include <vector>

double ZScoreWindow::z(double x) const {
  double sum = 0.0;
  for (double v : values_) sum += v;
  const double mean = sum / static_cast<double>(values_.size());
  double squares = 0.0;
  for (double v : values_) squares += (v - mean) * (v - mean);
  const double stddev = std::sqrt(squares / static_cast<double>(values_.size()));
  if (stddev == 0.0) return x > mean ? std::numeric_limits<double>::infinity() : 0.0;
  return (x - mean) / stddev;
}

std::string BadStepGuards::check(double loss, double grad_norm) {
  if (!std::isfinite(loss) || !std::isfinite(grad_norm)) {
    ++skipped_nonfinite;
    return !std::isfinite(loss) ? "non-finite loss" : "non-finite gradient norm";
  }
  if (loss_z_limit > 0.0 && loss_window.ready()) {
    const double z = loss_window.z(loss);
    if (z > loss_z_limit) {
      ++skipped_loss_z;
      return "loss z-score " + format(z) + " > " + format(loss_z_limit);
    }
  }
  if (norm_z_limit > 0.0 && norm_window.ready()) {
    const double z = norm_window.z(grad_norm);
    if (z > norm_z_limit) {
      ++skipped_norm_z;
      return "gradient-norm z-score " + format(z) + " > " + format(norm_z_limit);
    }
  }
  loss_window.push(loss);
  norm_window.push(grad_norm);
  return "";
}

std::string BadStepGuards::format(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", x);
  return buf;
}
