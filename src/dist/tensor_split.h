// tensor_split.h — tensor parallelism's parameter split (host arithmetic): which part of each
// GPT-2 tensor a rank of a tensor-parallel (TP) group holds, that rank's own parameter layout, and
// the map between its elements and llm.c's, which splits values on read (initialization, model
// files, checkpoints) and places them on write.
//
// Megatron's split of a block, over a group of `size` ranks, rank t holding part t:
//   qkvw, qkvb  column-parallel by whole heads: the rank's NH/size query heads' rows of q and its
//               NKV/size K/V heads' rows of k and of v (GQA splits by K/V heads), kept as
//               [q part; k part; v part], so the rank's qkv is an ordinary fused qkv of NH/size
//               query and NKV/size K/V heads
//   attprojw    row-parallel: columns [t·C/size, ...) of every row (the rank's heads' inputs)
//   fcw, fcb,   column-parallel: rows [t·H/size, ...) (H: the MLP's hidden units; fc2w is
//   fc2w        SwiGLU's second input product)
//   fcprojw     row-parallel: columns [t·H/size, ...) of every row
//   wte,        vocabulary-parallel: rows [t·Vp/size, ...) (the embedding and the lm head, tied
//   lm_head     or its own)
//   the rest    replicated: wpe, the norms, attprojb, fcprojb (the row-parallel biases,
//               added once after the partial products are summed)
// The local layout keeps llm.c's tensor order with these counts, so a rank's parameters,
// gradients, optimizer state and ZeRO buckets are those of an ordinary (smaller) model.
// Pipeline parallelism narrows it further (StagePart): a pipeline rank holds its layers (local
// layer j is global layer layers[j]) and, of the tensors outside the layers, wte and wpe on the
// first stage, lnf and the lm head on the last (tied: wte on both); the others have no elements.
#pragma once
#include "src/config/model_config.h"

#include <cstddef>
#include <string>
#include <vector>

// A rank's place in the TP group, and whether the block's LayerNorm/residual region is split
// along the tokens (sequence parallelism) rather than replicated.
// `experts`: the EP group's size (--ep), whose ranks split the experts instead (memory plans).
struct TensorParallelism {
  int size = 1, rank = 0;
  bool sequence_parallel = false;
  int experts = 1;
};

// The part of the model a pipeline rank holds (src/dist/pipeline_stages.h): its global layers, in
// local order, and whether it runs the embedding (first stage) and the head (last stage).
struct StagePart {
  std::vector<int> layers;
  std::vector<int> chunks;  // layers per model chunk, in local order (interleaving: several; they sum to layers)
  bool embedding = true, head = true;
  // Every layer, both ends: the whole model (no pipeline).
  static StagePart whole(int num_layers);
  // Pipeline rank `rank` of `p` when the model's chunks, in model order, have chunk_layers[s]
  // layers each and chunk s lives on rank s % p (pipeline_schedule.h).
  static StagePart of_rank(const std::vector<int>& chunk_layers, int p, int rank);
  bool operator==(const StagePart& o) const { return layers == o.layers && embedding == o.embedding && head == o.head; }
};

class Communicator;
// Every pipeline rank's part, this rank's index and the pipeline's communicator (nullptr and one
// whole part: no pipeline). Gathering the whole model's parameters needs the other ranks' parts.
// `tied`: the two-rank group of the first and the last stage that sums a tied wte's gradient
// (nullptr: none here); `in_flight`: the micro-batches (chunk passes) whose activations this rank
// keeps at once, the schedule's peak (pipeline_step.h); `split_backward`: zb-h1's backwards, the
// input's and the weights' apart.
struct PipelineParts {
  std::vector<StagePart> stages;
  int rank = 0;
  Communicator* comm = nullptr;
  Communicator* tied = nullptr;
  int in_flight = 1;
  bool split_backward = false;
  static PipelineParts whole(int num_layers) { return {{StagePart::whole(num_layers)}, 0, nullptr, nullptr, 1, false}; }
  const StagePart& mine() const { return stages[rank]; }
  int size() const { return static_cast<int>(stages.size()); }
};

// The layers of each of the pipeline's chunks in model order (StagePart::of_rank's chunk_layers).
std::vector<int> pipeline_chunk_layers(const PipelineParts& parts);

// Whether `part` holds tensor i at all (a layer tensor: when it holds any layer).
bool stage_holds(const ModelConfig& c, const StagePart& part, int tensor);

// Whether tensor i holds a mixture's experts in a model with them (fcw, fc2w, fcprojw).
bool expert_tensor(int tensor);
// Whether every rank of a TP group holds all of tensor i (`mixture`: the model has experts, which
// --tp leaves whole).
bool tp_replicated(int tensor, bool mixture = false);

