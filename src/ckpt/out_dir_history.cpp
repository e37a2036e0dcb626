// out_dir_history.cpp — the plan for --out-dir's files when a run starts, and carrying it out
#include "src/ckpt/out_dir_history.h"

#include "src/base/durable_file.h"
#include "src/base/same_file.h"
#include "src/ckpt/checkpoint_dirs.h"
#include "src/config/config.h"

#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

namespace {

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

std::string base_name(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// A new OUT/abandoned_<UTC time>[-N] directory.
std::string make_abandoned_dir(const std::string& out_dir) {
  char stamp[32];
  const std::time_t now = std::time(nullptr);
  std::tm utc {};
  ::gmtime_r(&now, &utc);
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &utc);
  for (int n = 1;; ++n) {
    const std::string dir =
        out_dir + "/" + kAbandonedPrefix + stamp + (n == 1 ? std::string() : "-" + std::to_string(n));
    if (::mkdir(dir.c_str(), 0755) == 0) return dir;
    if (errno != EEXIST) throw file_error(dir, "cannot create", errno);
  }
}

// `from` copied whole to `to`, durably.
void copy_file(const std::string& from, const std::string& to) {
  std::ifstream in(from, std::ios::binary);
  if (!in) throw file_error(from, "cannot open", errno);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw file_error(from, "cannot read", errno);
  AtomicFileWriter out(to);
  out.write(bytes.data(), bytes.size());
  out.commit();
}

// Whether DIR is a checkpoint directory: one holding a checkpoint manifest, or named
// checkpoint_<digits> holding what a checkpoint writes first (one cut short before its manifest).
bool is_checkpoint(const std::filesystem::path& dir) {
  std::ifstream manifest(dir / kManifestName);
  if (manifest) {
    const nlohmann::json m = nlohmann::json::parse(manifest, nullptr, false);
    if (m.is_object() && m.value("format", "") == kManifestFormat) return true;
  }
  return is_checkpoint_dir_name(dir.filename().string()) &&
         (exists((dir / kModelFileName).string()) || exists((dir / state_file_name(0)).string()));
}

// The checkpoint directory that `dir` is or lies inside (resolved: symlinks, "..", a relative
// path), or "" for none.
std::string enclosing_checkpoint(const std::string& dir) {
  std::error_code ec;
  std::filesystem::path p = std::filesystem::weakly_canonical(dir, ec);
  if (ec) return "";
  for (;; p = p.parent_path()) {
    if (is_checkpoint(p)) return p.string();
    if (p == p.root_path() || p.empty()) return "";
  }
}

}  // namespace

bool writes_out_dir(const TrainConfig& cfg) { return cfg.max_steps > 0 && !cfg.eval && !cfg.generate; }

