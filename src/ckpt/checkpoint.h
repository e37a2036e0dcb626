// checkpoint.h — what a checkpoint holds and how all ranks write and load one, so that runs survive
// crashes, full disks and preemption and resume bit for bit (format, field by field:
// docs/CHECKPOINTS.md; finding, verifying and pruning checkpoint directories: checkpoint_dirs.h).
//
// A checkpoint is the directory OUT/checkpoint_SSSSSSSS (S = the optimizer steps completed):
//   model.bin            llm.c model file (bf16 v5 / fp32 v3): exactly the parameters
//   state_rRRRRR.bin     rank R's training state: fp32 weights and AdamW moments of the parameters
//                        it owns (grad_buckets.h), step, seed, data position, bad-step guards
//   manifest.json        written last: format, step, world size, ZeRO stage, dtype, model,
//                        configuration, and every file's size and CRC-32C
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
#include "src/model/gpt2.h"
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

constexpr uint32_t kStateVersion = 2;
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
};
static_assert(std::is_trivially_copyable<StateHeader>::value, "StateHeader is written as raw bytes");
static_assert(sizeof(LoaderPosition) == 56, "docs/CHECKPOINTS.md documents a 56-byte LoaderPosition");
static_assert(sizeof(StateHeader) == 168, "docs/CHECKPOINTS.md documents a 168-byte state header");

inline std::string state_file_name(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "state_r%05d.bin", rank);
  return buf;
}

// Bytes of one checkpoint of a P-parameter model (model file + world_size state files of at most
// state_count parameters each + manifest).
inline uint64_t checkpoint_bytes(size_t num_parameters, size_t param_element_bytes, size_t state_count,
                                 size_t world_size) {
  return kHeaderBytes + num_parameters * param_element_bytes +
         world_size * (sizeof(StateHeader) + 3 * state_count * 4 + 2 * ZScoreWindow::kCapacity * 8) + 64 * 1024;
}

// ---------------------------------------------------------------------------------------
// Writing and reading.

struct CheckpointWriteInfo {
  int rank = 0, world_size = 1, zero_stage = 0;
  nlohmann::json config;  // the run's flags, recorded in the manifest
};

namespace checkpoint_detail {

constexpr size_t kChunkElements = size_t(1) << 22;  // device ↔ host transfers of 16 MiB of fp32

inline void write_device_floats(AtomicFileWriter& out, const float* device, size_t count) {
  std::vector<float> host(std::min(count, kChunkElements));
  for (size_t done = 0; done < count;) {
    const size_t n = std::min(host.size(), count - done);
    cuda_check(cudaMemcpy(host.data(), device + done, n * sizeof(float), cudaMemcpyDeviceToHost),
               "copying training state to the host");
    out.write(host.data(), n * sizeof(float));
    done += n;
  }
}

inline void read_exact(std::FILE* f, void* dst, size_t bytes, const std::string& path, const char* what) {
  if (std::fread(dst, 1, bytes, f) != bytes) throw std::runtime_error(path + ": file ended inside " + what);
}

template <typename U>
void read_to_device(std::FILE* f, U* device, size_t count, const std::string& path, const char* what) {
  std::vector<U> host(std::min(count, kChunkElements));
  for (size_t done = 0; done < count;) {
    const size_t n = std::min(host.size(), count - done);
    read_exact(f, host.data(), n * sizeof(U), path, what);
    cuda_check(cudaMemcpy(device + done, host.data(), n * sizeof(U), cudaMemcpyHostToDevice),
               (std::string("uploading ") + what).c_str());
    done += n;
  }
}

inline void write_window(AtomicFileWriter& out, const ZScoreWindow& window) {
  const std::vector<double> values = window.values();
  out.write(values.data(), values.size() * sizeof(double));
}

// Every rank learns whether all ranks succeeded (a collective: every rank must call it). Without
// a communicator: `ok` itself.
inline bool all_ranks_ok(Communicator* comm, bool ok) {
  if (comm == nullptr || comm->world_size() == 1) return ok;
  return comm->sum(ok ? 0.0 : 1.0) == 0.0;
}

// Rank `from`'s value on every rank (a collective; exact for integers below 2^53).
inline uint64_t from_rank(Communicator* comm, int from, uint64_t value) {
  if (comm == nullptr || comm->world_size() == 1) return value;
  return static_cast<uint64_t>(comm->sum(comm->rank() == from ? static_cast<double>(value) : 0.0));
}

}  // namespace checkpoint_detail

