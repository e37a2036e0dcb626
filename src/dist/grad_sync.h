// grad_sync.h — the parameter gradients of data-parallel training: where the backward pass
// accumulates them, and how they travel between ranks at each ZeRO stage, bucket by bucket
// (grad_buckets.h): all-reduce, reduce-scatter onto the owners, all-gather of the updated
// parameters. The model asks it for gradient pointers and calls its hooks around the backward
// pass; it never looks at the ZeRO stage itself.
//
// Every rank holds all parameters (llm.c order) and runs the same steps on its own micro-batches.
// Gradients are kept in bucket order; rank r owns chunk r of every bucket.
//   stage 0: each bucket is averaged over ranks (all-reduce); every rank keeps the full optimizer
//     state and runs the full AdamW update.
//   stage 1: each bucket is averaged onto its owners (reduce-scatter, in place); each rank keeps
//     AdamW moments (and fp32 master weights) for its chunks alone — 1/R of the optimizer state —
//     updates those parameters, then every bucket's parameters are all-gathered.
//   stage 2: as 1, and no rank holds the full gradient: the backward pass writes into one of two
//     layer-bucket working windows (alternating) and wte/wpe/lnf into a window of their own; each
//     window is summed onto the owners' gradient shards (reduce-scatter) as soon as its bucket is
//     complete, and is reused only after that communication finished (event). The loss gradient is
//     pre-divided by R (ranks_summed()) so the sum is the average. With gradient accumulation
//     every micro-step communicates (the windows cannot keep a sum): before a window is written
//     again, the owner copies its accumulated chunk into its own part of the window, so the
//     backward pass adds this micro-step's gradient to it and the next sum over ranks yields the
//     running total.
//   stage 3: gradients as at stage 2; the parameters are sharded too (param_shards.h), so the
//     update needs no all-gather here.
// Communication overlaps the backward pass: a bucket is sent on the communicator's stream as soon
// as its lowest layer's backward is queued (wte, wpe and lnf after the embeddings' backward), and
// (stages 0 and 1) only on the last micro-step of an optimizer step. One rank (or no
// communicator) always runs stage 0: with R = 1 the stages compute the same.
//
// Tensor parallelism (tensor_split.h): the ranks above are one tensor-parallel rank's data-parallel
// group, and the gradients those of its layout, in buckets that hold the replicated tensors first.
// Under sequence parallelism each TP rank computes only part of a replicated tensor's gradient
// (its rows'), so before a bucket travels (or, without data parallelism, on the last micro-step)
// that prefix is summed over the TP group, on the TP communicator's stream while the backward
// goes on; the data-parallel send waits for it. At stages 2 and 3 only TP rank 0 restores the
// accumulated chunk into the prefix, so the TP sum counts it once. The gradient norm counts a
// replicated tensor once (TP rank 0's) and sums over both groups. Expert parallelism (--ep,
// docs/MOE.md) is a second such group: its ranks read different rows and hold different experts,
// so the tensors they all hold (all but the experts) are summed over it in the same way, after
// the TP sum where both apply (grad_buckets.h orders each group's tensors into one range).
//
// Pipeline parallelism (PipelineGradients): a rank's layout is its stage's part. Its backward
// passes run out of order (the schedule's), so nothing travels during them: the step's gradients
// accumulate, then finish_pipeline_step() sums a tied wte's two copies (first and last stage, over
// their two-rank group, so both get the same bits) and sends every bucket. The gradient norm and
// the step's sums run over the pipeline group too; a tied wte counts once (the first stage's).
#pragma once
#include "kernels/global_norm.cuh"
#include "src/dist/comm.h"
#include "src/base/device.h"
#include "src/config/model_config.h"
#include "src/dist/grad_buckets.h"
#include "src/dist/tensor_split.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

// The ZeRO stage a run of world_size ranks uses for the requested one.
inline int effective_zero_stage(int requested, int world_size) { return world_size > 1 ? requested : 0; }

// The step's device scalars summed over ranks in one all-reduce (transformer.h): its loss sum and the
// ranks' stop votes.
constexpr size_t kStepScalars = 2;

