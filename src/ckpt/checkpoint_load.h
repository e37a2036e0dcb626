// checkpoint_load.h — loading a verified checkpoint on any number of ranks: each rank reads the
// optimizer state of the parameters it owns from whichever state files hold them (resharding),
// across data-parallel sizes, ZeRO stages, tensor- and pipeline-parallel sizes alike: every state
// file's elements are located by their parameter's index in the whole model's llm.c order.
#pragma once
#include "kernels/common.cuh"
#include "src/base/durable_file.h"
#include "src/base/error_context.h"
#include "src/ckpt/checkpoint.h"
#include "src/ckpt/checkpoint_dirs.h"
#include "src/dist/comm.h"
#include "src/model/transformer.h"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace checkpoint_detail {

inline void read_exact(std::FILE* f, void* dst, size_t bytes, const std::string& path, const char* what) {
  if (std::fread(dst, 1, bytes, f) != bytes) throw std::runtime_error(path + ": file ended inside " + what);
}

// One state file of a checkpoint being loaded: its header, its open file, and which parameters its
// optimizer-state elements belong to (runs sorted by parameter, indices in the whole model).
struct StateSource {
  std::string path;
  std::FILE* file = nullptr;
  StateHeader header{};
  std::vector<OptimizerSegment> runs;
  uint64_t fp8_count = 0;  // values of its FP8 section (0: none)
  StateSource() = default;
  StateSource(const StateSource&) = delete;
  StateSource& operator=(const StateSource&) = delete;
  ~StateSource() {
    if (file != nullptr) std::fclose(file);
  }
};

// Runs of consecutive parameters of `split`'s whole model for local parameters [param, param +
// count) at optimizer state `state` (a segment of `split`'s local layout), each ended where the
// split's map breaks the run.
template <typename F>
void for_whole_model_runs(const TensorSplit& split, size_t param, size_t count, size_t state, F&& f) {
  for (size_t done = 0; done < count;) {
    size_t left = 0;
    const size_t whole = split.to_global(param + done, &left);
    const size_t n = std::min(left, count - done);
    f(whole, state + done, n, done);
    done += n;
  }
}