// Writes OUT/checkpoint_<state.step>, collectively over the ranks of `comm` (nullptr: a single
// process; every rank must call it): rank 0 (re)creates the directory — a directory of the same
// name (left by a run that died, or an abandoned later timeline) loses its manifest before
// anything in it is replaced — and writes model.bin; every rank writes its own state file (its
// optimizer shard and data position); the sizes and CRC-32Cs of the state files reach rank 0
// through the communicator and rank 0 writes the manifest last. OUT must be one shared directory
// for all ranks. If any rank fails, rank 0 removes the partial directory and every rank throws
// (the failing rank with its own error); other checkpoints are never touched. Returns the
// directory.
template <typename Elem>
std::string write_checkpoint(const std::string& out_dir, const GPT2<Elem>& model, const TrainingState& state,
                             const CheckpointWriteInfo& info, Communicator* comm = nullptr) {
  const std::string dir = out_dir + "/" + checkpoint_dir_name(state.step);
  const bool lead = info.rank == 0;
  // The state read below is final once the step's update (queued, not waited for) is done.
  cuda_check(cudaStreamSynchronize(model.stream()), "finishing the step before its checkpoint");
  std::string error;  // this rank's failure
  auto attempt = [&](auto&& part) {
    if (!error.empty()) return;
    try {
      part();
    } catch (const std::exception& e) {
      error = e.what();
    }
  };
  // After a failure anywhere: the directory goes, every rank throws.
  auto agree = [&]() {
    if (checkpoint_detail::all_ranks_ok(comm, error.empty())) return;
    if (lead) remove_checkpoint_dir(dir);
    throw std::runtime_error("writing checkpoint " + dir + ": " + (error.empty() ? "another rank failed" : error));
  };

  if (lead) attempt([&] {
    struct stat st {};
    if (::stat(dir.c_str(), &st) == 0) {
      const std::string manifest = dir + "/" + kManifestName;
      if (::unlink(manifest.c_str()) == 0) fsync_directory(dir);
    } else {
      if (::mkdir(dir.c_str(), 0755) != 0) throw file_error(dir, "cannot create", errno);
      fsync_directory(out_dir);
    }
  });
  agree();

  uint64_t model_size = 0, state_size = 0;
  uint32_t model_crc = 0, state_crc = 0;
  const size_t P = model.num_parameters();
  const GradientSync<Elem>& owned = model.gradient_sync();
  if (lead) attempt([&] {
    const std::string model_path = dir + "/" + kModelFileName;
    model.save(model_path);
    if (!file_size_and_crc(model_path, &model_size, &model_crc))
      throw file_error(model_path, "cannot read back", errno);
  });
  attempt([&] {
    StateHeader h{};
    std::memcpy(h.magic, kStateMagic, sizeof h.magic);
    h.version = kStateVersion;
    h.header_bytes = sizeof(StateHeader);
    h.rank = static_cast<uint32_t>(info.rank);
    h.world_size = static_cast<uint32_t>(info.world_size);
    h.zero_stage = static_cast<uint32_t>(info.zero_stage);
    h.dtype = static_cast<uint32_t>(GPT2<Elem>::dtype);
    h.step = static_cast<uint64_t>(state.step);
    h.num_parameters = P;
    h.bucket_layers = static_cast<uint64_t>(owned.buckets().bucket_layers());
    h.state_count = owned.state_count();
    h.seed = state.seed;
    h.train_data = state.train_data;
    h.skipped_nonfinite = state.guards.skipped_nonfinite;
    h.skipped_loss_z = state.guards.skipped_loss_z;
    h.skipped_norm_z = state.guards.skipped_norm_z;
    h.loss_window_count = state.guards.loss_window.values().size();
    h.norm_window_count = state.guards.norm_window.values().size();

    AtomicFileWriter out(dir + "/" + state_file_name(info.rank));
    out.write(&h, sizeof h);
    // The optimizer buffers hold the owned parameters' state in state order; fp32 parameters (the
    // fp32 weights in fp32 mode) are in llm.c order on every rank: written segment by segment.
    if (model.master_device() != nullptr) {
      checkpoint_detail::write_device_floats(out, model.master_device(), h.state_count);
    } else {
      for (const OptimizerSegment& g : owned.segments())
        checkpoint_detail::write_device_floats(out, reinterpret_cast<const float*>(model.params_device()) + g.param,
                                               g.count);
    }
    checkpoint_detail::write_device_floats(out, model.adam_m_device(), h.state_count);
    checkpoint_detail::write_device_floats(out, model.adam_v_device(), h.state_count);
    checkpoint_detail::write_window(out, state.guards.loss_window);
    checkpoint_detail::write_window(out, state.guards.norm_window);
    out.commit();
    state_size = out.size();
    state_crc = out.crc32c();
  });
  agree();

  nlohmann::ordered_json files = nlohmann::ordered_json::array();
  files.push_back({{"name", kModelFileName}, {"bytes", model_size}, {"crc32c", crc_hex(model_crc)}});
  for (int r = 0; r < info.world_size; ++r) {
    const uint64_t bytes = checkpoint_detail::from_rank(comm, r, state_size);
    const uint32_t crc = static_cast<uint32_t>(checkpoint_detail::from_rank(comm, r, state_crc));
    files.push_back({{"name", state_file_name(r)}, {"bytes", bytes}, {"crc32c", crc_hex(crc)}});
  }
  if (lead) attempt([&] {
    const GPT2Config& mc = model.config();
    nlohmann::ordered_json manifest = {
        {"format", kManifestFormat},
        {"version", kManifestVersion},
        {"step", state.step},
        {"world_size", info.world_size},
        {"zero_stage", info.zero_stage},
        {"dtype", dtype_name(GPT2<Elem>::dtype)},
        {"num_parameters", P},
        {"model",
         {{"max_seq_len", mc.max_seq_len},
          {"vocab_size", mc.vocab_size},
          {"padded_vocab_size", mc.padded_vocab_size},
          {"num_layers", mc.num_layers},
          {"num_heads", mc.num_heads},
          {"channels", mc.channels}}},
        {"config", info.config},
        {"files", files},
    };
    const std::string text = manifest.dump(2) + "\n";
    AtomicFileWriter manifest_out(dir + "/" + kManifestName);
    manifest_out.write(text.data(), text.size());
    manifest_out.commit();
  });
  agree();
  return dir;
}