// The buckets of a run: chunked for every rank at stages 1 and 2, for one owner at stage 0; a
// tensor-parallel rank's (tp_size > 1) or an expert-parallel rank's (`experts`) with the
// replicated tensors first.
inline GradientBuckets gradient_buckets(const ParameterLayout& layout, int world_size, int zero_stage,
                                        int bucket_layers, int tp_size = 1, bool experts = false) {
  return GradientBuckets(layout, bucket_layers, effective_zero_stage(zero_stage, world_size) == 0 ? 1 : world_size,
                         tp_size > 1 || experts, experts);
}

// Elements of the gradient buffers GradientSync allocates on one rank: stages 0 and 1 keep every
// bucket (chunked, padded); stages 2 and 3 two layer-bucket working windows, the wte/wpe/lnf
// window and the rank's chunks (its shard). Also sizes the memory plan (memory_plan.h).
struct GradientBufferCounts {
  size_t full = 0, layer_window = 0, model_window = 0, shard = 0;
  size_t total() const { return full + 2 * layer_window + model_window + shard; }
};
inline GradientBufferCounts gradient_buffer_counts(const GradientBuckets& buckets, int zero_stage) {
  GradientBufferCounts n;
  if (zero_stage < 2) {
    n.full = buckets.full_elements();
    return n;
  }
  n.layer_window = buckets.largest_layer_bucket();
  n.model_window = buckets.model_bucket().chunk * buckets.ranks();
  n.shard = buckets.shard_elements();
  return n;
}

// Pipeline parallelism's share (above): the pipeline group (nullptr: none), the tied embedding's
// two-rank group (nullptr where this rank holds no tied copy or holds both), and whether this rank's
// wte gradient counts towards the norm.
struct PipelineGradients {
  Communicator* pp = nullptr;
  Communicator* tied = nullptr;
  bool counts_wte = true;
};

