// out_dir.cpp — claiming --out-dir for a run: lock, files of other histories set aside, room, metrics.jsonl
#include "src/run/out_dir.h"

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

OpenOutDir open_out_dir(const TrainConfig& cfg, long long step, const OutDirPlan& plan, uint64_t checkpoint_bytes,
                        uint64_t model_file_bytes) {
  std::error_code ec;
  std::filesystem::create_directories(cfg.out_dir, ec);
  if (ec) throw std::runtime_error("--out-dir " + cfg.out_dir + ": cannot create the directory: " + ec.message());
  OpenOutDir out;
  with_context("--out-dir", [&] {
    out.lock = std::make_unique<OutDirLock>(cfg.out_dir);
    for (const std::string& line : carry_out(cfg.out_dir, plan)) std::printf("%s\n", line.c_str());
    if (!cfg.save) {
      std::printf("disk: --save 0: only %s is written\n", kMetricsFileName);
      return;
    }
    std::vector<long long> existing;
    for (const CheckpointDir& d : list_checkpoint_dirs(cfg.out_dir))
      if (d.step <= step) existing.push_back(d.step);
    const uint64_t at_once = checkpoints_at_once(step, cfg.max_steps, cfg.checkpoint_every, cfg.keep_checkpoints,
                                                 cfg.keep_every, existing);
    const uint64_t checkpoints = at_once > UINT64_MAX / checkpoint_bytes ? UINT64_MAX : at_once * checkpoint_bytes;
    const uint64_t needed = checkpoints > UINT64_MAX - model_file_bytes ? UINT64_MAX : checkpoints + model_file_bytes;
    const std::string what =
        std::to_string(at_once) + " checkpoint(s) of " + mib(checkpoint_bytes) + " at once (--checkpoint-every " +
        std::to_string(cfg.checkpoint_every) + ", --keep-checkpoints " + std::to_string(cfg.keep_checkpoints) +
        (cfg.keep_every > 0 ? ", --keep-every " + std::to_string(cfg.keep_every) : "") + ") and the final model file";
    std::printf("disk: %s need %s%s\n", what.c_str(), mib(needed).c_str(),
                cfg.keep_every > 0 && cfg.keep_checkpoints > 0
                    ? " (the checkpoints --keep-every keeps for good are counted up to --max-steps; a run continued "
                      "beyond it needs more)"
                    : "");
    std::fflush(stdout);
    check_output_directory(cfg.out_dir, needed, what);
  });
  const std::string metrics_path = cfg.out_dir + "/" + kMetricsFileName;
  if (plan.continue_metrics)
    for (const std::string& damaged : keep_metrics_through_step(metrics_path, step))
      std::fprintf(stderr, "warning: --resume: %s\n", damaged.c_str());
  out.metrics = std::make_unique<MetricsLog>(metrics_path, plan.continue_metrics);
  return out;
}