namespace checkpoint_detail {

// One state file of a checkpoint being loaded: its header, its open file, and which parameters its
// optimizer-state elements belong to (runs sorted by parameter).
struct StateSource {
  std::string path;
  std::FILE* file = nullptr;
  StateHeader header{};
  std::vector<OptimizerSegment> runs;
  StateSource() = default;
  StateSource(const StateSource&) = delete;
  StateSource& operator=(const StateSource&) = delete;
  ~StateSource() {
    if (file != nullptr) std::fclose(file);
  }
};

// Reads and checks state file `rank` of a checkpoint written by `world_size` ranks.
template <typename Elem>
void open_state_source(const Checkpoint& c, int rank, int world_size, const GPT2<Elem>& model, StateSource* src) {
  src->path = c.path + "/" + state_file_name(rank);
  const std::string& path = src->path;
  src->file = std::fopen(path.c_str(), "rb");
  if (src->file == nullptr) throw file_error(path, "cannot open", errno);
  StateHeader& h = src->header;
  read_exact(src->file, &h, sizeof h, path, "the header");
  auto mismatch = [&](const std::string& what) { return std::runtime_error(path + ": " + what); };
  if (std::memcmp(h.magic, kStateMagic, sizeof h.magic) != 0) throw mismatch("not a train_gpt state file");
  if (h.version != kStateVersion || h.header_bytes != sizeof(StateHeader))
    throw mismatch("state format version " + std::to_string(h.version) + ", this build reads version " +
                   std::to_string(kStateVersion));
  if (h.rank != static_cast<uint32_t>(rank) || h.world_size != static_cast<uint32_t>(world_size))
    throw mismatch("belongs to rank " + std::to_string(h.rank) + " of " + std::to_string(h.world_size) +
                   ", the manifest lists it as rank " + std::to_string(rank) + " of " + std::to_string(world_size));
  if (h.dtype != static_cast<uint32_t>(GPT2<Elem>::dtype))
    throw mismatch(std::string("written by a --dtype ") + dtype_name(static_cast<DType>(h.dtype)) +
                   " run, this run is " + dtype_name(GPT2<Elem>::dtype));
  if (h.num_parameters != model.num_parameters())
    throw mismatch("holds a model of " + std::to_string(h.num_parameters) + " parameters, this model has " +
                   std::to_string(model.num_parameters()));
  if (h.step != static_cast<uint64_t>(c.step))
    throw mismatch("is at step " + std::to_string(h.step) + ", the manifest says " + std::to_string(c.step));
  if (h.loss_window_count > ZScoreWindow::kCapacity || h.norm_window_count > ZScoreWindow::kCapacity)
    throw mismatch("guard windows hold more than " + std::to_string(ZScoreWindow::kCapacity) + " values");
  const GradientBuckets buckets = gradient_buckets(model.layout(), world_size, static_cast<int>(h.zero_stage),
                                                   static_cast<int>(h.bucket_layers));
  const int owner = effective_zero_stage(static_cast<int>(h.zero_stage), world_size) == 0 ? 0 : rank;
  if (h.state_count != buckets.state_count(owner))
    throw mismatch("holds " + std::to_string(h.state_count) + " optimizer-state elements, rank " +
                   std::to_string(rank) + "'s share is " + std::to_string(buckets.state_count(owner)));
  const uint64_t expected = sizeof h + 3 * h.state_count * sizeof(float) +
                            (h.loss_window_count + h.norm_window_count) * sizeof(double);
  struct stat st {};
  if (::fstat(::fileno(src->file), &st) != 0 || static_cast<uint64_t>(st.st_size) != expected)
    throw mismatch("is " + std::to_string(st.st_size) + " bytes, its header describes " + std::to_string(expected));
  src->runs = buckets.segments(owner);
  std::sort(src->runs.begin(), src->runs.end(),
            [](const OptimizerSegment& a, const OptimizerSegment& b) { return a.param < b.param; });
}

// Section `section` (0 weights, 1 adam_m, 2 adam_v) of parameters [param, param + count) from the
// sources that own them, into host memory.
inline void read_state_range(const std::vector<std::unique_ptr<StateSource>>& sources, int section, size_t param,
                             size_t count, float* out) {
  for (size_t done = 0; done < count;) {
    const size_t p = param + done;
    const StateSource* from = nullptr;
    const OptimizerSegment* run = nullptr;
    for (const auto& src : sources) {
      auto it = std::upper_bound(src->runs.begin(), src->runs.end(), p,
                                 [](size_t v, const OptimizerSegment& r) { return v < r.param; });
      if (it != src->runs.begin() && p < std::prev(it)->param + std::prev(it)->count) {
        from = src.get();
        run = &*std::prev(it);
        break;
      }
    }
    if (from == nullptr) throw std::runtime_error("checkpoint: no state file holds parameter " + std::to_string(p));
    const size_t n = std::min(count - done, run->param + run->count - p);
    const long offset = static_cast<long>(sizeof(StateHeader) +
                                          (section * from->header.state_count + run->state + (p - run->param)) * 4);
    if (std::fseek(from->file, offset, SEEK_SET) != 0) throw file_error(from->path, "cannot seek", errno);
    read_exact(from->file, out + done, n * sizeof(float), from->path, "the optimizer state");
    done += n;
  }
}

}  // namespace checkpoint_detail