// Reads and checks state file `rank` of a checkpoint written by `world_size` ranks in a grid of
// `pp` pipeline stages (chunks of `chunks` layers, model order) × tensor-parallel groups of `tp`
// (parallel_groups.h: rank r held TP part r mod tp of stage r / tp mod pp, and sharded its state
// over the data-parallel group of rank r mod (tp·pp), as its rank d = r / (tp·pp) there); with
// expert groups of `ep` (--ep), it held the experts of EP rank d mod ep and sharded its state over
// the expert-DP group, as its rank d / ep there.
template <typename Elem>
void open_state_source(const Checkpoint& c, int rank, int world_size, int tp, int pp, const std::vector<int>& chunks,
                       const Transformer<Elem>& model, StateSource* src, int ep = 1) {
  src->path = c.path + "/" + state_file_name(rank);
  const std::string& path = src->path;
  src->file = std::fopen(path.c_str(), "rb");
  if (src->file == nullptr) throw file_error(path, "cannot open", errno);
  StateHeader& h = src->header;
  read_exact(src->file, &h, kStateHeaderBytesWithoutConfigHash, path, "the header");
  auto mismatch = [&](const std::string& what) { return std::runtime_error(path + ": " + what); };
  if (std::memcmp(h.magic, kStateMagic, sizeof h.magic) != 0) throw mismatch("not a train_gpt state file");
  const bool without_hash = h.version == kStateVersionWithoutConfigHash;
  if ((h.version != kStateVersion && !without_hash) ||
      h.header_bytes != (without_hash ? kStateHeaderBytesWithoutConfigHash : sizeof(StateHeader)))
    throw mismatch("state format version " + std::to_string(h.version) + " with a " + std::to_string(h.header_bytes) +
                   "-byte header, this build reads versions " + std::to_string(kStateVersionWithoutConfigHash) +
                   " and " + std::to_string(kStateVersion));
  if (!without_hash) read_exact(src->file, &h.config_hash, sizeof h.config_hash, path, "the header");
  if (h.rank != static_cast<uint32_t>(rank) || h.world_size != static_cast<uint32_t>(world_size))
    throw mismatch("belongs to rank " + std::to_string(h.rank) + " of " + std::to_string(h.world_size) +
                   ", the manifest lists it as rank " + std::to_string(rank) + " of " + std::to_string(world_size));
  if (h.dtype != static_cast<uint32_t>(Transformer<Elem>::dtype))
    throw mismatch(std::string("written by a --dtype ") + dtype_name(static_cast<DType>(h.dtype)) +
                   " run, this run is " + dtype_name(Transformer<Elem>::dtype));
  if (h.num_parameters != model.num_parameters())
    throw mismatch("holds a model of " + std::to_string(h.num_parameters) + " parameters, this model has " +
                   std::to_string(model.num_parameters()));
  if (h.step != static_cast<uint64_t>(c.step))
    throw mismatch("is at step " + std::to_string(h.step) + ", the manifest says " + std::to_string(c.step));
  if (h.loss_window_count > ZScoreWindow::kCapacity || h.norm_window_count > ZScoreWindow::kCapacity)
    throw mismatch("guard windows hold more than " + std::to_string(ZScoreWindow::kCapacity) + " values");
  const int d = rank / (tp * pp);
  const TensorSplit split(model.config(), tp, rank % tp, StagePart::of_rank(chunks, pp, rank / tp % pp), ep, d % ep);
  const int data_ranks = world_size / (tp * pp * ep);
  const GradientBuckets buckets = gradient_buckets(split.local(), data_ranks, static_cast<int>(h.zero_stage),
                                                   static_cast<int>(h.bucket_layers), tp, ep > 1);
  const int owner = effective_zero_stage(static_cast<int>(h.zero_stage), data_ranks) == 0 ? 0 : d / ep;
  if (h.state_count != buckets.state_count(owner))
    throw mismatch("holds " + std::to_string(h.state_count) + " optimizer-state elements, rank " +
                   std::to_string(rank) + "'s share is " + std::to_string(buckets.state_count(owner)));
  uint64_t expected = h.header_bytes + 3 * h.state_count * sizeof(float) +
                      (h.loss_window_count + h.norm_window_count) * sizeof(double);
  struct stat st {};
  if (::fstat(::fileno(src->file), &st) != 0) throw file_error(src->path, "cannot read the size of", errno);
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size > expected) {  // a run with --fp8 appended its FP8 section: a count, then that many floats
    if (std::fseek(src->file, static_cast<long>(expected), SEEK_SET) != 0) throw file_error(src->path, "cannot seek", errno);
    read_exact(src->file, &src->fp8_count, sizeof src->fp8_count, src->path, "the FP8 section");
    expected += sizeof src->fp8_count + src->fp8_count * sizeof(float);
  }
  if (size != expected)
    throw mismatch("is " + std::to_string(size) + " bytes, its header describes " + std::to_string(expected));
  for (const OptimizerSegment& s : buckets.segments(owner))
    for_whole_model_runs(split, s.param, s.count, s.state, [&](size_t whole, size_t state, size_t n, size_t) {
      src->runs.push_back(OptimizerSegment{s.tensor, s.bucket, s.at, whole, state, n});
    });
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
    const long offset = static_cast<long>(from->header.header_bytes +
                                          (section * from->header.state_count + run->state + (p - run->param)) * 4);
    if (std::fseek(from->file, offset, SEEK_SET) != 0) throw file_error(from->path, "cannot seek", errno);
    read_exact(from->file, out + done, n * sizeof(float), from->path, "the optimizer state");
    done += n;
  }
}

// "seed 1337, configuration 0123456789abcdef": which run a state file (or a manifest) is from; a
// version 2 file recorded no configuration hash.
inline std::string run_identity(const std::string& seed, const uint64_t* config_hash) {
  char hash[24] = "unrecorded";
  if (config_hash != nullptr) std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(*config_hash));
  return "seed " + seed + ", configuration " + hash;
}

