// checkpoint.h — what a checkpoint holds, so that runs survive crashes, full disks and preemption
// and resume bit for bit (format, field by field: docs/CHECKPOINTS.md; writing it:
// checkpoint_write.h; loading it: checkpoint_load.h; finding, verifying and pruning checkpoint
// directories: checkpoint_dirs.h).
//
// A checkpoint is the directory OUT/checkpoint_SSSSSSSS (S = the optimizer steps completed):
//   model.bin            llm.c model file (bf16 v5 / fp32 v3): exactly the parameters
//   state_rRRRRR.bin     rank R's training state: fp32 weights and AdamW moments of the parameters
//                        it owns (grad_buckets.h; with tensor parallelism, of its TP part:
//                        tensor_split.h), step, seed, data position, bad-step guards
//   manifest.json        written last: format, step, world size, tensor-parallel size, ZeRO stage,
//                        dtype, model, configuration, and every file's size and CRC-32C
// A directory without a valid manifest, or whose files differ from it in size or checksum, is
// not a checkpoint. Every file is written atomically: to NAME.tmp in the same directory,
// fsync, rename, fsync of the directory.
//
// Errors throw std::runtime_error with one line naming the file and what went wrong.
#pragma once
#include "kernels/common.cuh"
#include "src/ckpt/checkpoint_dirs.h"
#include "src/data/dataloader.h"
#include "src/base/durable_file.h"
#include "src/model/transformer.h"
#include "src/model/model_file.h"
#include "src/model/step_guards.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "checkpoint files are little-endian");

// ---------------------------------------------------------------------------------------
// Training state: everything besides the parameters that a resumed run needs.

struct TrainingState {
  long long step = 0;  // optimizer steps completed
  uint64_t seed = 0;   // --seed of the run: stochastic rounding draws from (seed, step, tensor)
  LoaderPosition train_data;
  BadStepGuards guards;
};

// Version 3 added config_hash; version 2 files (their header ends before it, at 168 bytes) still load.
constexpr uint32_t kStateVersion = 3;
constexpr uint32_t kStateVersionWithoutConfigHash = 2;
constexpr char kStateMagic[8] = {'T', 'G', 'P', 'T', 'S', 'T', 'A', 'T'};

// Fixed-size header of a state file (docs/CHECKPOINTS.md lists every field with its offset).
struct StateHeader {
  char magic[8];
  uint32_t version;
  uint32_t header_bytes;  // sizeof(StateHeader): where the sections start
  uint32_t rank, world_size, zero_stage;
  uint32_t dtype;  // parameter storage: 0 = fp32, 1 = bf16
  uint64_t step;
  uint64_t num_parameters;               // P of the whole model
  uint64_t bucket_layers;                // the gradient buckets' layers: with R and the ZeRO stage, which
                                         // parameters the rank owns (GradientBuckets::segments)
  uint64_t state_count;                  // N: elements of each optimizer-state section
  uint64_t seed;
  LoaderPosition train_data;
  uint64_t skipped_nonfinite, skipped_loss_z, skipped_norm_z;
  uint64_t loss_window_count, norm_window_count;  // float64 values in the window sections
  uint64_t config_hash;  // configuration_hash of the manifest's "config": which run wrote the file
};
static_assert(std::is_trivially_copyable<StateHeader>::value, "StateHeader is written as raw bytes");
static_assert(sizeof(LoaderPosition) == 56, "docs/CHECKPOINTS.md documents a 56-byte LoaderPosition");
static_assert(sizeof(StateHeader) == 176, "docs/CHECKPOINTS.md documents a 176-byte state header");
constexpr size_t kStateHeaderBytesWithoutConfigHash = offsetof(StateHeader, config_hash);
static_assert(kStateHeaderBytesWithoutConfigHash == 168, "a version 2 state header is 168 bytes");

// FNV-1a (64-bit) of a configuration's JSON text (keys sorted, every value a string:
// config_json()), as a state file records it and a resume recomputes it from the manifest.
inline uint64_t configuration_hash(const nlohmann::json& config) {
  uint64_t h = 14695981039346656037ull;
  for (const char c : config.dump()) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h;
}

// Bytes of one checkpoint of a P-parameter model (model file + world_size state files of at most
// state_count parameters each + manifest).
inline uint64_t checkpoint_bytes(size_t num_parameters, size_t param_element_bytes, size_t state_count,
                                 size_t world_size) {
  return kHeaderBytes + num_parameters * param_element_bytes +
         world_size * (sizeof(StateHeader) + 3 * state_count * 4 + 2 * ZScoreWindow::kCapacity * 8) + 64 * 1024;
}

// Device ↔ host transfers of checkpoint state in chunks of 16 MiB of fp32.
constexpr size_t kCheckpointChunkElements = size_t(1) << 22;

struct CheckpointWriteInfo {
  int rank = 0, world_size = 1, zero_stage = 0, tensor_parallel = 1, pipeline_parallel = 1, expert_parallel = 1;
  std::vector<int> pipeline_chunks;  // layers per pipeline chunk, model order (empty: no pipeline)
  nlohmann::json config;  // the run's flags, recorded in the manifest
};