// Loads a verified checkpoint into a model built with the checkpoint's architecture and dtype:
// parameters from model.bin, fp32 weights (master weights for bf16) and AdamW moments of the
// parameters this rank owns, and the rest into *state (guard limits are left as they are). The
// checkpoint may come from another number of ranks, ZeRO stage or bucket size (resharding): each
// owned segment's state is read from whichever state files hold it. The training state besides
// the optimizer (step, seed, data position, guards) is the same on every rank: rank 0's is used.
template <typename Elem>
void load_checkpoint(const Checkpoint& c, GPT2<Elem>& model, TrainingState* state) {
  model.load(c.path + "/" + kModelFileName);
  const int old_world = c.manifest.value("world_size", 1);
  const int old_zero = c.manifest.value("zero_stage", 0);
  // At stage 0 every rank holds all of the state: rank 0's file is enough.
  const int sources_needed = effective_zero_stage(old_zero, old_world) == 0 ? 1 : old_world;
  std::vector<std::unique_ptr<checkpoint_detail::StateSource>> sources;
  for (int r = 0; r < sources_needed; ++r) {
    sources.push_back(std::make_unique<checkpoint_detail::StateSource>());
    checkpoint_detail::open_state_source(c, r, old_world, model, sources.back().get());
  }
  for (const auto& src : sources)
    if (src->header.zero_stage != static_cast<uint32_t>(old_zero))
      throw std::runtime_error(src->path + ": ZeRO stage " + std::to_string(src->header.zero_stage) +
                               ", the manifest says " + std::to_string(old_zero));

  float* sections[3] = {model.master_device(), model.adam_m_device(), model.adam_v_device()};
  const char* names[3] = {"the fp32 weights", "the AdamW first moments", "the AdamW second moments"};
  std::vector<float> host;
  for (const OptimizerSegment& g : model.gradient_sync().segments()) {
    host.resize(g.count);
    for (int section = 0; section < 3; ++section) {
      checkpoint_detail::read_state_range(sources, section, g.param, g.count, host.data());
      // fp32 weights in fp32 mode are the parameters themselves, in llm.c order.
      float* dst = sections[section] != nullptr ? sections[section] + g.state
                                                : reinterpret_cast<float*>(model.params_device()) + g.param;
      cuda_check(cudaMemcpy(dst, host.data(), g.count * sizeof(float), cudaMemcpyHostToDevice),
                 (std::string("uploading ") + names[section]).c_str());
    }
  }

  const checkpoint_detail::StateSource& first = *sources.front();
  const StateHeader& h = first.header;
  if (std::fseek(first.file, static_cast<long>(sizeof h + 3 * h.state_count * sizeof(float)), SEEK_SET) != 0)
    throw file_error(first.path, "cannot seek", errno);
  std::vector<double> loss_values(h.loss_window_count), norm_values(h.norm_window_count);
  checkpoint_detail::read_exact(first.file, loss_values.data(), loss_values.size() * sizeof(double), first.path,
                                "the loss window");
  checkpoint_detail::read_exact(first.file, norm_values.data(), norm_values.size() * sizeof(double), first.path,
                                "the gradient-norm window");
  state->step = static_cast<long long>(h.step);
  state->seed = h.seed;
  state->train_data = h.train_data;
  state->guards.skipped_nonfinite = h.skipped_nonfinite;
  state->guards.skipped_loss_z = h.skipped_loss_z;
  state->guards.skipped_norm_z = h.skipped_norm_z;
  state->guards.loss_window.assign(loss_values);
  state->guards.norm_window.assign(norm_values);
}