template <typename Elem>
class GradientSync {
 public:
  // Gradients of `layout`'s parameters for the backward passes queued on `stream`, in buckets of
  // `bucket_layers` layers, synchronized over the data-parallel group `comm`; `tp_comm`: the
  // tensor-parallel group (nullptr: none), whose ranks sum their replicated tensors' gradients
  // when `sequence_parallel`; `ep_comm`: the EP group (nullptr: none, docs/MOE.md), whose ranks
  // always do, and by whose size the loss gradient is pre-divided (its ranks read different rows,
  // so the experts' gradients sum them too).
  GradientSync(const ParameterLayout& layout, Communicator* comm, int zero_stage, int bucket_layers,
               cudaStream_t stream, Communicator* tp_comm = nullptr, bool sequence_parallel = false,
               const PipelineGradients& pipeline = {}, Communicator* ep_comm = nullptr)
      : layout_(layout), comm_(comm), stream_(stream), pipeline_(pipeline),
        tp_(tp_comm, sequence_parallel), ep_(ep_comm, true) {
    if (zero_stage < 0 || zero_stage > 3)
      throw std::runtime_error("ZeRO stage: expected 0, 1, 2 or 3, found " + std::to_string(zero_stage));
    if (comm != nullptr) {
      world_ = comm->world_size();
      rank_ = comm->rank();
    }
    zero_ = effective_zero_stage(zero_stage, world_);
    buckets_ = gradient_buckets(layout_, world_, zero_, bucket_layers, tp_.size, ep_.size > 1);
    owner_ = zero_ == 0 ? 0 : rank_;
    segments_ = buckets_.segments(owner_);
    const GradientBufferCounts counts = gradient_buffer_counts(buckets_, zero_);
    if (shards_gradients()) {
      // Two allocations, not one: each window is reused after its own event, and the CPU build's
      // stream checker orders a kernel's pointer up to the end of the allocation it points into.
      for (DeviceArray<Elem>& window : layer_windows_)
        window = DeviceArray<Elem>(counts.layer_window, "gradients (one of two layer-bucket working windows)");
      model_window_ = DeviceArray<Elem>(counts.model_window, "gradients (wte, wpe, lnf working window)");
      shard_grads_ = DeviceArray<Elem>(counts.shard, "gradients (this rank's shard)");
      for (cudaEvent_t& e : window_free_)
        cuda_check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "creating a gradient-window event");
    } else {
      grads_ = DeviceArray<Elem>(counts.full, "gradients");
    }
  }
  GradientSync(const GradientSync&) = delete;
  GradientSync& operator=(const GradientSync&) = delete;
  ~GradientSync() {
    wait_idle();
    for (cudaEvent_t e : window_free_)
      if (e != nullptr) cudaEventDestroy(e);
  }

  int zero_stage() const { return zero_; }
  int world_size() const { return world_; }
  const GradientBuckets& buckets() const { return buckets_; }
  // This rank's owned elements, in optimizer-state order; their gradients are at
  // owned_gradients() + gradient_offset(segment).
  const std::vector<OptimizerSegment>& segments() const { return segments_; }
  size_t state_count() const { return buckets_.state_count(owner_); }
  const Elem* owned_gradients() const { return shards_gradients() ? shard_grads_.get() : grads_.get(); }
  size_t gradient_offset(const OptimizerSegment& s) const {
    return shards_gradients() ? buckets_.shard_offset(s, owner_) : buckets_.buckets()[s.bucket].offset + s.at;
  }
  // The loss gradient's divisor beyond the mean over tokens and micro-steps: stages 2 and 3 sum, and
  // an EP group sums its ranks' rows.
  float ranks_summed() const {
    return (shards_gradients() ? static_cast<float>(world_) : 1.0f) * static_cast<float>(ep_.size);
  }
  // Ranks whose values sum_over_ranks() adds: every group's.
  int ranks_in_sums() const { return world_ * tp_.size * ep_.size; }
  size_t bytes() const { return grads_.bytes() + shard_grads_.bytes() + 2 * layer_windows_[0].bytes() + model_window_.bytes(); }

  // Where the backward pass accumulates tensor `tensor`'s gradient (layer `layer`'s slice of a
  // per-layer tensor; layer ignored for wte, wpe, lnf).
  Elem* at(int tensor, int layer) const {
    const size_t b = is_layer_tensor(tensor) ? buckets_.bucket_of_layer(layer) : buckets_.buckets().size() - 1;
    return bucket_data(b) + buckets_.piece_at(tensor, layer);
  }
  // The ranges [offset, offset + count) of owned_gradients() that hold this rank's gradients and
  // count towards the gradient norm (a replicated tensor's on rank 0 of the TP and EP groups alone).
  std::vector<std::pair<size_t, size_t>> owned_gradient_ranges() const {
    if (tp_.rank > 0 || ep_.rank > 0 || !pipeline_.counts_wte) {
      std::vector<std::pair<size_t, size_t>> ranges;
      for (const OptimizerSegment& s : segments_) {
        if ((tp_.rank > 0 && tp_replicated(s.tensor, layout_.mixture())) || (ep_.rank > 0 && !expert_tensor(s.tensor)) ||
            (!pipeline_.counts_wte && s.tensor == kWte))
          continue;
        const size_t at = gradient_offset(s);
        if (!ranges.empty() && ranges.back().first + ranges.back().second == at) ranges.back().second += s.count;
        else ranges.push_back({at, s.count});
      }
      return ranges;
    }
    if (zero_ != 1) return {{0, shards_gradients() ? shard_grads_.count() : grads_.count()}};
    std::vector<std::pair<size_t, size_t>> ranges;
    for (const GradientBucket& b : buckets_.buckets()) ranges.push_back({b.offset + owner_ * b.chunk, b.chunk});
    return ranges;
  }

  // Host copies as float of all accumulated gradients, llm.c order (at stages 2 and 3 no rank holds
  // them all: throws).
  std::vector<float> llmc_order(cudaStream_t stream) const {
    if (shards_gradients())
      throw std::runtime_error("gradients(): at ZeRO stages 2 and 3 each rank holds only its gradient shard");
    std::vector<float> all(layout_.total);
    for (const GradientBucket& b : buckets_.buckets())
      for (const GradientPiece& p : b.pieces) {
        const std::vector<float> piece = copy_floats_to_host(at(p.tensor, p.layer), p.count, stream);
        std::copy(piece.begin(), piece.end(), all.begin() + layout_.slice_offset(p.tensor, p.layer));
      }
    return all;
  }

  void zero() {
    if (shards_gradients()) {
      cuda_check(cudaMemsetAsync(shard_grads_.get(), 0, shard_grads_.bytes(), stream_), "zeroing gradients");
      shard_holds_gradients_ = false;
      return;
    }
    cuda_check(cudaMemsetAsync(grads_.get(), 0, grads_.bytes(), stream_), "zeroing gradients");
  }

  // Calls around one micro-step's backward pass, in this order: begin_micro_step before anything
  // writes a gradient (the lm head included), open_layer_gradients(l) and send_finished_bucket(l)
  // around layer l's backward (l = L-1 .. 0), end_micro_step (which sends the embeddings' bucket)
  // after the embeddings' backward.
  void begin_micro_step(bool last_micro_step) {
    communicate_ = communicating() && (last_micro_step || shards_gradients());
    sum_replicated_now_ = sums_replicated() && (last_micro_step || shards_gradients());
    if (!shards_gradients()) return;
    comm_->order_before(stream_);  // the previous micro-step's sums into the shard are complete
    prepare_window(buckets_.buckets().size() - 1);
  }
  // ZeRO 2: the window of l's bucket, free again, before its top layer writes gradients into it.
  void open_layer_gradients(int l) {
    const size_t b = buckets_.bucket_of_layer(l);
    if (!shards_gradients() || buckets_.buckets()[b].top_layer != l) return;
    cuda_check(cudaStreamWaitEvent(stream_, window_free_[b % 2], 0), "waiting for a gradient window");
    prepare_window(b);
  }
  // A layer bucket is complete once its lowest layer's backward is queued: it is sent after that
  // backward (event), while the model's stream moves on to the next layer.
  void send_finished_bucket(int l) {
    const size_t b = buckets_.bucket_of_layer(l);
    if (buckets_.buckets()[b].bottom_layer != l) return;
    finish_bucket(b);
    if (communicate_ && shards_gradients())
      cuda_check(cudaEventRecord(window_free_[b % 2], comm_->stream()), "recording a gradient-window event");
  }
  // wte (lm head and embedding), wpe and lnf are complete after the encoder backward.
  void end_micro_step() {
    finish_bucket(buckets_.buckets().size() - 1);
    communicate_ = false;
    sum_replicated_now_ = false;
    shard_holds_gradients_ = shards_gradients();
  }

  // Pipeline: after the step's last backward, the tied wte's copies summed and every bucket sent.
  void finish_pipeline_step() {
    if (pipeline_.tied != nullptr) {
      Communicator& tied = *pipeline_.tied;
      Elem* wte = at(kWte, 0);
      tied.ordered_with(stream_, [&] { tied.all_reduce(wte, layout_[kWte].count, ncclSum); });
    }
    communicate_ = communicating();
    sum_replicated_now_ = sums_replicated();
    for (size_t b = buckets_.buckets().size(); b-- > 0;) finish_bucket(b);
    communicate_ = false;
    sum_replicated_now_ = false;
  }

  // Blocks until this rank's gradient and parameter communication has finished.
  void wait_idle() const {
    if (communicating()) cudaStreamSynchronize(comm_->stream());
    for (const RowGroup* g : {&tp_, &ep_})
      if (g->comm != nullptr) cudaStreamSynchronize(g->comm->stream());
  }
  // Orders the work queued next on the model's stream after the gradient communication.
  void wait_for_gradients() {
    if (communicating()) comm_->order_before(stream_);
    for (const RowGroup* g : {&tp_, &ep_})
      if (g->comm != nullptr) g->comm->order_before(stream_);
    if (pipeline_.tied != nullptr) pipeline_.tied->order_before(stream_);
  }
  // The squared global norm of the accumulated gradients into device float *norm_squared, after
  // their communication: this rank's owned_gradient_ranges(), summed over the ranks' (the
  // data-parallel group's when they are sharded; the TP and EP groups' always). scratch: at least
  // global_norm_scratch_bytes().
  void queue_norm_squared(float* norm_squared, float* scratch) {
    wait_for_gradients();
    cuda_check(cudaMemsetAsync(norm_squared, 0, sizeof(float), stream_), "gradient norm");
    for (const auto& [offset, count] : owned_gradient_ranges())
      global_norm_squared(norm_squared, scratch, owned_gradients() + offset, count, stream_);
    if (communicating() && zero_ > 0) sum_on(comm_, norm_squared, 1);
    for (const RowGroup* g : {&tp_, &ep_})
      if (g->comm != nullptr) sum_on(g->comm, norm_squared, 1);
    if (pipeline_.pp != nullptr) sum_on(pipeline_.pp, norm_squared, 1);
  }
  // n device values become their sums over the ranks of every group; ranks_in_sums() of them hold
  // a loss (a pipeline's last stage alone computes one).
  void sum_over_ranks(double* values, size_t n) {
    if (communicating()) sum_on(comm_, values, n);
    for (const RowGroup* g : {&tp_, &ep_})
      if (g->comm != nullptr) sum_on(g->comm, values, n);
    if (pipeline_.pp != nullptr) sum_on(pipeline_.pp, values, n);
  }
  // After each rank updated its parameters (llm.c order): every rank gets every rank's, bucket by
  // bucket through a gradient window the optimizer step no longer needs: this rank's segments
  // are packed into its chunk, the chunks all-gathered in place, and the bucket unpacked.
  void gather_parameters(Elem* params) {
    if (!communicating() || zero_ == 0 || zero_ == 3) return;
    comm_->ordered_with(stream_, [&] {
      cudaStream_t s = comm_->stream();
      size_t next = 0;  // segments_ are in bucket order
      for (size_t bi = 0; bi < buckets_.buckets().size(); ++bi) {
        const GradientBucket& b = buckets_.buckets()[bi];
        Elem* window = bucket_data(bi);
        for (; next < segments_.size() && segments_[next].bucket == bi; ++next) {
          const OptimizerSegment& g = segments_[next];
          copy(window + g.at, params + g.param, g.count, s, "packing updated parameters");
        }
        comm_->all_gather(window + owner_ * b.chunk, window, b.chunk);
        for (const GradientPiece& p : b.pieces)
          copy(params + layout_.slice_offset(p.tensor, p.layer), window + p.at, p.count, s, "unpacking parameters");
      }
    });
  }

 private:
  bool communicating() const { return comm_ != nullptr && world_ > 1; }
  // Stages 2 and 3 keep a gradient shard and working windows.
  bool shards_gradients() const { return zero_ >= 2; }

  template <typename T> void sum_on(Communicator* comm, T* values, size_t n) {
    comm->ordered_with(stream_, [&] { comm->all_reduce(values, n, ncclSum); });
  }

  // Bucket b is complete: its replicated ranges summed over the TP group, then the EP group, then
  // the bucket sent over the data-parallel group, where this micro-step does these; each waits for
  // the one before.
  void finish_bucket(size_t b) {
    cudaStream_t ready = stream_;
    const GradientBucket& bucket = buckets_.buckets()[b];
    if (sum_replicated_now_)
      for (const auto& [g, range] : {std::pair{&tp_, bucket.tp_replicated}, std::pair{&ep_, bucket.ep_replicated}}) {
        if (!g->sums || range.count() == 0) continue;
        g->comm->wait_for(ready);
        g->comm->all_reduce(bucket_data(b) + range.begin, range.count(), ncclSum);
        ready = g->comm->stream();
      }
    if (!communicate_) return;
    comm_->wait_for(ready);
    send(b);
  }

  static void copy(Elem* dst, const Elem* src, size_t n, cudaStream_t s, const char* what) {
    cuda_check(cudaMemcpyAsync(dst, src, n * sizeof(Elem), cudaMemcpyDeviceToDevice, s), what);
  }

  // Bucket b's elements: its place in the full buffer, or (stages 2 and 3) its working window.
  Elem* bucket_data(size_t b) const {
    const GradientBucket& bucket = buckets_.buckets()[b];
    if (!shards_gradients()) return grads_.get() + bucket.offset;
    if (!bucket.holds_layers()) return model_window_.get();
    return layer_windows_[b % 2].get();
  }

  // Stage 2: makes bucket b's working window ready for a backward pass to accumulate into (the
  // caller has ordered it after the window's previous communication): zeroes it and, after an
  // earlier micro-step of this optimizer step, copies this rank's accumulated chunk into its part.
  void prepare_window(size_t b) {
    const GradientBucket& bucket = buckets_.buckets()[b];
    Elem* window = bucket_data(b);
    cuda_check(cudaMemsetAsync(window, 0, bucket.chunk * world_ * sizeof(Elem), stream_), "zeroing a gradient window");
    if (!shard_holds_gradients_) return;
    const size_t begin = owner_ * bucket.chunk;
    copy(window + begin, shard_grads_.get() + bucket.shard_offset, bucket.chunk, stream_,
         "restoring accumulated gradients");
    // A group sums its replicated range: that range's accumulated part comes from its rank 0 alone.
    for (const auto& [g, range] : {std::pair{&tp_, bucket.tp_replicated}, std::pair{&ep_, bucket.ep_replicated}}) {
      const size_t from = std::max(begin, range.begin), to = std::min(begin + bucket.chunk, range.end);
      if (g->sums && g->rank > 0 && from < to)
        cuda_check(cudaMemsetAsync(window + from, 0, (to - from) * sizeof(Elem), stream_), "zeroing a replicated range");
    }
  }

  // Communicates bucket b: stage 0 averages it everywhere (in place); stage 1 averages each chunk
  // onto its owner (in place); stages 2 and 3 sum each chunk into its owner's gradient shard.
  void send(size_t b) {
    const GradientBucket& bucket = buckets_.buckets()[b];
    Elem* data = bucket_data(b);
    if (zero_ == 0) comm_->all_reduce(data, bucket.elements, ncclAvg);
    else if (zero_ == 1) comm_->reduce_scatter(data, data + owner_ * bucket.chunk, bucket.chunk, ncclAvg);
    else comm_->reduce_scatter(data, shard_grads_.get() + bucket.shard_offset, bucket.chunk, ncclSum);
  }

  const ParameterLayout layout_;
  Communicator* comm_;
  cudaStream_t stream_;
  const PipelineGradients pipeline_;
  int zero_ = 0, world_ = 1, rank_ = 0;
  int owner_ = 0;  // whose chunks this rank's optimizer updates: its rank at stages 1 and 2, 0 (all) at stage 0
  GradientBuckets buckets_;
  std::vector<OptimizerSegment> segments_;
  bool communicate_ = false;  // set during a micro-step whose backward communicates
  DeviceArray<Elem> grads_;   // stages 0 and 1: every bucket
  // Stage 2 only: working windows, the gradient shard, and whether the shard holds gradients of
  // earlier micro-steps of the current optimizer step.
  DeviceArray<Elem> layer_windows_[2], model_window_, shard_grads_;
  cudaEvent_t window_free_[2] = {nullptr, nullptr};  // recorded on the comm stream when a layer window is sent
  bool shard_holds_gradients_ = false;
  // A TP or EP group of several ranks (comm nullptr: none), this rank's place in it, and whether
  // its ranks sum their replicated range (they computed it from different rows).
  struct RowGroup {
    Communicator* comm = nullptr;
    int size = 1, rank = 0;
    bool sums = false;
    RowGroup(Communicator* c, bool different_rows) {
      if (c == nullptr || c->world_size() < 2) return;
      comm = c;
      size = c->world_size();
      rank = c->rank();
      sums = different_rows;
    }
  };
  bool sums_replicated() const { return tp_.sums || ep_.sums; }
  const RowGroup tp_, ep_;
  bool sum_replicated_now_ = false;  // whether the current micro-step sums the groups' ranges
};
