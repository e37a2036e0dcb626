// step_guards.h — decides whether an optimizer step's update is applied (docs/CHECKPOINTS.md,
// "Bad-step guards").
//
// A step is skipped (gradients dropped, parameters and AdamW moments untouched; the step number,
// the learning-rate schedule and the data still advance) when
//   1. its loss or its global gradient norm is not finite (always on), or
//   2. --skip-loss-z X > 0 and the loss lies more than X standard deviations above the mean of
//      the last kCapacity accepted steps' losses, or
//   3. --skip-norm-z X > 0 and the same holds for the gradient norm.
// The z-score guards wait for kMinSamples accepted steps. Skipped steps never enter the windows,
// so a spike does not become the new normal. Counters and windows are part of the training
// state (src/ckpt/checkpoint.h), so a resumed run takes the same decisions.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <limits>
#include <string>
#include <vector>

// Running statistics over the most recent accepted values (oldest first).
class ZScoreWindow {
 public:
  static constexpr size_t kCapacity = 100;
  static constexpr size_t kMinSamples = 8;

  bool ready() const { return values_.size() >= kMinSamples; }

  // (x − mean) / std over the window (population std). A constant window gives +inf for any x
  // above it and 0 otherwise.
  double z(double x) const;

  void push(double x) {
    values_.push_back(x);
    if (values_.size() > kCapacity) values_.pop_front();
  }

  std::vector<double> values() const { return {values_.begin(), values_.end()}; }
  void assign(const std::vector<double>& values) { values_.assign(values.begin(), values.end()); }

 private:
  std::deque<double> values_;
};

struct BadStepGuards {
  double loss_z_limit = 0.0, norm_z_limit = 0.0;  // --skip-loss-z / --skip-norm-z (0 = off); not saved
  uint64_t skipped_nonfinite = 0, skipped_loss_z = 0, skipped_norm_z = 0;
  ZScoreWindow loss_window, norm_window;

  uint64_t skipped_total() const { return skipped_nonfinite + skipped_loss_z + skipped_norm_z; }

  // Returns why the step must be skipped ("" = apply it) and counts it; an accepted step's loss
  // and norm join the windows.
  std::string check(double loss, double grad_norm);

 private:
  static std::string format(double x);
};
