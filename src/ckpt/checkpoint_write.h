// checkpoint_write.h — all ranks writing one checkpoint together, in phases that each end with the
// ranks agreeing it succeeded (a failure anywhere removes the partial directory).
#pragma once
#include "kernels/common.cuh"
#include "src/base/durable_file.h"
#include "src/ckpt/checkpoint.h"
#include "src/ckpt/checkpoint_dirs.h"
#include "src/dist/comm.h"
#include "src/model/transformer.h"

#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

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

inline void write_device_floats(AtomicFileWriter& out, const float* device, size_t count) {
  std::vector<float> host(std::min(count, kCheckpointChunkElements));
  for (size_t done = 0; done < count;) {
    const size_t n = std::min(host.size(), count - done);
    cuda_check(cudaMemcpy(host.data(), device + done, n * sizeof(float), cudaMemcpyDeviceToHost),
               "copying training state to the host");
    out.write(host.data(), n * sizeof(float));
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

// A file written into a checkpoint, as the manifest lists it.
struct WrittenFile {
  uint64_t bytes = 0;
  uint32_t crc = 0;
};

// The parts of a checkpoint write that may fail on some ranks: each part runs unless an earlier
// one failed on this rank, and agree() makes every rank learn whether all succeeded (a
// collective): after a failure anywhere the directory goes and every rank throws, the failing
// rank with its own error.
class CollectiveAttempt {
 public:
  CollectiveAttempt(Communicator* comm, bool lead, std::string dir) : comm_(comm), lead_(lead), dir_(std::move(dir)) {}
  template <typename F> void run(F&& part) {
    if (!error_.empty()) return;
    try {
      part();
    } catch (const std::exception& e) {
      error_ = e.what();
    }
  }
  void agree() {
    if (all_ranks_ok(comm_, error_.empty())) return;
    if (lead_) remove_checkpoint_dir(dir_);
    const std::string what = "writing checkpoint " + dir_ + ": ";
    if (error_.empty()) throw FailedOnAnotherRank(what + "another rank failed");
    throw std::runtime_error(what + error_);
  }

 private:
  Communicator* comm_;
  const bool lead_;
  const std::string dir_;
  std::string error_;  // this rank's failure
};

// Rank 0: DIR exists and holds no manifest. A directory of the same name (left by a run that died,
// or an abandoned later timeline) loses its manifest before anything in it is replaced.
inline void prepare_checkpoint_dir(const std::string& out_dir, const std::string& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) == 0) {
    const std::string manifest = dir + "/" + kManifestName;
    if (::unlink(manifest.c_str()) == 0) fsync_directory(dir);
  } else {
    if (::mkdir(dir.c_str(), 0755) != 0) throw file_error(dir, "cannot create", errno);
    fsync_directory(out_dir);
  }
}

// Rank 0 (`lead`): DIR/model.bin, read back for its size and CRC. At ZeRO 3 every rank calls it
// (the parameters are gathered).
template <typename Elem>
WrittenFile write_checkpoint_model(const std::string& dir, const Transformer<Elem>& model, bool lead) {
  const std::string path = dir + "/" + kModelFileName;
  model.save(path, Transformer<Elem>::dtype, lead);
  WrittenFile f;
  if (!lead) return f;
  if (!file_size_and_crc(path, &f.bytes, &f.crc)) throw file_error(path, "cannot read back", errno);
  return f;
}

// --fp8's section of every state file: the whole model's FP8 scaling state, gathered from the
// pipeline's stages (Fp8State::whole_model_state; a collective every rank joins); empty without --fp8.
template <typename Elem>
std::vector<float> fp8_section(const Transformer<Elem>& model) {
  const Fp8State* fp8 = model.fp8_state();
  return fp8 != nullptr ? fp8->whole_model_state(model.pipeline(), model.config().num_layers) : std::vector<float>{};
}

// This rank's state file: its header, then its optimizer shard, the guards' windows and, with
// --fp8, the FP8 scaling state (`fp8`, fp8_section()'s; empty: none).
template <typename Elem>
WrittenFile write_state_file(const std::string& dir, const Transformer<Elem>& model, const TrainingState& state,
                             const CheckpointWriteInfo& info, const std::vector<float>& fp8) {
  const GradientSync<Elem>& owned = model.gradient_sync();
  StateHeader h{};
  std::memcpy(h.magic, kStateMagic, sizeof h.magic);
  h.version = kStateVersion;
  h.header_bytes = sizeof(StateHeader);
  h.rank = static_cast<uint32_t>(info.rank);
  h.world_size = static_cast<uint32_t>(info.world_size);
  h.zero_stage = static_cast<uint32_t>(info.zero_stage);
  h.dtype = static_cast<uint32_t>(Transformer<Elem>::dtype);
  h.step = static_cast<uint64_t>(state.step);
  h.num_parameters = model.num_parameters();
  h.bucket_layers = static_cast<uint64_t>(owned.buckets().bucket_layers());
  h.state_count = owned.state_count();
  h.seed = state.seed;
  h.train_data = state.train_data;
  h.skipped_nonfinite = state.guards.skipped_nonfinite;
  h.skipped_loss_z = state.guards.skipped_loss_z;
  h.skipped_norm_z = state.guards.skipped_norm_z;
  h.loss_window_count = state.guards.loss_window.values().size();
  h.norm_window_count = state.guards.norm_window.values().size();
  h.config_hash = configuration_hash(info.config);

  AtomicFileWriter out(dir + "/" + state_file_name(info.rank));
  out.write(&h, sizeof h);
  // The optimizer buffers hold the owned parameters' state in state order; fp32 parameters (the
  // fp32 weights in fp32 mode) are written segment by segment from wherever the model keeps them.
  if (model.master_device() != nullptr) {
    write_device_floats(out, model.master_device(), h.state_count);
  } else {
    for (const OptimizerSegment& g : owned.segments())
      write_device_floats(out, reinterpret_cast<const float*>(model.owned_parameters(g)), g.count);
  }
  write_device_floats(out, model.adam_m_device(), h.state_count);
  write_device_floats(out, model.adam_v_device(), h.state_count);
  write_window(out, state.guards.loss_window);
  write_window(out, state.guards.norm_window);
  if (!fp8.empty()) {  // --fp8: its section (docs/CHECKPOINTS.md)
    const uint64_t count = fp8.size();
    out.write(&count, sizeof count);
    out.write(fp8.data(), fp8.size() * sizeof(float));
  }
  out.commit();
  return {out.size(), out.crc32c()};
}

