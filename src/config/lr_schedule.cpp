// lr_schedule.cpp — the learning rate of each step
#include "src/config/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

const std::vector<std::string>& lr_schedule_names() {
  static const std::vector<std::string> names = {"cosine", "linear", "constant", "wsd"};
  return names;
}

LrScheduleKind parse_lr_schedule(const std::string& name) {
  if (name == "cosine") return LrScheduleKind::cosine;
  if (name == "linear") return LrScheduleKind::linear;
  if (name == "constant") return LrScheduleKind::constant;
  if (name == "wsd") return LrScheduleKind::wsd;
  throw std::invalid_argument("unknown learning-rate schedule '" + name + "' (expected cosine, linear, constant or wsd)");
}

double LrSchedule::at(long long step) const {
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
