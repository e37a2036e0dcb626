// grad_sync.h — the parameter gradients of data-parallel training: where the backward pass
// accumulates them, and how they travel between ranks at each ZeRO stage (all-reduce, reduce onto
// the owner of each shard, all-gather of the updated parameters). The model asks it for gradient
// pointers and calls its hooks around the backward pass; it never looks at the ZeRO stage itself.
//
// Every rank holds all parameters (padded to R·S elements, S = zero_shard_size(P, R), so shard
// boundaries are 16-byte aligned) and runs the same steps on its own micro-batches.
//   stage 0: gradients are averaged over ranks (all-reduce); every rank keeps the full optimizer
//     state and runs the full AdamW update.
//   stage 1: rank r owns elements [r·S, (r+1)·S) ∩ [0, P): gradients are averaged onto their owner
//     only, the owner keeps AdamW moments (and fp32 master weights) for its shard alone — 1/R of
//     the optimizer state — and updates its shard, then the parameters are all-gathered.
//   stage 2: as 1, and no rank holds the full gradient: the backward pass writes layer l's
//     gradients into one of two per-layer working blocks (layer l % 2) and wte/wpe/lnf's into a
//     block of their own; each block is summed onto the owners' gradient shards (S elements) as
//     soon as it is complete, and a working block is reused only after its communication finished
//     (event). The loss gradient is pre-divided by R (ranks_summed()) so the sum is the average.
//     With gradient accumulation every micro-step communicates (the working blocks cannot keep a
//     sum): before a block is written again, the owner copies its accumulated shard values into its
//     own part of the block, so the backward pass adds this micro-step's gradient to them and the
//     next sum over ranks yields the running total.
// Communication overlaps the backward pass: layer l's gradients are sent on the communicator's
// stream as soon as layer l's backward is queued (wte, wpe and lnf after the last layer), and
// (stages 0 and 1) only on the last micro-step of an optimizer step. One rank (or no
// communicator) always runs stage 0: with R = 1 the stages compute the same.
#pragma once
#include "comm.h"
#include "device.h"
#include "gpt2_config.h"

#include <algorithm>
#include <array>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <utility>

// The ZeRO stage a run of world_size ranks uses for the requested one.
inline int effective_zero_stage(int requested, int world_size) { return world_size > 1 ? requested : 0; }

// S: the elements of each rank's shard of a P-element buffer, rounded up to 8 (16 bytes of bf16).
inline size_t zero_shard_size(size_t P, size_t world_size) { return ceil_div(ceil_div(P, world_size), size_t(8)) * 8; }

// Elements of the gradient buffers GradientSync allocates for `layout` on one rank: stages 0 and 1
// keep every gradient (R·S, padded); stage 2 two per-layer working blocks, the wte/wpe/lnf block
// and the rank's shard (S). Also sizes the memory plan (memory_plan.h).
struct GradientBufferCounts {
  size_t full = 0, layer_block = 0, model_block = 0, shard = 0;
  size_t total() const { return full + 2 * layer_block + model_block + shard; }
};
inline GradientBufferCounts gradient_buffer_counts(const ParameterLayout& layout, int world_size, int zero_stage) {
  GradientBufferCounts n;
  const size_t S = zero_shard_size(layout.total, static_cast<size_t>(world_size));
  if (effective_zero_stage(zero_stage, world_size) != 2) {
    n.full = S * static_cast<size_t>(world_size);
    return n;
  }
  for (int i = 0; i < kNumParameterTensors; ++i) (is_layer_tensor(i) ? n.layer_block : n.model_block) += layout.slice_count(i);
  n.shard = S;
  return n;
}

// Elements of optimizer state (AdamW moments, master weights) rank `rank` of `world_size` holds.
inline size_t optimizer_state_count(size_t P, int world_size, int zero_stage, int rank) {
  if (effective_zero_stage(zero_stage, world_size) == 0) return P;
  const size_t S = zero_shard_size(P, static_cast<size_t>(world_size));
  const size_t begin = std::min(P, static_cast<size_t>(rank) * S);
  return std::min(P, begin + S) - begin;
}

