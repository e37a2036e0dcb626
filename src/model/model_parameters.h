// model_parameters.h — where the model's parameters live and how its kernels reach them: every
// parameter in llm.c order (ZeRO 0–2), or at ZeRO 3 this rank's shard with each bucket gathered
// into a window around the layers that read it (src/dist/param_shards.h); and, for bf16, the fp32
// master weights of the parameters this rank updates (in its optimizer-state order). The forward
// and backward passes call the pass hooks either way; without a shard they do nothing.
#pragma once
#include "src/base/device.h"
#include "src/config/gpt2_config.h"
#include "src/dist/comm.h"
#include "src/dist/grad_buckets.h"
#include "src/dist/grad_sync.h"
#include "src/dist/param_shards.h"
#include "src/model/model_file.h"

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

template <typename Elem>
class ModelParameters {
 public:
  // The parameters of `layout` for a run whose gradients `grads` keeps (its ZeRO stage and
  // ownership), read on `stream`; at ZeRO 3, `prefetch` buckets gathered ahead; `with_master`:
  // fp32 master weights too. Start at zero.
  ModelParameters(const ParameterLayout& layout, const GradientSync<Elem>& grads, Communicator* comm, int prefetch,
                  bool with_master, cudaStream_t stream)
      : layout_(layout), segments_(grads.segments()), stream_(stream) {
    if (with_master) {
      master_ = DeviceArray<float>(grads.state_count(), "fp32 master weights");
      cuda_check(cudaMemset(master_.get(), 0, master_.bytes()), "zeroing master weights");
    }
    if (grads.zero_stage() == 3) {
      sharded_ = std::make_unique<ShardedParameters<Elem>>(layout, grads.buckets(), comm, prefetch, stream);
    } else {
      full_ = DeviceArray<Elem>(layout.total, "parameters");
      cuda_check(cudaMemset(full_.get(), 0, full_.bytes()), "zeroing parameters");
    }
  }

  bool sharded() const { return sharded_ != nullptr; }
  size_t bytes() const { return (sharded_ ? sharded_->bytes() : full_.bytes()) + master_.bytes(); }
  // Every parameter in llm.c order on the device (nullptr at ZeRO 3, where no rank holds them all).
  Elem* full() const { return full_.get(); }
  // The fp32 master weights in optimizer-state order (nullptr without).
  float* master() const { return master_.get(); }

  // Tensor `tensor`'s parameters (layer `layer`'s slice of a per-layer tensor) for a kernel.
  const Elem* at(int tensor, int layer = 0) const {
    return sharded_ ? sharded_->at(tensor, layer) : full_.get() + layout_.slice_offset(tensor, layer);
  }
  // The parameters the optimizer updates: owned(s) for segment s (grad_buckets.h).
  Elem* owned(const OptimizerSegment& s) const { return owned_base() + owned_offset(s); }
  Elem* owned_base() const { return sharded_ ? sharded_->shard() : full_.get(); }
  size_t owned_offset(const OptimizerSegment& s) const {
    return sharded_ ? sharded_->shard_offset(s) : s.param;
  }

  // Tensor i from float values (rounded to nearest for bf16; at ZeRO 3 only this rank's owned
  // elements of it); the master weights of the elements this rank updates get the float values.
  void upload_tensor(int i, const std::vector<float>& values) {
    const ParameterInfo& t = layout_[i];
    const std::string what = std::string("parameter tensor ") + t.name;
    if (!sharded_) upload_floats(full_.get() + t.offset, values, what);
    for (const OptimizerSegment& s : segments_) {
      if (s.tensor != i) continue;
      const float* first = values.data() + (s.param - t.offset);
      if (sharded_) upload_floats(owned(s), std::vector<float>(first, first + s.count), what);
      if (master_.get() != nullptr)
        cuda_check(cudaMemcpy(master_.get() + s.state, first, s.count * sizeof(float), cudaMemcpyHostToDevice),
                   ("uploading master weights of " + std::string(t.name)).c_str());
    }
    changed();
  }
  // Every tensor from float values in llm.c order (upload_tensor).
  void upload_all(const std::vector<float>& values) {
    if (values.size() != layout_.total)
      throw std::runtime_error("set_parameters: expected " + std::to_string(layout_.total) + " values, found " +
                               std::to_string(values.size()));
    for (int i = 0; i < kNumParameterTensors; ++i) {
      const float* first = values.data() + layout_[i].offset;
      upload_tensor(i, std::vector<float>(first, first + layout_[i].count));
    }
  }
  // The parameters changed (an update or an upload, queued on the stream): gathered windows are stale.
  void changed() {
    if (sharded_) sharded_->invalidate();
  }

  // Every parameter in llm.c order into `dst` (`kind` of cudaMemcpy; nullptr: take part only). At
  // ZeRO 3 a collective that every rank calls; const because the parameters stay as they are (the
  // windows it refills are a cache of them).
  void copy_all(Elem* dst, cudaMemcpyKind kind) const {
    if (sharded_) {
      sharded_->gather_all(dst, kind);
    } else if (dst != nullptr) {
      cuda_check(cudaMemcpyAsync(dst, full_.get(), full_.bytes(), kind, stream_), "copying parameters");
      cuda_check(cudaStreamSynchronize(stream_), "copying parameters");
    }
  }
  // An llm.c model file of `file_dtype` values (model_file.h), written by `writer` ranks (at ZeRO 3
  // a collective: the parameters are gathered into the writers' host memory).
  void save(const std::string& path, const GPT2Config& cfg, DType file_dtype, bool writer) const {
    if (!sharded_) {
      if (writer) write_model_file(path, cfg, full_.get(), file_dtype, stream_);
      return;
    }
    std::vector<Elem> host(writer ? layout_.total : 0);
    copy_all(writer ? host.data() : nullptr, cudaMemcpyDeviceToHost);
    if (writer) write_model_file(path, cfg, host, file_dtype);
  }
  // Host copies as float, llm.c order (at ZeRO 3 a collective).
  std::vector<float> host_floats() const {
    std::vector<Elem> raw(layout_.total);
    copy_all(raw.data(), cudaMemcpyDeviceToHost);
    std::vector<float> values(raw.size());
    for (size_t k = 0; k < raw.size(); ++k) values[k] = host_to_float(raw[k]);
    return values;
  }

  // Pass hooks (param_shards.h): wte/wpe/lnf before the embedding, lnf or the lm head read them;
  // begin_pass before a pass over the layers, enter_layer(l) / leave_layer(l) around layer l.
  void use_model_bucket() {
    if (sharded_) sharded_->use_model_bucket();
  }
  void begin_pass(bool forward) {
    if (sharded_) sharded_->begin_pass(forward);
  }
  void enter_layer(int l) {
    if (sharded_) sharded_->enter_layer(l);
  }
  void leave_layer(int l) {
    if (sharded_) sharded_->leave_layer(l);
  }

 private:
  const ParameterLayout layout_;
  const std::vector<OptimizerSegment> segments_;  // this rank's: the elements it updates
  cudaStream_t stream_;
  DeviceArray<Elem> full_;                            // ZeRO 0–2
  std::unique_ptr<ShardedParameters<Elem>> sharded_;  // ZeRO 3
  DeviceArray<float> master_;
};