// Throws unless `size` ranks can split `c`: whole query and K/V heads per rank (NH % size == 0,
// NKV % size == 0), hidden units and a vocabulary slice of whole 128-bit vectors (H % (8·size) == 0,
// Vp % (8·size) == 0). `flag` names the setting in the message.
void check_tensor_split(const ModelConfig& c, int size, const std::string& flag);

// One run of consecutive elements of a tensor slice held by a rank: local slice elements
// [local, local + count) are global slice elements [global, global + count).
struct SplitRun {
  size_t local, global, count;
};

class TensorSplit {
 public:
  TensorSplit(const ModelConfig& c, int size, int rank) : TensorSplit(c, size, rank, StagePart::whole(c.num_layers)) {}
  // With ep_size > 1 (expert parallelism, docs/MOE.md): rank ep_rank of the EP group holds experts
  // [ep_rank·E/ep_size, ...) of fcw, fc2w, fcprojw (which a TP group leaves whole), the rest as
  // its TP rank's.
  TensorSplit(const ModelConfig& c, int size, int rank, const StagePart& stage, int ep_size = 1, int ep_rank = 0);

  int size() const { return size_; }  // the TP group's
  int rank() const { return rank_; }
  int ep_size() const { return ep_size_; }
  // Whether the EP group splits tensor i (the TP group splits the others, if any).
  bool ep_splits(int tensor) const { return ep_size_ > 1 && config_.moe() && expert_tensor(tensor); }
  // The group whose ranks hold different parts of tensor i (the EP group's or the TP group's), this
  // rank's place in it, and the split of its rank r.
  int group_size(int tensor) const { return ep_splits(tensor) ? ep_size_ : size_; }
  int group_rank(int tensor) const { return ep_splits(tensor) ? ep_rank_ : rank_; }
  TensorSplit of_group_rank(int tensor, int r) const {
    return ep_splits(tensor) ? TensorSplit(config_, size_, rank_, stage_, ep_size_, r)
                             : TensorSplit(config_, size_, r, stage_, ep_size_, ep_rank_);
  }
  const StagePart& stage() const { return stage_; }
  // Whether this rank holds the whole model (no TP and no pipeline split): local == global.
  bool whole() const { return size_ == 1 && ep_size_ == 1 && stage_ == StagePart::whole(config_.num_layers); }
  // The global layer of local layer l.
  int global_layer(int l) const { return stage_.layers[l]; }
  // The rank's layout (llm.c order, its parts' counts) and the whole model's.
  const ParameterLayout& local() const { return local_; }
  const ParameterLayout& global() const { return global_; }
  // The runs of one slice of tensor i (a layer's for per-layer tensors), in local order.
  const std::vector<SplitRun>& runs(int tensor) const { return runs_[tensor]; }

  // The rank's part of tensor i (every layer) from the whole tensor's values.
  template <typename T> std::vector<T> split(int tensor, const T* whole) const {
    std::vector<T> part(local_[tensor].count);
    for_each_run(tensor, [&](size_t local, size_t global, size_t n) {
      for (size_t k = 0; k < n; ++k) part[local + k] = whole[global + k];
    });
    return part;
  }
  // Writes the rank's part of tensor i (every layer) into the whole tensor.
  template <typename T> void place(int tensor, const T* part, T* whole) const {
    for_each_run(tensor, [&](size_t local, size_t global, size_t n) {
      for (size_t k = 0; k < n; ++k) whole[global + k] = part[local + k];
    });
  }
  // Writes the rank's part of one slice of tensor i into that slice of the whole tensor (`whole`
  // points at the slice: a layer's for per-layer tensors).
  template <typename T> void place_slice(int tensor, const T* part, T* whole) const {
    for (const SplitRun& r : runs_[tensor])
      for (size_t k = 0; k < r.count; ++k) whole[r.global + k] = part[r.local + k];
  }
  const ModelConfig& global_config() const { return config_; }
  // Local parameter `param` (an index into the local layout): its index in the global layout and
  // how many local elements from it continue consecutively there (*run_left).
  size_t to_global(size_t param, size_t* run_left) const;

 private:
  // f(local, global, count) for every run of every layer of tensor i, offsets within the tensor.
  template <typename F> void for_each_run(int tensor, F&& f) const {
    const bool layered = is_layer_tensor(tensor);
    const size_t layers = layered ? local_.num_layers : 1;
    const size_t local_slice = local_.slice_count(tensor), global_slice = global_.slice_count(tensor);
    for (size_t l = 0; l < layers; ++l) {
      const size_t g = layered ? static_cast<size_t>(stage_.layers[l]) : 0;
      for (const SplitRun& r : runs_[tensor]) f(l * local_slice + r.local, g * global_slice + r.global, r.count);
    }
  }

  ModelConfig config_;
  int size_, rank_;
  StagePart stage_;
  int ep_size_, ep_rank_;
  ParameterLayout local_, global_;
  std::vector<SplitRun> runs_[kNumParameterTensors];
};