template <typename Elem>
class GradientSync {
 public:
  // Gradients of `layout`'s parameters for the backward passes queued on `stream`.
  GradientSync(const ParameterLayout& layout, Communicator* comm, int zero_stage, cudaStream_t stream)
      : layout_(layout), comm_(comm), stream_(stream) {
    if (zero_stage < 0 || zero_stage > 2)
      throw std::runtime_error("ZeRO stage: expected 0, 1 or 2, found " + std::to_string(zero_stage));
    if (comm != nullptr) {
      world_ = comm->world_size();
      rank_ = comm->rank();
    }
    zero_ = effective_zero_stage(zero_stage, world_);
    const size_t P = layout_.total;
    shard_size_ = zero_shard_size(P, world_);
    state_begin_ = zero_ == 0 ? 0 : std::min(P, rank_ * shard_size_);
    state_end_ = zero_ == 0 ? P : std::min(P, state_begin_ + shard_size_);
    const GradientBufferCounts counts = gradient_buffer_counts(layout_, world_, zero_);
    if (zero_ == 2) {
      // Working blocks: each tensor's offset within the block of its layer / of the model tensors.
      size_t layer_block = 0, model_block = 0;
      for (int i = 0; i < kNumParameterTensors; ++i) {
        size_t& block = is_layer_tensor(i) ? layer_block : model_block;
        block_offset_[i] = block;
        block += layout_.slice_count(i);
      }
      layer_block_ = layer_block;
      layer_grads_ = DeviceArray<Elem>(2 * counts.layer_block, "gradients (two per-layer working blocks)");
      model_grads_ = DeviceArray<Elem>(counts.model_block, "gradients (wte, wpe, lnf working block)");
      shard_grads_ = DeviceArray<Elem>(counts.shard, "gradients (this rank's shard)");
      for (cudaEvent_t& e : block_free_)
        cuda_check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "creating a gradient-block event");
    } else {
      grads_ = DeviceArray<Elem>(counts.full, "gradients");
    }
  }
  GradientSync(const GradientSync&) = delete;
  GradientSync& operator=(const GradientSync&) = delete;
  ~GradientSync() {
    wait_idle();
    for (cudaEvent_t e : block_free_)
      if (e != nullptr) cudaEventDestroy(e);
  }

  int zero_stage() const { return zero_; }
  int world_size() const { return world_; }
  // Elements of the padded parameter buffer (R·S).
  size_t padded_size() const { return shard_size_ * world_; }
  // This rank's optimizer shard: elements [begin, end) of the parameter buffer (all of it at stage 0).
  size_t shard_begin() const { return state_begin_; }
  size_t shard_end() const { return state_end_; }
  // The loss gradient's divisor beyond the mean over tokens and micro-steps: stage 2 sums.
  float ranks_summed() const { return zero_ == 2 ? static_cast<float>(world_) : 1.0f; }
  size_t bytes() const { return grads_.bytes() + shard_grads_.bytes() + layer_grads_.bytes() + model_grads_.bytes(); }

  // Where the backward pass accumulates tensor `tensor`'s gradient (layer `layer`'s slice of a
  // per-layer tensor; layer ignored for wte, wpe, lnf).
  Elem* at(int tensor, int layer) const {
    if (zero_ == 2)
      return is_layer_tensor(tensor) ? layer_grads_.get() + (layer % 2) * layer_block_ + block_offset_[tensor]
                                     : model_grads_.get() + block_offset_[tensor];
    return grads_.get() + layout_.slice_offset(tensor, layer);
  }
  // This rank's shard of the accumulated gradients (element 0 = parameter shard_begin()).
  const Elem* shard() const { return zero_ == 2 ? shard_grads_.get() : grads_.get() + state_begin_; }
  // All accumulated gradients, llm.c order (at stage 2 no rank holds them all: throws).
  const Elem* full() const {
    if (zero_ == 2) throw std::runtime_error("gradients(): at ZeRO stage 2 each rank holds only its gradient shard");
    return grads_.get();
  }

  void zero() {
    if (zero_ == 2) {
      cuda_check(cudaMemsetAsync(shard_grads_.get(), 0, shard_grads_.bytes(), stream_), "zeroing gradients");
      shard_holds_gradients_ = false;
      return;
    }
    cuda_check(cudaMemsetAsync(grads_.get(), 0, grads_.bytes(), stream_), "zeroing gradients");
  }

  // Hooks around one micro-step's backward pass, in this order: begin_micro_step before anything
  // writes a gradient (the lm head included), before_layer(l) and after_layer(l) around layer l's
  // backward (l = L-1 .. 0), end_micro_step after the embeddings' backward.
  void begin_micro_step(bool last_micro_step) {
    communicate_ = communicating() && (last_micro_step || zero_ == 2);
    if (zero_ != 2) return;
    comm_->order_before(stream_);  // the previous micro-step's sums into the shard are complete
    prepare_block(model_grads_.get(), model_grads_.count(), {kWte, kWpe, kLnfw, kLnfb}, 0);
  }
  void before_layer(int l) {
    if (zero_ != 2) return;
    cuda_check(cudaStreamWaitEvent(stream_, block_free_[l % 2], 0), "waiting for a gradient block");
    prepare_block(layer_grads_.get() + (l % 2) * layer_block_, layer_block_,
                  {kLn1w, kLn1b, kQkvw, kQkvb, kAttprojw, kAttprojb, kLn2w, kLn2b, kFcw, kFcb, kFcprojw, kFcprojb}, l);
  }
  // Layer l's gradients are complete once its backward is queued: its slice of every per-layer
  // tensor is sent after that backward (event), while the model's stream moves on to layer l-1.
  void after_layer(int l) {
    if (!communicate_) return;
    comm_->wait_for(stream_);
    comm_->group_start();
    for (int i = kLn1w; i <= kFcprojb; ++i) send(i, l);
    comm_->group_end();
    if (zero_ == 2)
      cuda_check(cudaEventRecord(block_free_[l % 2], comm_->stream()), "recording a gradient-block event");
  }
  // wte (lm head and embedding), wpe and lnf are complete after the encoder backward.
  void end_micro_step() {
    if (communicate_) {
      comm_->wait_for(stream_);
      comm_->group_start();
      for (int i : {kWte, kWpe, kLnfw, kLnfb}) send(i, 0);
      comm_->group_end();
    }
    communicate_ = false;
    shard_holds_gradients_ = zero_ == 2;
  }

  // Blocks until this rank's gradient and parameter communication has finished.
  void wait_idle() const {
    if (communicating()) cudaStreamSynchronize(comm_->stream());
  }
  // Orders the work queued next on the model's stream after the gradient communication.
  void wait_for_gradients() {
    if (communicating()) comm_->order_before(stream_);
  }
  // The squared norm of this rank's shard (on the device) becomes the sum over ranks' shards.
  void sum_norm_squared(float* norm_squared) {
    if (!communicating() || zero_ == 0) return;
    comm_->wait_for(stream_);
    comm_->all_reduce(norm_squared, 1, ncclSum);
    comm_->order_before(stream_);
  }
  // A device scalar becomes its sum over ranks.
  void sum_over_ranks(double* value) {
    if (!communicating()) return;
    comm_->wait_for(stream_);
    comm_->all_reduce(value, 1, ncclSum);
    comm_->order_before(stream_);
  }
  // After each rank updated its shard of `params`: every rank gets every shard.
  void gather_parameters(Elem* params) {
    if (!communicating() || zero_ == 0) return;
    comm_->wait_for(stream_);
    comm_->all_gather(params + rank_ * shard_size_, params, shard_size_);
    comm_->order_before(stream_);
  }

 private:
  bool communicating() const { return comm_ != nullptr && world_ > 1; }

  // Elements [offset, offset + n) of the parameter buffer that tensor `tensor`'s slice for
  // `layer` covers (layer ignored for wte, wpe, lnf).
  std::pair<size_t, size_t> global_range(int tensor, int layer) const {
    return {layout_.slice_offset(tensor, layer), layout_.slice_count(tensor)};
  }

  // Stage 2: makes a working block (of `elements`) ready for a backward pass to accumulate into
  // (the caller has ordered it after the block's previous communication): zeroes it and, after an
  // earlier micro-step of this optimizer step, copies this rank's accumulated shard values into its
  // own part of it.
  void prepare_block(Elem* block, size_t elements, std::initializer_list<int> tensors, int layer) {
    cuda_check(cudaMemsetAsync(block, 0, elements * sizeof(Elem), stream_), "zeroing a gradient block");
    if (!shard_holds_gradients_) return;
    for (int i : tensors) {
      const auto [offset, n] = global_range(i, layer);
      const size_t begin = std::max(offset, state_begin_), end = std::min(offset + n, state_end_);
      if (begin >= end) continue;
      cuda_check(cudaMemcpyAsync(at(i, layer) + (begin - offset), shard_grads_.get() + (begin - state_begin_),
                                 (end - begin) * sizeof(Elem), cudaMemcpyDeviceToDevice, stream_),
                 "restoring accumulated gradients");
    }
  }

  // Communicates the gradient of tensor i (layer l's slice): stage 0 averages it everywhere (in
  // place); stage 1 averages each piece onto the owner of the shard it falls in (one in-place
  // reduce per owner); stage 2 sums each piece into the owner's gradient shard.
  void send(int i, int l) {
    const auto [offset, n] = global_range(i, l);
    Elem* src = at(i, l);
    if (zero_ == 0) {
      comm_->all_reduce(src, n, ncclAvg);
      return;
    }
    for (size_t begin = offset; begin < offset + n;) {
      const size_t owner = begin / shard_size_;
      const size_t end = std::min(offset + n, (owner + 1) * shard_size_);
      Elem* piece = src + (begin - offset);
      if (zero_ == 1) comm_->reduce(piece, piece, end - begin, static_cast<int>(owner), ncclAvg);
      else comm_->reduce(piece, shard_grads_.get() + (begin - owner * shard_size_), end - begin,
                         static_cast<int>(owner), ncclSum);
      begin = end;
    }
  }

  const ParameterLayout layout_;
  Communicator* comm_;
  cudaStream_t stream_;
  int zero_ = 0, world_ = 1;
  size_t rank_ = 0;
  size_t shard_size_ = 0;                   // S
  size_t state_begin_ = 0, state_end_ = 0;  // elements whose optimizer state this rank holds
  bool communicate_ = false;                // set during a micro-step whose backward communicates
  DeviceArray<Elem> grads_;                 // stages 0 and 1: every gradient (R·S elements)
  // Stage 2 only: working blocks, the gradient shard, and whether the shard holds gradients of
  // earlier micro-steps of the current optimizer step.
  DeviceArray<Elem> layer_grads_, model_grads_, shard_grads_;
  std::array<size_t, kNumParameterTensors> block_offset_{};
  size_t layer_block_ = 0;
  cudaEvent_t block_free_[2] = {nullptr, nullptr};  // recorded on the comm stream when a layer block is sent
  bool shard_holds_gradients_ = false;
};
