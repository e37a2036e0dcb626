// param_shards.h — ZeRO 3's parameters: each rank keeps only its chunk of every bucket (the
// elements it owns for the optimizer, grad_buckets.h), and a pass reads each bucket's full
// parameters from a gather window that an all-gather fills just before the bucket's layers run.
//
// Windows: `prefetch + 1` layer-bucket windows (bucket b uses window b mod (prefetch + 1)) and one
// for the wte/wpe/lnf bucket. A pass walks the layer buckets in its order (forward: the lowest
// layers first; backward: the top first) and keeps `prefetch` buckets in flight ahead of the one
// computing: a bucket's window is refilled only after the model's stream recorded that the
// bucket's layers are done with it (an event the communication stream waits for), and the model's
// stream reads a window only after its gather (an event the other way).
//
// Why windows remember what they hold: parameters change only in the optimizer step, so a bucket
// still in a window from the previous pass is not gathered again. The last `prefetch + 1` buckets
// of a forward are the first of the backward (and the reverse for the next micro-step's forward),
// so a pass gathers (layer buckets − prefetch − 1) buckets once the previous pass filled the
// windows; the wte/wpe/lnf bucket (the embedding and the lm head: first in the forward and first
// in the backward) stays in its window from the first pass after an update to the next update,
// one gather per optimizer step.
#pragma once
#include "src/base/device.h"
#include "src/config/model_config.h"
#include "src/dist/comm.h"
#include "src/dist/grad_buckets.h"

#include <stdexcept>
#include <string>
#include <vector>

// Elements of the ZeRO 3 parameter buffers of one rank: its shard and the gather windows.
struct ParameterShardCounts {
  size_t shard = 0, layer_window = 0, layer_windows = 0, model_window = 0;
  size_t total() const { return shard + layer_windows * layer_window + model_window; }
};
inline ParameterShardCounts parameter_shard_counts(const GradientBuckets& buckets, int prefetch) {
  ParameterShardCounts n;
  n.shard = buckets.shard_elements();
  n.layer_window = buckets.largest_layer_bucket();
  n.layer_windows = static_cast<size_t>(prefetch) + 1;
  n.model_window = buckets.model_bucket().chunk * static_cast<size_t>(buckets.ranks());
  return n;
}

template <typename Elem>
class ShardedParameters {
 public:
  // The shard of `buckets` (chunked for every rank of `comm`) this rank owns, read on `stream`
  // through prefetch + 1 layer windows. Starts at zero.
  ShardedParameters(const ParameterLayout& layout, const GradientBuckets& buckets, Communicator* comm, int prefetch,
                    cudaStream_t stream)
      : layout_(layout), buckets_(buckets), comm_(comm), prefetch_(prefetch), stream_(stream) {
    if (prefetch < 1 || prefetch > kMaxZero3Prefetch)
      throw std::runtime_error("--zero3-prefetch: expected 1.." + std::to_string(kMaxZero3Prefetch) + ", found " +
                               std::to_string(prefetch));
    const ParameterShardCounts counts = parameter_shard_counts(buckets_, prefetch);
    shard_ = DeviceArray<Elem>(counts.shard, "parameters (this rank's shard)");
    cuda_check(cudaMemset(shard_.get(), 0, shard_.bytes()), "zeroing parameters");
    // One allocation per window: the CPU build's stream checker orders accesses by allocation.
    slots_.resize(counts.layer_windows + 1);
    for (size_t w = 0; w < slots_.size(); ++w) {
      const bool model = w == counts.layer_windows;
      slots_[w].window = DeviceArray<Elem>(model ? counts.model_window : counts.layer_window,
                                           model ? "parameters (wte, wpe, lnf gather window)"
                                                 : "parameters (one of the layer-bucket gather windows)");
      cuda_check(cudaEventCreateWithFlags(&slots_[w].gathered, cudaEventDisableTiming), "creating a gather event");
      cuda_check(cudaEventCreateWithFlags(&slots_[w].released, cudaEventDisableTiming), "creating a gather event");
    }
  }
  ShardedParameters(const ShardedParameters&) = delete;
  ShardedParameters& operator=(const ShardedParameters&) = delete;
  ~ShardedParameters() {
    cudaStreamSynchronize(comm_->stream());
    for (Slot& s : slots_) {
      cudaEventDestroy(s.gathered);
      cudaEventDestroy(s.released);
    }
  }

  Elem* shard() const { return shard_.get(); }
  size_t bytes() const {
    size_t sum = shard_.bytes();
    for (const Slot& s : slots_) sum += s.window.bytes();
    return sum;
  }
  // Where this rank's owned segment s is in the shard.
  size_t shard_offset(const OptimizerSegment& s) const { return buckets_.shard_offset(s, comm_->rank()); }

  // Tensor `tensor`'s parameters (layer `layer`'s slice) in its bucket's window: valid between
  // enter_layer and leave_layer of that layer (wte, wpe, lnf: after use_model_bucket).
  const Elem* at(int tensor, int layer) const {
    const size_t b = bucket_of(tensor, layer);
    return slot_of(b).window.get() + buckets_.piece_at(tensor, layer);
  }

  // The parameters changed on `stream_` (an update, a load): every window is stale, and gathers
  // from now on read the shard after that change.
  void invalidate() {
    comm_->wait_for(stream_);
    for (Slot& s : slots_) s.held = kNone;
  }

