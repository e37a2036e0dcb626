// upload_staging.h — the host side of each micro-batch's uploads (input and target tokens, the
// encoder-backward buckets, built here or prepared on the loader thread): the token ids checked
// against the vocabulary, and page-locked
// buffers, two sets used in turn, so the copies are truly asynchronous (a copy from pageable
// memory may wait for the stream's earlier work) and the host can prepare the next micro-batch
// while the device still reads the previous one.
#pragma once
#include "kernels/common.cuh"
#include "kernels/encoder.cuh"
#include "src/base/device.h"
#include "src/data/dataloader.h"
#include "src/data/context_split.h"

#include <algorithm>
#include <cstddef>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

// Every one of the B·T ids must index a real vocabulary row; anything else means the data was
// tokenized for another vocabulary than the model's. `what`: "input" or "target".
inline void check_token_ids(const int* tokens, int B, int seq_len, int vocab_size, const char* what) {
  if (tokens == nullptr) throw std::runtime_error(std::string(what) + " tokens: expected B*T ids, found nullptr");
  for (int p = 0; p < B * seq_len; ++p) {
    if (tokens[p] < 0 || tokens[p] >= vocab_size)
      throw std::runtime_error(std::string(what) + " token " + std::to_string(tokens[p]) + " at batch row " +
                               std::to_string(p / seq_len) + ", position " + std::to_string(p % seq_len) +
                               ": expected an id in [0, " + std::to_string(vocab_size) +
                               ") (the model's vocabulary); data and model disagree on the vocabulary");
  }
}

// A B×T micro-batch's ids checked against the vocabulary, unless `prepared`, the loader's batch they
// come from, was checked against one no larger than vocab_size.
inline void check_micro_batch_ids(const int* inputs, const int* targets, const TokenBatch* prepared, int B,
                                  int seq_len, int vocab_size) {
  if (prepared != nullptr && prepared->ids_below > 0 && prepared->ids_below <= vocab_size) return;
  check_token_ids(inputs, B, seq_len, vocab_size, "input");
  if (targets != nullptr) check_token_ids(targets, B, seq_len, vocab_size, "target");
}

// The host work a B×T micro-batch needs before its upload, for DataLoader::set_prepare (on the
// loader thread, a step ahead): the encoder-backward buckets of the rank's tokens (context_split.h:
// all of them without context parallelism) whose ids are in [vocab_begin, vocab_end) (a
// tensor-parallel rank's wte rows). Shapes captured by value.
inline std::function<void(TokenBatch&)> encoder_buckets_preparer(int B, const ContextSplit& context, int vocab_size,
                                                                 int vocab_begin, int vocab_end) {
  return [=](TokenBatch& batch) {
    const int seq_len = context.local_len();
    std::vector<int> tokens(static_cast<size_t>(B) * seq_len);
    context.select(tokens.data(), batch.inputs.data(), B);
    batch.buckets.resize(encoder_backward_buckets_bytes(B, seq_len) / sizeof(int));
    batch.bucket_segments = encoder_backward_build_buckets(batch.buckets.data(), tokens.data(), B, seq_len, vocab_size,
                                                           vocab_begin, vocab_end);
  };
}

class UploadStaging {
 public:
  // One set of page-locked host buffers.
  struct Slot {
    int* inputs;
    int* targets;
    int* buckets;
  };

  // Buffers for `tokens` input and target ids and `buckets` bucket entries, twice.
  UploadStaging(size_t tokens, size_t buckets)
      : tokens_(tokens), buckets_(buckets), memory_(2 * (2 * tokens + buckets), "allocating pinned upload buffers") {
    for (cudaEvent_t& e : copied_)
      cuda_check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "creating an upload event");
  }
  UploadStaging(const UploadStaging&) = delete;
  UploadStaging& operator=(const UploadStaging&) = delete;
  ~UploadStaging() {
    for (cudaEvent_t e : copied_)
      if (e != nullptr) cudaEventDestroy(e);
  }

  // The other set than last time, once the copies that last read it have run. They normally
  // have: a wait here means the host is two micro-batches ahead of the device, which then has
  // work queued.
  Slot next() {
    current_ ^= 1;
    if (cudaEventQuery(copied_[current_]) == cudaErrorNotReady)
      cuda_check(cudaEventSynchronize(copied_[current_]), "waiting for an upload buffer");
    int* base = memory_.get() + current_ * (2 * tokens_ + buckets_);
    return Slot{base, base + tokens_, base + 2 * tokens_};
  }
  // Copies n ids from src (nullptr: already in place) into `staged`, a buffer of next()'s set, and
  // queues their copy to the device array dst.
  void upload(int* dst, int* staged, const int* src, size_t n, cudaStream_t stream, const char* what) {
    if (src != nullptr) std::copy(src, src + n, staged);
    cuda_check(cudaMemcpyAsync(dst, staged, n * sizeof(int), cudaMemcpyHostToDevice, stream), what);
  }
  // One B×T micro-batch's uploads (its ids checked: check_micro_batch_ids), queued from the next
  // set: inputs, targets (nullptr: none) and, with device_buckets, the encoder-backward buckets of
  // ids in [vocab_begin, vocab_end) (`prepared`'s, the loader's batch they come from, when it has
  // them, else built here). Returns their segment count (encoder_backward's `segments`; 0: no buckets).
  int upload_micro_batch(const int* inputs, const int* targets, const TokenBatch* prepared, int B, int seq_len,
                         int vocab_size, int vocab_begin, int vocab_end, int* device_inputs, int* device_targets,
                         int* device_buckets, cudaStream_t stream) {
    const Slot slot = next();
    const size_t n = static_cast<size_t>(B) * seq_len;
    upload(device_inputs, slot.inputs, inputs, n, stream, "uploading input tokens");
    if (targets != nullptr) upload(device_targets, slot.targets, targets, n, stream, "uploading target tokens");
    int segments = 0;
    if (device_buckets != nullptr) {
      const bool built = prepared != nullptr && prepared->bucket_segments > 0 && prepared->buckets.size() == buckets_;
      segments = built ? prepared->bucket_segments
                       : encoder_backward_build_buckets(slot.buckets, inputs, B, seq_len, vocab_size, vocab_begin,
                                                        vocab_end);
      upload(device_buckets, slot.buckets, built ? prepared->buckets.data() : nullptr, buckets_, stream,
             "uploading encoder-gradient buckets");
    }
    queued(stream);
    return segments;
  }

  // After the copies from next()'s set were queued on `stream`.
  void queued(cudaStream_t stream) {
    cuda_check(cudaEventRecord(copied_[current_], stream), "recording an upload event");
  }

 private:
  size_t tokens_, buckets_;
  PinnedArray<int> memory_;
  cudaEvent_t copied_[2] = {nullptr, nullptr};
  int current_ = 1;
};
