// resume.h — --resume: choosing the checkpoint a run continues from (rank 0 chooses and verifies
// it, every rank follows) and checking it against this run's ranks, ZeRO stage, dtype and flags.
#pragma once
#include "src/base/error_context.h"
#include "src/base/out_dir_lock.h"
#include "src/ckpt/checkpoint_dirs.h"
#include "src/ckpt/checkpoint_load.h"
#include "src/ckpt/out_dir_history.h"
#include "src/dist/comm.h"
#include "src/config/config.h"
#include "src/dist/grad_sync.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <exception>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

// --resume: the checkpoint to continue from (nothing: start fresh), checked against this run, and
// for a run that trains the plan for --out-dir's files (src/ckpt/out_dir_history.h; rank 0's). The
// checkpoint directory is on a filesystem every rank sees: rank 0 checks that no other run holds
// --out-dir, chooses the checkpoint and verifies every file's size and CRC-32C, the other ranks
// learn its choice (the step) through the communicator and read that checkpoint's manifest, so
// every rank resumes from the same one, or all start fresh, or all stop.
inline std::optional<Checkpoint> resolve_resume(TrainConfig& cfg, Communicator& comm, OutDirPlan* out_dir_plan) {
  const int world_size = comm.world_size(), zero = effective_zero_stage(cfg.zero, world_size / cfg.tp);
  const bool lead = comm.rank() == 0;
  std::string dir = cfg.resume;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  std::optional<Checkpoint> found;
  std::string error;  // rank 0's reason to stop
  bool fresh_past_incomplete = false;  // rank 0: only incomplete checkpoints, moved aside
  if (lead) {
    try {
      if (writes_out_dir(cfg)) with_context("--out-dir", [&] { OutDirLock::check_free(cfg.out_dir); });
      if (cfg.resume == "auto") {
        std::vector<std::string> skipped;
        found = find_latest_checkpoint(cfg.out_dir, &skipped);
        // Checkpoints but none usable: a fresh start would bury them (and retention delete them),
        // unless every one is incomplete (a crash during the first checkpoint): a run that trains
        // then moves them aside and starts afresh, so a requeued job goes on by itself.
        bool only_incomplete = true;
        for (const CheckpointDir& d : list_checkpoint_dirs(cfg.out_dir))
          only_incomplete = only_incomplete && is_incomplete_checkpoint(d.path);
        fresh_past_incomplete = !found && !skipped.empty() && only_incomplete && writes_out_dir(cfg);
        if (!found && !skipped.empty() && !(cfg.overwrite && writes_out_dir(cfg)) && !fresh_past_incomplete) {
          std::string all;
          for (const std::string& s : skipped) all += (all.empty() ? "" : "; ") + s;
          throw std::runtime_error("--resume auto: " + cfg.out_dir + " holds checkpoints but none is complete: " +
                                   all + " (nothing was changed; --overwrite starts afresh and deletes them)");
        }
        if (found || fresh_past_incomplete)
          for (const std::string& s : skipped) std::fprintf(stderr, "warning: --resume auto: skipping %s\n", s.c_str());
      } else if (!cfg.resume.empty()) {
        std::string problem;
        found = verify_checkpoint(dir, &problem);
        if (!found) throw std::runtime_error("--resume " + cfg.resume + ": not a complete checkpoint: " + problem);
      }
      if (writes_out_dir(cfg)) *out_dir_plan = plan_out_dir(cfg, found);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  // Rank 0's decision: the checkpoint's step, -1 for none, -2 for an error.
  const double lead_choice = !error.empty() ? -2.0 : found ? static_cast<double>(found->step) : -1.0;
  const double choice = world_size > 1 ? comm.sum(lead ? lead_choice : 0.0) : lead_choice;
  if (!error.empty()) throw std::runtime_error(error);
  if (choice == -2.0) throw FailedOnAnotherRank("rank 0 stopped the start-up (see its error)");
  if (choice == -1.0) {
    if (cfg.resume.empty()) return std::nullopt;
    if (cfg.generate) throw std::runtime_error("--resume auto: no complete checkpoint in " + cfg.out_dir + " to generate from");
    std::printf("--resume auto: no %scheckpoint in %s; starting from scratch\n", fresh_past_incomplete ? "complete " : "",
                cfg.out_dir.c_str());
    return std::nullopt;
  }
  if (!lead) {
    const std::string path =
        cfg.resume == "auto" ? cfg.out_dir + "/" + checkpoint_dir_name(static_cast<long long>(choice)) : dir;
    std::string problem;
    found = verify_checkpoint(path, &problem, false);
    if (!found) throw std::runtime_error("--resume " + path + ": rank 0 chose it, but here: " + problem);
  }
  // --eval and --generate read the checkpoint's model file alone, whatever ranks and settings wrote it.
  if (cfg.eval || cfg.generate) return found;
  const nlohmann::json& m = found->manifest;
  const int saved_world_size = m.value("world_size", -1), zero_stage = m.value("zero_stage", -1);
  const int saved_tp = m.value("tensor_parallel", 1), saved_pp = m.value("pipeline_parallel", 1);
  if ((saved_world_size != world_size || zero_stage != zero || saved_tp != cfg.tp || saved_pp != cfg.pp) && lead)
    std::printf("--resume %s: written by %d rank(s) at ZeRO stage %d, --tp %d, --pp %d; its optimizer state is "
                "resharded for %d rank(s) at ZeRO stage %d, --tp %d, --pp %d\n",
                found->path.c_str(), saved_world_size, zero_stage, saved_tp, saved_pp, world_size, zero, cfg.tp, cfg.pp);
  const std::string dtype = m.value("dtype", "");
  if (dtype != cfg.dtype)
    throw std::runtime_error("--resume " + found->path + ": the checkpoint holds " + dtype +
                             " training state; run with --dtype " + dtype);
  // One seed per history: the checkpoint's goes on everywhere (stochastic rounding, the data
  // order, samples, the manifests this run writes); another --seed is not used, and said so.
  const long long seed = static_cast<long long>(with_context("--resume", [&] { return read_checkpoint_seed(*found); }));
  if (seed != cfg.seed) {
    if (lead && cfg.was_set("seed"))
      std::fprintf(stderr, "warning: --seed %lld ignored: resuming uses the checkpoint's seed %lld\n", cfg.seed, seed);
    cfg.seed = seed;
  }
  // The weights are the checkpoint's: --init-from and --model are not used; the run records the
  // history's (where its model came from), as the checkpoint does.
  const nlohmann::json& history = m.value("config", nlohmann::json::object());
  for (const char* flag : {"init-from", "model"}) {
    if (lead && cfg.was_set(flag))
      std::fprintf(stderr, "warning: --%s ignored: --resume takes the model and its weights from the checkpoint\n",
                   flag);
    const std::string then_value = history.is_object() && history.contains(flag) && history[flag].is_string()
                                       ? history[flag].get<std::string>() : "";
    (std::string(flag) == "model" ? cfg.model : cfg.init_from) = then_value;
  }
  // Other flags may change on resume (e.g. a longer --max-steps); each change to what is trained
  // is reported (flags about files and checkpointing are not).
  const std::set<std::string> unreported = {"config", "resume", "out-dir", "checkpoint-every", "keep-checkpoints",
                                            "keep-every", "save-dtype", "overwrite", "seed", "init-from", "model"};
  const nlohmann::json now = config_json(cfg), then = m.value("config", nlohmann::json::object());
  for (const auto& item : now.items()) {
    if (!lead) break;  // reported once
    if (unreported.count(item.key()) != 0 || !then.contains(item.key()) || !then[item.key()].is_string()) continue;
    const std::string before = then[item.key()].get<std::string>(), after = item.value().get<std::string>();
    if (before != after)
      std::fprintf(stderr, "warning: --resume: --%s is %s%s, the checkpointed run had %s\n", item.key().c_str(),
                   after.c_str(), cfg.was_set(item.key()) ? "" : " (its default: not given)", before.c_str());
  }
  return found;
}

// A checkpoint resumes on any number of ranks (its optimizer state is resharded) if each
// micro-step still reads the same tokens: data-parallel ranks × --batch-size × --seq-len as
// `written` (its data position's global micro-batch).
inline void check_resumed_global_batch(uint64_t written, int data_ranks, int batch_size, int seq_len) {
  const uint64_t ranks = static_cast<uint64_t>(data_ranks);
  const uint64_t row = static_cast<uint64_t>(seq_len), now = ranks * batch_size * row;
  if (written == now) return;
  throw std::runtime_error(
      "written with a global micro-batch of " + std::to_string(written) +
      " tokens (data-parallel ranks x --batch-size x --seq-len), this run's is " + std::to_string(now) + ": " +
      (written % (ranks * row) == 0 ? "with " + std::to_string(ranks) + " data-parallel rank(s) use --batch-size " +
                                          std::to_string(written / (ranks * row))
                                    : "no --batch-size gives it with " + std::to_string(ranks) + " data-parallel rank(s)"));
}