// The state files of one checkpoint come from one run: each (version 3) was written with the
// manifest's configuration, and all agree on what every rank shares (seed, data position, guard
// counts). Files of two runs put together under a rebuilt manifest are refused, naming the file.
inline void check_same_run(const Checkpoint& c, const std::vector<std::unique_ptr<StateSource>>& sources) {
  const nlohmann::json config = c.manifest.value("config", nlohmann::json::object());
  const uint64_t manifest_hash = configuration_hash(config);
  const nlohmann::json seed = config.is_object() ? config.value("seed", nlohmann::json("?")) : nlohmann::json("?");
  const std::string manifest_identity =
      run_identity(seed.is_string() ? seed.get<std::string>() : seed.dump(), &manifest_hash);
  const StateSource& first = *sources.front();
  const auto identity = [](const StateSource& s) {
    const StateHeader& h = s.header;
    return run_identity(std::to_string(h.seed), h.version == kStateVersionWithoutConfigHash ? nullptr : &h.config_hash);
  };
  for (const auto& src : sources) {
    const StateHeader& h = src->header;
    if (h.version != kStateVersionWithoutConfigHash && h.config_hash != manifest_hash)
      throw std::runtime_error(src->path + ": from another run than the manifest's: " + identity(*src) +
                               "; the manifest's: " + manifest_identity);
    const StateHeader& f = first.header;
    const bool shared_state_equal =
        h.seed == f.seed && std::memcmp(&h.train_data, &f.train_data, sizeof h.train_data) == 0 &&
        h.skipped_nonfinite == f.skipped_nonfinite && h.skipped_loss_z == f.skipped_loss_z &&
        h.skipped_norm_z == f.skipped_norm_z && h.loss_window_count == f.loss_window_count &&
        h.norm_window_count == f.norm_window_count;
    if (!shared_state_equal)
      throw std::runtime_error(src->path + ": from another run than " + first.path + " (" + identity(*src) + "; " +
                               identity(first) + "): their seed, data position or guard counts differ");
  }
}

}  // namespace checkpoint_detail

// The seed of the run that wrote checkpoint `c`, as rank 0's state file records it (the state the
// run's stochastic rounding and data order came from; a manifest written by an older build may
// name a --seed given on resume that was never used).
inline uint64_t read_checkpoint_seed(const Checkpoint& c) {
  const std::string path = c.path + "/" + state_file_name(0);
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) throw file_error(path, "cannot open", errno);
  StateHeader h{};
  checkpoint_detail::read_exact(f.get(), &h, kStateHeaderBytesWithoutConfigHash, path, "the header");
  if (std::memcmp(h.magic, kStateMagic, sizeof h.magic) != 0) throw std::runtime_error(path + ": not a train_gpt state file");
  return h.seed;
}

namespace checkpoint_detail {
// --fp8's scaling state from `first` (rank 0's state file; its file position after the windows):
// the whole model's in global layer order (written at any --pp, or by an older build without a
// pipeline, where the rank's layers were the model's), of which this rank restores its stage's
// layers. With delayed scaling its scales are every TP and DP rank's (the amaxes are reduced over
// both); current scaling's are a record of the last casts (the next cast measures its own): any
// rank's file serves. A checkpoint without an FP8 section (a run without --fp8) leaves the fresh state of
// model.load().
template <typename Elem>
void load_fp8_state(const StateSource& first, Transformer<Elem>& model) {
  Fp8State* fp8 = model.fp8_state();
  if (fp8 == nullptr || first.fp8_count == 0) return;
  std::vector<float> values(first.fp8_count);
  if (std::fseek(first.file, sizeof(uint64_t), SEEK_CUR) != 0) throw file_error(first.path, "cannot seek", errno);
  read_exact(first.file, values.data(), values.size() * sizeof(float), first.path, "the FP8 section");
  with_context(first.path, [&] { fp8->restore_whole_model_state(values, model.stage(), model.config().num_layers); });
}
}  // namespace checkpoint_detail