// The manifest's file list: the model file, then every rank's state file (sizes and CRCs reach
// rank 0 through the communicator; a collective).
inline nlohmann::ordered_json manifest_files(Communicator* comm, int world_size, const WrittenFile& model,
                                             const WrittenFile& state) {
  nlohmann::ordered_json files = nlohmann::ordered_json::array();
  files.push_back({{"name", kModelFileName}, {"bytes", model.bytes}, {"crc32c", crc_hex(model.crc)}});
  for (int r = 0; r < world_size; ++r) {
    const uint64_t bytes = from_rank(comm, r, state.bytes);
    const uint32_t crc = static_cast<uint32_t>(from_rank(comm, r, state.crc));
    files.push_back({{"name", state_file_name(r)}, {"bytes", bytes}, {"crc32c", crc_hex(crc)}});
  }
  return files;
}

// Rank 0, last: DIR/manifest.json, which declares the checkpoint complete.
template <typename Elem>
void write_manifest(const std::string& dir, const Transformer<Elem>& model, const TrainingState& state,
                    const CheckpointWriteInfo& info, const nlohmann::ordered_json& files) {
  const ModelConfig& mc = model.config();
  nlohmann::ordered_json manifest = {
      {"format", kManifestFormat},
      {"version", kManifestVersion},
      {"step", state.step},
      {"world_size", info.world_size},
      {"tensor_parallel", info.tensor_parallel},
      {"expert_parallel", info.expert_parallel},
      {"pipeline_parallel", info.pipeline_parallel},
      {"pipeline_chunks", info.pipeline_chunks.empty() ? std::vector<int>{model.config().num_layers} : info.pipeline_chunks},
      {"zero_stage", info.zero_stage},
      {"dtype", dtype_name(Transformer<Elem>::dtype)},
      {"num_parameters", model.num_parameters()},
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
  AtomicFileWriter out(dir + "/" + kManifestName);
  out.write(text.data(), text.size());
  out.commit();
}

}  // namespace checkpoint_detail

// Writes OUT/checkpoint_<state.step>, collectively over the ranks of `comm` (nullptr: a single
// process; every rank must call it), in three phases, each ending with the ranks agreeing that
// it succeeded: rank 0 prepares the directory; rank 0 writes model.bin (at ZeRO 3 from the
// parameters every rank helps gather) and every rank its own state file (its optimizer shard and
// data position; with --fp8 the whole model's FP8 state, gathered from the pipeline's stages before
// the first phase); rank 0 writes the manifest last. OUT must be one shared directory for all
// ranks. If any rank fails, rank 0 removes the partial directory and every rank throws; other
// checkpoints are never touched. Returns the directory.
template <typename Elem>
std::string write_checkpoint(const std::string& out_dir, const Transformer<Elem>& model, const TrainingState& state,
                             const CheckpointWriteInfo& info, Communicator* comm = nullptr) {
  using namespace checkpoint_detail;
  const std::string dir = out_dir + "/" + checkpoint_dir_name(state.step);
  const bool lead = info.rank == 0;
  // The state read below is final once the step's update (queued, not waited for) is done.
  cuda_check(cudaStreamSynchronize(model.stream()), "finishing the step before its checkpoint");
  // Gathered before any part that may fail on one rank alone, so that no rank waits in it for one
  // that stopped.
  const std::vector<float> fp8 = fp8_section(model);
  CollectiveAttempt attempt(comm, lead, dir);

  if (lead) attempt.run([&] { prepare_checkpoint_dir(out_dir, dir); });
  attempt.agree();

  WrittenFile model_file, state_file;
  attempt.run([&] { model_file = write_checkpoint_model(dir, model, lead); });
  attempt.run([&] { state_file = write_state_file(dir, model, state, info, fp8); });
  attempt.agree();

  const nlohmann::ordered_json files = manifest_files(comm, info.world_size, model_file, state_file);
  if (lead) attempt.run([&] { write_manifest(dir, model, state, info, files); });
  attempt.agree();
  return dir;
}