  // The wte/wpe/lnf bucket, for the embedding, lnf and the lm head (gathered once per update).
  void use_model_bucket() { use(model_bucket()); }

  // A pass over the layers: forward (layer 0 up) or backward (top down). begin_pass starts the
  // first buckets' gathers; enter_layer(l) before layer l's first kernel (the forward enters
  // layer l + 1 before its fused residual LayerNorm ends layer l), leave_layer(l) after its last.
  void begin_pass(bool forward) {
    forward_ = forward;
    const size_t layer_buckets = model_bucket();
    for (size_t k = 0; k < layer_buckets && k <= static_cast<size_t>(prefetch_); ++k)
      ensure_gathered(forward_ ? layer_buckets - 1 - k : k);
  }
  void enter_layer(int l) {
    const GradientBucket& b = buckets_.buckets()[buckets_.bucket_of_layer(l)];
    if (l == (forward_ ? b.bottom_layer : b.top_layer)) use(buckets_.bucket_of_layer(l));
  }
  void leave_layer(int l) {
    const size_t bi = buckets_.bucket_of_layer(l);
    const GradientBucket& b = buckets_.buckets()[bi];
    if (l != (forward_ ? b.top_layer : b.bottom_layer)) return;
    cuda_check(cudaEventRecord(slot_of(bi).released, stream_), "recording a gather window's release");
    slot_of(bi).released_recorded = true;
    // The window just released takes the bucket prefetch + 1 places later in this pass (the forward
    // walks the layer buckets from the last down to 0, the backward from 0 up).
    const size_t ahead = static_cast<size_t>(prefetch_) + 1;
    if (forward_ ? bi >= ahead : bi + ahead < model_bucket()) ensure_gathered(forward_ ? bi - ahead : bi + ahead);
  }

  // Every parameter in llm.c order into `dst` (device or host memory, `kind` of cudaMemcpy; nullptr:
  // this rank only takes part), bucket by bucket through the windows. A collective: every rank
  // calls it, outside a pass. Waits for the copies.
  void gather_all(Elem* dst, cudaMemcpyKind kind) {
    for (size_t b = 0; b < buckets_.buckets().size(); ++b) {
      use(b);
      if (dst != nullptr)
        for (const GradientPiece& p : buckets_.buckets()[b].pieces)
          cuda_check(cudaMemcpyAsync(dst + layout_.slice_offset(p.tensor, p.layer), slot_of(b).window.get() + p.at,
                                     p.count * sizeof(Elem), kind, stream_),
                     "copying gathered parameters");
      if (b != model_bucket()) {
        cuda_check(cudaEventRecord(slot_of(b).released, stream_), "recording a gather window's release");
        slot_of(b).released_recorded = true;
      }
    }
    cuda_check(cudaStreamSynchronize(stream_), "gathering the parameters");
  }

 private:
  static constexpr size_t kNone = static_cast<size_t>(-1);
  struct Slot {
    DeviceArray<Elem> window;
    size_t held = kNone;             // the bucket whose parameters it holds (once `gathered` completes)
    cudaEvent_t gathered = nullptr;  // on the communication stream, after the all-gather
    cudaEvent_t released = nullptr;  // on the model's stream, after the last kernel that read it
    bool released_recorded = false;
  };

  // The wte/wpe/lnf bucket, last; its index is also the number of layer buckets.
  size_t model_bucket() const { return buckets_.buckets().size() - 1; }
  size_t bucket_of(int tensor, int layer) const {
    return is_layer_tensor(tensor) ? buckets_.bucket_of_layer(layer) : model_bucket();
  }
  Slot& slot_of(size_t b) { return const_cast<Slot&>(static_cast<const ShardedParameters*>(this)->slot_of(b)); }
  const Slot& slot_of(size_t b) const {
    return b == model_bucket() ? slots_.back() : slots_[b % static_cast<size_t>(prefetch_ + 1)];
  }
  // Bucket b's window holds it or its all-gather is queued (on the communication stream, after
  // the window's last readers).
  void ensure_gathered(size_t b) {
    Slot& s = slot_of(b);
    if (s.held == b) return;
    const GradientBucket& bucket = buckets_.buckets()[b];
    cudaStream_t comm_stream = comm_->stream();
    if (s.released_recorded)
      cuda_check(cudaStreamWaitEvent(comm_stream, s.released, 0), "waiting for a gather window's readers");
    comm_->all_gather(shard_.get() + bucket.shard_offset, s.window.get(), bucket.chunk);
    cuda_check(cudaEventRecord(s.gathered, comm_stream), "recording a parameter gather");
    s.held = b;
  }
  // The model's stream reads bucket b's window from here on.
  void use(size_t b) {
    ensure_gathered(b);
    cuda_check(cudaStreamWaitEvent(stream_, slot_of(b).gathered, 0), "waiting for a parameter gather");
  }

  const ParameterLayout layout_;
  const GradientBuckets buckets_;
  Communicator* comm_;
  const int prefetch_;
  cudaStream_t stream_;
  DeviceArray<Elem> shard_;
  std::vector<Slot> slots_;  // the layer windows, then the wte/wpe/lnf window
  bool forward_ = true;      // the current pass's direction
};
