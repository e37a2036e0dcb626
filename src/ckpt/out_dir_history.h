// out_dir_history.h — whose files an --out-dir holds and what a run that trains may do to them: it
// adds to the history it continues, or refuses; files of another or an abandoned history are moved
// aside (OUT/abandoned_<time>/) or, with --overwrite, deleted — never truncated or replaced in place.
//
// Before anything is loaded (every rank decides alike from the shared directory):
//   - --init-from the --out-dir's own model.bin: refused, with --overwrite too (an input);
//   - continuing a checkpoint in OUT (by inode: any spelling of OUT): the checkpoints after it (a
//     rewind, or damaged newer ones --resume auto passed over) and model.bin go aside with a copy of
//     metrics.jsonl, so --resume auto can never pick the abandoned branch; metrics.jsonl keeps its
//     records up to the checkpoint's step;
//   - a new history (a fresh run, or a checkpoint from elsewhere) into an OUT holding checkpoints,
//     metrics.jsonl or model.bin: refused naming them, unless --overwrite (deleted, truncated);
//     --resume auto that finds no checkpoint at all moves an earlier attempt's files aside instead.
// Rank 0 carries the plan out under the --out-dir lock, before its first write (src/run/out_dir.h).
#pragma once
#include "src/ckpt/checkpoint_dirs.h"
#include "src/config/config.h"

#include <optional>
#include <string>
#include <vector>

constexpr char kAbandonedPrefix[] = "abandoned_";
constexpr char kMetricsFileName[] = "metrics.jsonl";

// Whether the command trains, and so writes into --out-dir (--max-steps 0, --eval and --generate
// write nothing there).
bool writes_out_dir(const TrainConfig& cfg);

struct OutDirPlan {
  std::vector<std::string> set_aside;  // moved into OUT/abandoned_<time>/
  bool copy_metrics_aside = false;     // metrics.jsonl as it was goes there too (it is kept up to the step)
  std::vector<std::string> remove;     // --overwrite: what the new history replaces
  bool continue_metrics = false;       // metrics.jsonl is kept up to the step and appended to; else started anew
  std::string reason;                  // why files go aside, for the log
};

// The plan for a run that trains, continuing `resume_from` (none: a new history); throws one line
// naming what is in the way.
OutDirPlan plan_out_dir(const TrainConfig& cfg, const std::optional<Checkpoint>& resume_from);

// Carries the plan out in out_dir; returns the lines that say where things went.
std::vector<std::string> carry_out(const std::string& out_dir, const OutDirPlan& plan);