OutDirPlan plan_out_dir(const TrainConfig& cfg, const std::optional<Checkpoint>& resume_from) {
  const std::string& out = cfg.out_dir;
  const std::string model_path = out + "/" + kModelFileName, metrics_path = out + "/" + kMetricsFileName;
  if (!resume_from && !cfg.init_from.empty() && same_file(cfg.init_from, model_path))
    throw std::runtime_error("--init-from " + cfg.init_from +
                             " is --out-dir's model.bin, which this run writes at its end: copy it elsewhere or "
                             "choose another --out-dir");
  const std::string checkpoint = enclosing_checkpoint(out);
  if (!checkpoint.empty())
    throw std::runtime_error("--out-dir " + out + (same_file(checkpoint, out) ? " is" : " is inside") +
                             " the checkpoint directory " + checkpoint +
                             ", which a run never writes into: choose another --out-dir (to continue it: "
                             "--resume " + checkpoint + " --out-dir " + parent_directory(checkpoint) + ")");
  OutDirPlan plan;
  const std::vector<CheckpointDir> dirs = list_checkpoint_dirs(out);
  const bool has_metrics = exists(metrics_path), has_model = exists(model_path);

  if (resume_from && same_file(parent_directory(resume_from->path), out)) {
    // This --out-dir's history goes on from the checkpoint; whatever came after it is abandoned.
    plan.continue_metrics = true;
    for (const CheckpointDir& d : dirs)
      if (d.step > resume_from->step) plan.set_aside.push_back(d.path);
    if (!plan.set_aside.empty()) {
      if (has_model) plan.set_aside.push_back(model_path);
      plan.copy_metrics_aside = has_metrics;
      plan.reason = "--resume " + resume_from->path + ": the run goes on from step " +
                    std::to_string(resume_from->step) + ", so what came after it";
    }
    return plan;
  }

  // A new history: a fresh run, or a checkpoint from another directory.
  if (dirs.empty() && !has_metrics && !has_model) return plan;
  if (cfg.overwrite) {
    for (const CheckpointDir& d : dirs) {
      if (resume_from && same_file(d.path, resume_from->path))
        throw std::runtime_error("--overwrite would delete --resume's checkpoint " + resume_from->path + " (it is " +
                                 d.path + "): name it as " + d.path + " to continue --out-dir's run, or choose "
                                 "another --out-dir");
      plan.remove.push_back(d.path);
    }
    if (has_model) plan.remove.push_back(model_path);
    return plan;  // metrics.jsonl is started anew
  }
  const bool all_incomplete =
      std::all_of(dirs.begin(), dirs.end(), [](const CheckpointDir& d) { return is_incomplete_checkpoint(d.path); });
  if (cfg.resume == "auto" && all_incomplete) {  // not one complete checkpoint: an earlier attempt stopped before
    for (const CheckpointDir& d : dirs) plan.set_aside.push_back(d.path);
    if (has_metrics) plan.set_aside.push_back(metrics_path);
    if (has_model) plan.set_aside.push_back(model_path);
    const std::string what = (dirs.empty() ? "" : "incomplete checkpoint(s)") +
                             std::string(!dirs.empty() && (has_metrics || has_model) ? " and " : "") +
                             (has_metrics && has_model ? "metrics.jsonl and model.bin"
                              : has_metrics            ? "metrics.jsonl"
                              : has_model              ? "model.bin"
                                                       : "");
    plan.reason = "--resume auto: " + out + " holds no " + (dirs.empty() ? "" : "complete ") +
                  "checkpoint, so the run starts afresh and the earlier " + what;
    return plan;
  }
  if (!dirs.empty())
    throw std::runtime_error("--out-dir " + out + " holds checkpoints (newest: " + dirs.front().path +
                             ") of another run: continue it with --resume auto, choose another --out-dir, or pass "
                             "--overwrite to delete them");
  const std::string files = has_metrics && has_model ? "metrics.jsonl and model.bin"
                            : has_metrics            ? "metrics.jsonl"
                                                     : "model.bin";
  throw std::runtime_error("--out-dir " + out + " holds " + files +
                           " of another run: choose another --out-dir, or pass --overwrite to replace " +
                           (has_metrics && has_model ? "them" : "it"));
}

std::vector<std::string> carry_out(const std::string& out_dir, const OutDirPlan& plan) {
  std::vector<std::string> lines;
  for (const std::string& path : plan.remove) {
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) remove_checkpoint_dir(path);
    else if (::unlink(path.c_str()) != 0) throw file_error(path, "cannot delete", errno);
    lines.push_back("--overwrite: deleted " + path);
  }
  if (!plan.remove.empty()) fsync_directory(out_dir);
  if (plan.set_aside.empty()) return lines;
  const std::string aside = make_abandoned_dir(out_dir);
  if (plan.copy_metrics_aside) copy_file(out_dir + "/" + kMetricsFileName, aside + "/" + kMetricsFileName);
  std::string moved;
  for (const std::string& path : plan.set_aside) {  // checkpoints newest first: a move cut short leaves a prefix
    const std::string to = aside + "/" + base_name(path);
    if (std::rename(path.c_str(), to.c_str()) != 0) throw file_error(path, "cannot move it to " + to, errno);
    moved += (moved.empty() ? "" : ", ") + base_name(path);
  }
  fsync_directory(aside);
  fsync_directory(out_dir);
  lines.push_back(plan.reason + " (" + moved + ") moved to " + aside + "/" +
                  (plan.copy_metrics_aside ? " with a copy of metrics.jsonl as it was" : ""));
  return lines;
}
