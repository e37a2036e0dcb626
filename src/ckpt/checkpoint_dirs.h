// checkpoint_dirs.h — the checkpoint directories of an --out-dir: their names, finding and
// verifying them (manifest, sizes, CRC-32Cs) to choose the one a run resumes from, removing them
// whole, retention, and the up-front check that --out-dir can take the checkpoints a run keeps at
// once. What is inside a
// checkpoint, and writing and loading one, is checkpoint.h's (format: docs/CHECKPOINTS.md).
#pragma once
#include "src/base/durable_file.h"
#include "src/base/units.h"

#include <dirent.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

constexpr char kManifestFormat[] = "train_gpt checkpoint";
constexpr int kManifestVersion = 1;
constexpr char kManifestName[] = "manifest.json";
constexpr char kModelFileName[] = "model.bin";
constexpr char kCheckpointPrefix[] = "checkpoint_";

std::string checkpoint_dir_name(long long step);

// "state_r00003.bin": rank R's training state in a checkpoint directory.
std::string state_file_name(int rank);

// Whether NAME (a directory entry, no slash) is a checkpoint directory's name: checkpoint_<digits>.
bool is_checkpoint_dir_name(const std::string& name);

struct CheckpointDir {
  long long step;
  std::string path;
};

// Every OUT/checkpoint_<digits> directory, complete or not, newest (highest step) first.
std::vector<CheckpointDir> list_checkpoint_dirs(const std::string& out_dir);

struct Checkpoint {
  std::string path;  // the checkpoint directory
  long long step = 0;
  nlohmann::json manifest;
};

// Reads DIR's manifest and checks every file it lists against its size and CRC-32C (with
// check_files false: only that the manifest is valid, for ranks other than the one that verified
// the files). Returns the checkpoint, or nothing with *problem saying why DIR is not a complete
// checkpoint.
std::optional<Checkpoint> verify_checkpoint(const std::string& dir, std::string* problem,
                                                   bool check_files = true);

// Whether DIR is a checkpoint whose writing never finished: it has no manifest (written last), as
// when a run crashed during the checkpoint. A directory with a manifest that does not verify is
// damaged, not incomplete.
bool is_incomplete_checkpoint(const std::string& dir);

// --resume auto: the newest complete checkpoint in out_dir. Every newer directory that is not a
// complete checkpoint is reported through `skipped` ("DIR: why") and passed over.
std::optional<Checkpoint> find_latest_checkpoint(const std::string& out_dir, std::vector<std::string>* skipped);

// Removes a checkpoint directory: the manifest first, so a removal cut short leaves an
// incomplete directory rather than a "complete" one with missing files. Throws naming the file
// that could not be deleted (one that cannot lose its manifest loses nothing).
void remove_checkpoint_dir(const std::string& dir);

// Deletes the checkpoints at or before `current_step` that are neither among the newest
// keep_last (0 = keep all) nor at a multiple of keep_every (0 = none kept for good). Later
// directories (an abandoned timeline a resumed run will overwrite) are left alone. Returns the
// deleted directories; one that could not be deleted is reported through `failed` ("FILE: why";
// without it, thrown).
std::vector<std::string> prune_checkpoints(const std::string& out_dir, long long current_step,
                                                  long long keep_last, long long keep_every,
                                                  std::vector<std::string>* failed = nullptr);

// How many more checkpoints than there are at its start a run has on disk at once, at most. It
// writes one after every `every`-th step in (start, max_steps) (every 0: none) and one after
// max_steps; after each is complete, prune_checkpoints deletes those beyond the newest keep_last
// (0: none deleted) that are not at a multiple of keep_every. `existing`: the steps of the
// checkpoints at or before `start` already there, newest first (retention counts and deletes them
// like the run's own). The most are on disk while the last one is written: the one being written
// and what the retention after the one before left (more on disk at once only grows from there).
uint64_t checkpoints_at_once(long long start, long long max_steps, long long every, long long keep_last,
                                    long long keep_every, const std::vector<long long>& existing);

// Before training: the output directory takes a file (created, synced, removed) and its file
// system has room for `bytes_needed`, which is what `needed_for` describes.
void check_output_directory(const std::string& out_dir, uint64_t bytes_needed, const std::string& needed_for);