// Loads a verified checkpoint into a model built with the checkpoint's architecture and dtype:
// parameters from model.bin, fp32 weights (master weights for bf16) and AdamW moments of the
// parameters this rank owns, and the rest into *state (guard limits are left as they are). The
// checkpoint may come from another number of ranks, ZeRO stage or bucket size (resharding): each
// owned segment's state is read from whichever state files hold it. The training state besides
// the optimizer (step, seed, data position, guards) is the same on every rank: rank 0's is used.
template <typename Elem>
void load_checkpoint(const Checkpoint& c, Transformer<Elem>& model, TrainingState* state) {
  model.load(c.path + "/" + kModelFileName);
  const int old_world = c.manifest.value("world_size", 1);
  const int old_zero = c.manifest.value("zero_stage", 0);
  const int old_tp = c.manifest.value("tensor_parallel", 1), old_pp = c.manifest.value("pipeline_parallel", 1);
  const int old_ep = c.manifest.value("expert_parallel", 1);
  if (old_tp < 1 || old_pp < 1 || old_ep < 1 || old_world % (static_cast<long long>(old_tp) * old_pp * old_ep) != 0)
    throw std::runtime_error(c.path + "/" + kManifestName + ": tensor_parallel " + std::to_string(old_tp) +
                             " x pipeline_parallel " + std::to_string(old_pp) + " x expert_parallel " +
                             std::to_string(old_ep) + " does not divide world_size " + std::to_string(old_world));
  const std::vector<int> chunks = c.manifest.value("pipeline_chunks", std::vector<int>{model.config().num_layers});
  long long chunk_sum = 0;
  for (int n : chunks) chunk_sum += n < 1 ? -1'000'000 : n;
  if (chunks.size() % old_pp != 0 || chunk_sum != model.config().num_layers)
    throw std::runtime_error(c.path + "/" + kManifestName + ": pipeline_chunks does not cut the model's " +
                             std::to_string(model.config().num_layers) + " layers into a multiple of " +
                             std::to_string(old_pp) + " chunks of at least one layer");
  // Every state file is opened and checked against the others (at stage 0, where every rank holds
  // all of the state, rank 0's is read: the first source that holds a parameter).
  std::vector<std::unique_ptr<checkpoint_detail::StateSource>> sources;
  for (int r = 0; r < old_world; ++r) {
    sources.push_back(std::make_unique<checkpoint_detail::StateSource>());
    checkpoint_detail::open_state_source(c, r, old_world, old_tp, old_pp, chunks, model, sources.back().get(), old_ep);
  }
  for (const auto& src : sources)
    if (src->header.zero_stage != static_cast<uint32_t>(old_zero))
      throw std::runtime_error(src->path + ": ZeRO stage " + std::to_string(src->header.zero_stage) +
                               ", the manifest says " + std::to_string(old_zero));
  checkpoint_detail::check_same_run(c, sources);

  float* sections[3] = {model.master_device(), model.adam_m_device(), model.adam_v_device()};
  const char* names[3] = {"the fp32 weights", "the AdamW first moments", "the AdamW second moments"};
  std::vector<float> host;
  for (const OptimizerSegment& g : model.gradient_sync().segments()) {
    host.resize(g.count);
    for (int section = 0; section < 3; ++section) {
      checkpoint_detail::for_whole_model_runs(model.tensor_split(), g.param, g.count, 0,
                                              [&](size_t whole, size_t, size_t n, size_t done) {
                                                checkpoint_detail::read_state_range(sources, section, whole, n,
                                                                                    host.data() + done);
                                              });
      // fp32 weights in fp32 mode are the parameters themselves.
      float* dst = sections[section] != nullptr ? sections[section] + g.state
                                                : reinterpret_cast<float*>(model.owned_parameters(g));
      cuda_check(cudaMemcpy(dst, host.data(), g.count * sizeof(float), cudaMemcpyHostToDevice),
                 (std::string("uploading ") + names[section]).c_str());
    }
  }

  model.parameters_written();
  const checkpoint_detail::StateSource& first = *sources.front();
  const StateHeader& h = first.header;
  if (std::fseek(first.file, static_cast<long>(h.header_bytes + 3 * h.state_count * sizeof(float)), SEEK_SET) != 0)
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
  checkpoint_detail::load_fp8_state(first, model);
}
