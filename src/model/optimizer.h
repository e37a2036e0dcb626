// optimizer.h — AdamW over the model's parameter buffer: its settings (from the flags), gradient
// clipping, and the update of the parameters one rank owns, segment by segment.
#pragma once
#include "kernels/adamw.cuh"
#include "src/config/config.h"
#include "src/config/model_config.h"
#include "src/dist/grad_buckets.h"
#include "src/base/device.h"
#include "src/base/rng.h"

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

struct OptimizerSettings {
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.0f, grad_clip = 1.0f;  // grad_clip 0: off
  uint64_t seed = 0;  // stochastic rounding of bf16 parameters
  float expert_bias_rate = 0.0f;  // the sigmoid router's balancing step after AdamW (expert_bias.h)
};

// A run's settings from its flags; `seed` the run's (a checkpoint's when resuming).
inline OptimizerSettings optimizer_settings(const TrainConfig& cfg, uint64_t seed) {
  OptimizerSettings opt;
  opt.beta1 = static_cast<float>(cfg.beta1);
  opt.beta2 = static_cast<float>(cfg.beta2);
  opt.eps = static_cast<float>(cfg.adam_eps);
  opt.weight_decay = static_cast<float>(cfg.weight_decay);
  opt.grad_clip = static_cast<float>(cfg.grad_clip);
  opt.seed = seed;
  opt.expert_bias_rate = static_cast<float>(cfg.moe_bias_rate);
  return opt;
}

// The AdamW update of the parameters one rank owns: its `segments` (grad_buckets.h) as one table
// (kernels/adamw.cuh), built and uploaded once for the model's buffers, so each optimizer step is
// one launch. Parameters are at params + param_offset(segment) (llm.c order, or ZeRO 3's shard),
// gradients at grads + gradient_offset(segment),
// this rank's optimizer state (m, v, and for bf16 the fp32 master weights; nullptr for fp32
// parameters, which are updated themselves) at segment.state.
// The number tensor i's rounding seed is drawn for: GPT-2's 16 tensors keep the numbers they had
// before Llama's fc2w and lm_head joined the layout (so GPT-2's bf16 updates keep their bits),
// fc2w and lm_head come after them (16, 17), and the experts' router and expert_bias after those.
inline int rounding_stream(int tensor) {
  switch (tensor) {
    case kFcw: return 10;
    case kFcb: return 11;
    case kFcprojw: return 12;
    case kFcprojb: return 13;
    case kLnfw: return 14;
    case kLnfb: return 15;
    case kFc2w: return 16;
    case kLmHead: return 17;
    case kRouterw: return 18;
    case kExpertBias: return 19;
    default: return tensor;  // wte .. ln2b: 0 .. 9
  }
}

template <typename Elem>
class AdamWUpdate {
  static_assert(kNumParameterTensors <= kAdamWMaxTensors, "AdamWSeeds holds one seed per parameter tensor");

 public:
  // Device bytes of the table of `segments` rows (memory_plan.h).
  static size_t table_bytes(size_t segments) { return segments * sizeof(AdamWSegment); }

  template <typename ParamOffset, typename GradientOffset>
  AdamWUpdate(const ParameterLayout& layout, const std::vector<OptimizerSegment>& segments, ParamOffset param_offset,
              GradientOffset gradient_offset, Elem* params, float* master, const Elem* grads, float* adam_m,
              float* adam_v)
      : params_(params), master_(master), grads_(grads), m_(adam_m), v_(adam_v) {
    std::vector<AdamWSegment> table;
    for (const OptimizerSegment& s : segments) {
      const ParameterInfo& t = layout[s.tensor];
      AdamWSegment row{};
      row.param = param_offset(s);
      row.grad = gradient_offset(s);
      row.state = s.state;
      row.count = s.count;
      row.index = s.param - t.offset;
      row.tensor = s.tensor;
      row.decayed = t.decayed ? 1 : 0;
      table.push_back(row);
    }
    plan_ = adamw_plan_segments(table, params, master, grads, adam_m, adam_v);
    table_ = DeviceArray<AdamWSegment>(table.size(), "the AdamW segment table");
    if (!table.empty())
      cuda_check(cudaMemcpy(table_.get(), table.data(), table_.bytes(), cudaMemcpyHostToDevice),
                 "uploading the AdamW segment table");
  }

  // One AdamW step (step is 1-based). When grad_clip > 0 and grad_norm exceeds it, the gradients
  // enter scaled by grad_clip / grad_norm. Weight decay applies to the 2-D weights only
  // (ParameterInfo::decayed); bf16 parameters are stored stochastically rounded with the seed
  // adamw_rounding_seed(opt.seed, step, tensor) and the element's index within its tensor, so a
  // sharded update gives the bits of an unsharded one.
  void step(const OptimizerSettings& opt, float lr, int step, float grad_norm, cudaStream_t stream) const {
    if (step < 1) throw std::runtime_error("optimizer step: expected step >= 1, found " + std::to_string(step));
    const float grad_scale =
        (opt.grad_clip > 0.0f && grad_norm > opt.grad_clip) ? opt.grad_clip / grad_norm : 1.0f;
    const AdamWHyper h = adamw_hyper(lr, opt.beta1, opt.beta2, opt.eps, opt.weight_decay, grad_scale, step);
    AdamWSeeds seeds{};
    for (int t = 0; t < kNumParameterTensors; ++t)
      seeds.of_tensor[t] = adamw_rounding_seed(opt.seed, step, rounding_stream(t));
    adamw_launch(table_.get(), static_cast<int>(table_.count()), plan_, params_, master_, grads_, m_, v_, h, seeds,
                 stream);
  }

 private:
  Elem* params_;
  float* master_;
  const Elem* grads_;
  float *m_, *v_;
  AdamWPlan plan_;
  DeviceArray<AdamWSegment> table_;
};
