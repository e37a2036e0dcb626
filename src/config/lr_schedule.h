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

const std::vector<std::string>& lr_schedule_names();

LrScheduleKind parse_lr_schedule(const std::string& name);

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
  double at(long long step) const;
};
