// optimizer.h — AdamW over the model's parameter buffer: its settings, gradient clipping, and the
// update of the parameters one rank owns, segment by segment.
#pragma once
#include "kernels/adamw.cuh"
#include "src/config/gpt2_config.h"
#include "src/dist/grad_buckets.h"
#include "src/base/rng.h"

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

struct OptimizerSettings {
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.0f, grad_clip = 1.0f;  // grad_clip 0: off
  uint64_t seed = 0;  // stochastic rounding of bf16 parameters
};

// One AdamW step (step is 1-based) of the parameters of `segments` (grad_buckets.h) in `params`
// (llm.c order), from their gradients (at grads + gradient_offset(segment)) and this rank's
// optimizer state (adam_m, adam_v, and for bf16 the fp32 master weights, at segment.state; nullptr
// for fp32 parameters, which are updated themselves). When grad_clip > 0 and grad_norm exceeds
// it, the gradients enter scaled by grad_clip / grad_norm. Weight decay applies to the 2-D weights
// only (ParameterInfo::decayed); bf16 parameters are stored stochastically rounded with the seed
// adamw_rounding_seed(opt.seed, step, tensor) and the element's index within its tensor, so a
// sharded update gives the bits of an unsharded one.
template <typename Elem, typename GradientOffset>
void adamw_step(const OptimizerSettings& opt, float lr, int step, float grad_norm, const ParameterLayout& layout,
                const std::vector<OptimizerSegment>& segments, Elem* params, float* master, const Elem* grads,
                GradientOffset gradient_offset, float* adam_m, float* adam_v, cudaStream_t stream) {
  if (step < 1) throw std::runtime_error("optimizer step: expected step >= 1, found " + std::to_string(step));
  const float grad_scale =
      (opt.grad_clip > 0.0f && grad_norm > opt.grad_clip) ? opt.grad_clip / grad_norm : 1.0f;
  for (const OptimizerSegment& s : segments) {
    const ParameterInfo& t = layout[s.tensor];
    adamw_update(params + s.param, master != nullptr ? master + s.state : nullptr, grads + gradient_offset(s),
                 adam_m + s.state, adam_v + s.state, s.count, lr, opt.beta1, opt.beta2, opt.eps,
                 t.decayed ? opt.weight_decay : 0.0f, grad_scale, step, adamw_rounding_seed(opt.seed, step, s.tensor),
                 s.param - t.offset, stream);
  }
}
