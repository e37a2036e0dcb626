// optimizer.h — AdamW over the model's parameter buffer: its settings, gradient clipping, and the
// update of one rank's shard of the parameters, tensor piece by tensor piece.
#pragma once
#include "../kernels/adamw.cuh"
#include "gpt2_config.h"
#include "rng.h"

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

struct OptimizerSettings {
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.0f, grad_clip = 1.0f;  // grad_clip 0: off
  uint64_t seed = 0;  // stochastic rounding of bf16 parameters
};

// One AdamW step (step is 1-based) of parameters [shard_begin, shard_end) of `layout`'s buffer,
// from the gradients of that shard (shard_grads, element 0 = parameter shard_begin) and the
// optimizer state of that shard (adam_m, adam_v, and for bf16 the fp32 master weights; nullptr
// for fp32 parameters, which are updated themselves). When grad_clip > 0 and grad_norm exceeds
// it, the gradients enter scaled by grad_clip / grad_norm. Weight decay applies to the 2-D weights
// only (ParameterInfo::decayed); bf16 parameters are stored stochastically rounded with the seed
// adamw_rounding_seed(opt.seed, step, tensor) and the element's index within its tensor, so a
// sharded update gives the bits of an unsharded one.
template <typename Elem>
void adamw_step(const OptimizerSettings& opt, float lr, int step, float grad_norm, const ParameterLayout& layout,
                size_t shard_begin, size_t shard_end, Elem* params, float* master, const Elem* shard_grads,
                float* adam_m, float* adam_v, cudaStream_t stream) {
  if (step < 1) throw std::runtime_error("optimizer step: expected step >= 1, found " + std::to_string(step));
  const float grad_scale =
      (opt.grad_clip > 0.0f && grad_norm > opt.grad_clip) ? opt.grad_clip / grad_norm : 1.0f;
  for (int i = 0; i < kNumParameterTensors; ++i) {
    const ParameterInfo& t = layout[i];
    const size_t begin = std::max(t.offset, shard_begin), end = std::min(t.offset + t.count, shard_end);
    if (begin >= end) continue;
    const size_t state = begin - shard_begin;  // index into this rank's optimizer state
    adamw_update(params + begin, master != nullptr ? master + state : nullptr, shard_grads + state, adam_m + state,
                 adam_v + state, end - begin, lr, opt.beta1, opt.beta2, opt.eps, t.decayed ? opt.weight_decay : 0.0f,
                 grad_scale, step, adamw_rounding_seed(opt.seed, step, i), begin - t.offset, stream);
  }
}
