// out_dir.h — rank 0's --out-dir as a run starts: created, locked for this run alone, other or
// abandoned histories' files set aside, checked for room (the checkpoints on disk at once and the
// final model file), metrics.jsonl opened.
#pragma once
#include "src/base/error_context.h"
#include "src/base/out_dir_lock.h"
#include "src/base/units.h"
#include "src/ckpt/checkpoint_dirs.h"
#include "src/ckpt/out_dir_history.h"
#include "src/config/config.h"
#include "src/run/metrics.h"

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

// Held for the run; members in this order so metrics.jsonl closes before the lock is released.
struct OpenOutDir {
  std::unique_ptr<OutDirLock> lock;
  std::unique_ptr<MetricsLog> metrics;
};

// `step`: the steps done (the checkpoint's on resume). Under the lock, the plan for the files of
// other or abandoned histories is carried out (src/ckpt/out_dir_history.h); then metrics.jsonl is
// started, or kept up to `step` and continued (a damaged line is reported).
OpenOutDir open_out_dir(const TrainConfig& cfg, long long step, const OutDirPlan& plan, uint64_t checkpoint_bytes,
                        uint64_t model_file_bytes);
