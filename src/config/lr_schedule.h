// lr_schedule.h — the learning rate of each optimizer step.
//
// Steps are 1-based: step s is the s-th optimizer update of a run of N = max_steps steps.
// With peak rate η, warmup W steps and final rate η_min = final_lr_frac·η:
//
//   warmup (s ≤ W):   lr(s) = η · s / W                      (step 1 already moves: η/W)
//   afterwards, with progress p = (s − W) / (N − W) ∈ (0, 1]:
//     cosine          lr(s) = η_min + (η − η_min) · ½ · (1 + cos(π·p))
//     linear          lr(s) = η_min + (η − η_min) · (1 − p)
//     constant        lr(s) = η
//     wsd             warmup, then stable at η, then linear decay to η_min over the last
//                     20% of the steps: with D = ⌊N/5⌋ and S = max(W, N − D), lr(s) = η for
//                     s ≤ S, and lr(s) = η − (η − η_min)·(s − S)/(N − S) for s > S.
//
// Every schedule is continuous at s = W (lr = η) and reaches η_min exactly at the last step
// (except constant, and wsd runs shorter than 5 steps, which have no decay phase). With
// W ≥ N the whole run is warmup.
#pragma once
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

enum class LrScheduleKind { cosine, linear, constant, wsd };

inline const std::vector<std::string>& lr_schedule_names() {
  static const std::vector<std::string> names = {"cosine", "linear", "constant", "wsd"};
  return names;
}

inline LrScheduleKind parse_lr_schedule(const std::string& name) {
  if (name == "cosine") return LrScheduleKind::cosine;
  if (name == "linear") return LrScheduleKind::linear;
  if (name == "constant") return LrScheduleKind::constant;
  if (name == "wsd") return LrScheduleKind::wsd;
  throw std::invalid_argument("unknown learning-rate schedule '" + name + "' (expected cosine, linear, constant or wsd)");
}

// Fraction of the run spent in wsd's final decay.
constexpr double kWsdDecayFraction = 0.2;
constexpr double kPi = 3.14159265358979323846;

struct LrSchedule {
  LrScheduleKind kind = LrScheduleKind::cosine;
  double peak_lr = 6e-4;
  long long warmup_steps = 0;
  long long total_steps = 1;
  double final_lr_frac = 0.0;

  // Learning rate for the 1-based step s (1 ≤ s ≤ total_steps).
  double at(long long step) const {
    if (step < 1 || step > total_steps)
      throw std::out_of_range("learning-rate step " + std::to_string(step) + " outside 1.." +
                              std::to_string(total_steps));
    if (step <= warmup_steps) return peak_lr * static_cast<double>(step) / static_cast<double>(warmup_steps);
    const double final_lr = final_lr_frac * peak_lr;
    const double progress = static_cast<double>(step - warmup_steps) / static_cast<double>(total_steps - warmup_steps);
    switch (kind) {
      case LrScheduleKind::cosine:
        return final_lr + (peak_lr - final_lr) * 0.5 * (1.0 + std::cos(kPi * progress));
      case LrScheduleKind::linear:
        return final_lr + (peak_lr - final_lr) * (1.0 - progress);
      case LrScheduleKind::constant:
        return peak_lr;
      case LrScheduleKind::wsd: {
        const long long decay_steps = static_cast<long long>(std::floor(kWsdDecayFraction * static_cast<double>(total_steps)));
        const long long decay_start = std::max(warmup_steps, total_steps - decay_steps);
        if (step <= decay_start) return peak_lr;
        return peak_lr - (peak_lr - final_lr) * static_cast<double>(step - decay_start) /
                             static_cast<double>(total_steps - decay_start);
      }
    }
    return peak_lr;
  }
};
