// model_parameters.h — where the model's parameters live and how its kernels reach them: every
// parameter in llm.c order (ZeRO 0–2), or at ZeRO 3 this rank's shard with each bucket gathered
// into a window around the layers that read it (src/dist/param_shards.h); and, for bf16, the fp32
// master weights of the parameters this rank updates (in its optimizer-state order). The forward
// and backward passes call the pass hooks either way; without a shard they do nothing.
// With tensor parallelism the rank holds its part of each tensor (tensor_split.h) in its own
// layout; values come in and go out in the whole model's llm.c order: split on upload, gathered
// over the TP group (one all-gather per tensor slice) for copies, files and host floats. A
// pipeline rank holds its stage's part (tensor_split.h's StagePart); the stages' parts are then
// gathered over the pipeline group too (one all-gather of each stage's packed tensors).
#pragma once
#include "src/base/device.h"
#include "src/config/model_config.h"
#include "src/dist/comm.h"
#include "src/dist/grad_buckets.h"
#include "src/dist/grad_sync.h"
#include "src/dist/param_shards.h"
#include "src/dist/tensor_split.h"
#include "src/model/model_file.h"

#include <algorithm>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

template <typename Elem>
class ModelParameters {
 public:
  // The parameters of `split`'s local layout (this TP rank's part; all of them without tensor
  // parallelism) for a run whose gradients `grads` keeps (its ZeRO stage and ownership), read on
  // `stream`; at ZeRO 3, `prefetch` buckets gathered ahead over `comm`; `tp_comm`, `ep_comm`: the
  // TP and EP groups (nullptr: none); `with_master`: fp32 master weights too. Start at zero.
  ModelParameters(const TensorSplit& split, const GradientSync<Elem>& grads, Communicator* comm, Communicator* tp_comm,
                  Communicator* ep_comm, const PipelineParts& pipeline, int prefetch, bool with_master,
                  cudaStream_t stream)
      : split_(split), layout_(split.local()), segments_(grads.segments()), tp_comm_(tp_comm), ep_comm_(ep_comm),
        pipeline_(pipeline), stream_(stream) {
    const ParameterLayout& layout = layout_;
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

  // Tensor i from the whole tensor's float values (rounded to nearest for bf16; this TP rank's
  // part; at ZeRO 3 only this rank's owned elements of it); the master weights of the elements
  // this rank updates get the float values.
  void upload_tensor(int i, const std::vector<float>& whole) {
    const ParameterInfo& whole_tensor = split_.global()[i];
    if (whole.size() != whole_tensor.count)
      throw std::runtime_error(std::string("parameter tensor ") + whole_tensor.name + ": expected " +
                               std::to_string(whole_tensor.count) + " values, found " + std::to_string(whole.size()));
    const std::vector<float> part = !split_.whole() ? split_.split(i, whole.data()) : std::vector<float>();
    const std::vector<float>& values = !split_.whole() ? part : whole;
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
  // Every tensor from the whole model's float values in llm.c order (upload_tensor).
  void upload_all(const std::vector<float>& values) {
    const ParameterLayout& whole = split_.global();
    if (values.size() != whole.total)
      throw std::runtime_error("set_parameters: expected " + std::to_string(whole.total) + " values, found " +
                               std::to_string(values.size()));
    for (int i = 0; i < kNumParameterTensors; ++i) {
      const float* first = values.data() + whole[i].offset;
      upload_tensor(i, std::vector<float>(first, first + whole[i].count));
    }
  }
  // The parameters changed (an update or an upload, queued on the stream): gathered windows are stale.
  void changed() {
    if (sharded_) sharded_->invalidate();
  }

  // Every parameter of the whole model in llm.c order into `dst` (`kind` of cudaMemcpy; nullptr:
  // take part only). At ZeRO 3 or with tensor or pipeline parallelism a collective that every rank
  // calls; const because the parameters stay as they are (the windows it refills are a cache of them).
  void copy_all(Elem* dst, cudaMemcpyKind kind) const {
    if (!split_.whole()) {
      const std::vector<Elem> whole = gather_pipeline(gather_tensor_parallel());
      if (dst == nullptr) return;
      // On the stream the parameters' readers use, and complete before `whole` goes.
      const cudaMemcpyKind from_host = kind == cudaMemcpyDeviceToHost ? cudaMemcpyHostToHost : cudaMemcpyHostToDevice;
      cuda_check(cudaMemcpyAsync(dst, whole.data(), whole.size() * sizeof(Elem), from_host, stream_),
                 "copying parameters");
      cuda_check(cudaStreamSynchronize(stream_), "copying parameters");
    } else if (sharded_) {
      sharded_->gather_all(dst, kind);
    } else if (dst != nullptr) {
      cuda_check(cudaMemcpyAsync(dst, full_.get(), full_.bytes(), kind, stream_), "copying parameters");
      cuda_check(cudaStreamSynchronize(stream_), "copying parameters");
    }
  }
  // An llm.c model file of `file_dtype` values (model_file.h), written by `writer` ranks (at ZeRO 3
  // a collective: the parameters are gathered into the writers' host memory).
  void save(const std::string& path, const ModelConfig& cfg, DType file_dtype, bool writer) const {
    if (!sharded_ && split_.whole()) {
      if (writer) write_model_file(path, cfg, full_.get(), file_dtype, stream_);
      return;
    }
    std::vector<Elem> host(writer ? split_.global().total : 0);
    copy_all(writer ? host.data() : nullptr, cudaMemcpyDeviceToHost);
    if (writer) write_model_file(path, cfg, host, file_dtype);
  }
  // Host copies as float, llm.c order (at ZeRO 3 a collective).
  std::vector<float> host_floats() const {
    std::vector<Elem> raw(split_.global().total);
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
  // The whole model's parameters in llm.c order on the host, where this pipeline stage holds them
  // (zero elsewhere): this rank's part (at ZeRO 3 gathered over the data-parallel group), then
  // every part of its split group's ranks (the EP group's for the experts, the TP group's for the
  // rest), one tensor slice at a time, through a device buffer of (ranks × slice) elements
  // all-gathered in place on that group's communicator.
  std::vector<Elem> gather_tensor_parallel() const {
    std::vector<Elem> part(layout_.total);
    if (sharded_) {
      sharded_->gather_all(part.data(), cudaMemcpyDeviceToHost);
    } else {  // after the update queued on the model's stream
      cuda_check(cudaMemcpyAsync(part.data(), full_.get(), full_.bytes(), cudaMemcpyDeviceToHost, stream_),
                 "copying parameters");
      cuda_check(cudaStreamSynchronize(stream_), "copying parameters");
    }
    size_t largest = 0;
    for (int i = 0; i < kNumParameterTensors; ++i)
      largest = std::max(largest, layout_.slice_count(i) * split_.group_size(i));
    DeviceArray<Elem> staging(largest, "gathering the tensor- and expert-parallel parts of the parameters");
    std::vector<Elem> gathered(largest), whole(split_.global().total);
    for (int i = 0; i < kNumParameterTensors; ++i) {
      const size_t n = layout_.slice_count(i), layers = is_layer_tensor(i) ? layout_.num_layers : 1;
      const int ranks = split_.group_size(i);
      Communicator* group = split_.ep_splits(i) ? ep_comm_ : tp_comm_;
      std::vector<TensorSplit> splits;
      for (int r = 0; r < ranks; ++r) splits.push_back(split_.of_group_rank(i, r));
      for (size_t l = 0; l < layers; ++l) {
        Elem* mine = staging.get() + split_.group_rank(i) * n;
        cuda_check(cudaMemcpyAsync(mine, part.data() + layout_.slice_offset(i, l), n * sizeof(Elem),
                                   cudaMemcpyHostToDevice, stream_), "staging parameters");
        if (ranks > 1) group->ordered_with(stream_, [&] { group->all_gather(mine, staging.get(), n); });
        cuda_check(cudaMemcpyAsync(gathered.data(), staging.get(), n * ranks * sizeof(Elem), cudaMemcpyDeviceToHost,
                                   stream_), "gathering parameters");
        cuda_check(cudaStreamSynchronize(stream_), "gathering parameters");
        const int global_layer = is_layer_tensor(i) ? split_.global_layer(static_cast<int>(l)) : 0;
        for (int r = 0; r < ranks; ++r)
          splits[r].place_slice(i, gathered.data() + r * n, whole.data() + split_.global().slice_offset(i, global_layer));
      }
    }
    return whole;
  }

  // The stages' parameters (each stage's place in `whole` filled, as gather_tensor_parallel leaves
  // it) gathered over the pipeline group: each stage packs the slices it holds in llm.c order
  // (wte from the first stage alone: the last stage's tied copy is identical), the packs, padded to
  // the largest, are all-gathered, and every stage's is unpacked into place.
  std::vector<Elem> gather_pipeline(std::vector<Elem> whole) const {
    if (pipeline_.comm == nullptr) return whole;
    const ParameterLayout& g = split_.global();
    // f(offset in whole, count) for each slice stage r contributes, in packing order.
    auto for_each_slice = [&](int r, auto&& f) {
      const StagePart& part = pipeline_.stages[r];
      for (int i = 0; i < kNumParameterTensors; ++i) {
        if (g[i].count == 0 || !stage_holds(split_.global_config(), part, i)) continue;
        if (i == kWte && !part.embedding) continue;
        if (!is_layer_tensor(i)) f(g[i].offset, g[i].count);
        else for (int l : part.layers) f(g.slice_offset(i, l), g.slice_count(i));
      }
    };
    std::vector<size_t> packed(pipeline_.size(), 0);
    for (int r = 0; r < pipeline_.size(); ++r) for_each_slice(r, [&](size_t, size_t n) { packed[r] += n; });
    const size_t largest = *std::max_element(packed.begin(), packed.end());
    std::vector<Elem> mine(largest);
    size_t at = 0;
    for_each_slice(pipeline_.rank, [&](size_t offset, size_t n) {
      std::copy(whole.begin() + offset, whole.begin() + offset + n, mine.begin() + at);
      at += n;
    });
    Communicator& pp = *pipeline_.comm;
    DeviceArray<Elem> staging(largest * pipeline_.size(), "gathering the pipeline stages' parameters");
    Elem* own = staging.get() + pipeline_.rank * largest;
    cuda_check(cudaMemcpyAsync(own, mine.data(), largest * sizeof(Elem), cudaMemcpyHostToDevice, stream_),
               "staging parameters");
    pp.ordered_with(stream_, [&] { pp.all_gather(own, staging.get(), largest); });
    std::vector<Elem> all(largest * pipeline_.size());
    cuda_check(cudaMemcpyAsync(all.data(), staging.get(), all.size() * sizeof(Elem), cudaMemcpyDeviceToHost, stream_),
               "gathering parameters");
    cuda_check(cudaStreamSynchronize(stream_), "gathering parameters");
    for (int r = 0; r < pipeline_.size(); ++r) {
      at = r * largest;
      for_each_slice(r, [&](size_t offset, size_t n) {
        std::copy(all.begin() + at, all.begin() + at + n, whole.begin() + offset);
        at += n;
      });
    }
    return whole;
  }

  const TensorSplit split_;
  const ParameterLayout layout_;
  const std::vector<OptimizerSegment> segments_;  // this rank's: the elements it updates
  Communicator* tp_comm_;
  Communicator* ep_comm_;
  const PipelineParts pipeline_;
  cudaStream_t stream_;
  DeviceArray<Elem> full_;                            // ZeRO 0–2
  std::unique_ptr<ShardedParameters<Elem>> sharded_;  // ZeRO 3
  DeviceArray<float> master_;
};
