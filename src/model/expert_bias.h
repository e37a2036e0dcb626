// expert_bias.h — the sigmoid router's aux-loss-free balancing (DeepSeek-V3; docs/MOE.md): once per
// optimizer step, after AdamW, each layer's expert bias moves by ± --moe-bias-rate toward the
// layer's mean load, the loads being the step's rows per expert over every micro-batch and every
// data-parallel rank, on the bias elements this rank's optimizer owns.
//
// The bias is a parameter (kExpertBias, L × E) so it travels in model files and checkpoints, but it
// has no gradient: AdamW sees a zero gradient and zero moments, computes p − lr·(0 / (0 + eps) +
// 0·p) and leaves the value bit for bit (the bias is not decayed); for bf16 its store of the master
// is stochastically rounded, which this update then replaces by the round-to-nearest of the moved
// master. So the update owns the bias's value alone.
#pragma once
#include "kernels/moe_router.cuh"
#include "src/base/device.h"
#include "src/config/model_config.h"
#include "src/dist/comm.h"
#include "src/dist/grad_buckets.h"
#include "src/model/model_parameters.h"

#include <vector>

template <typename Elem>
class ExpertBiasUpdate {
 public:
  ExpertBiasUpdate() = default;
  // For a sigmoid-routed model of `layers` local layers (otherwise nothing to do): the owned
  // segments of kExpertBias among `segments` (this rank's optimizer segments), their parameters
  // and master weights in `params`; `groups`: those whose ranks routed the step's other rows, over
  // which the counts are summed (nullptr or one rank: none): the data-parallel group (with --ep the
  // expert-DP group), the EP group and --tp's sequence-parallel group.
  ExpertBiasUpdate(const ModelConfig& c, int layers, const ParameterLayout& layout,
                   const std::vector<OptimizerSegment>& segments, const ModelParameters<Elem>& params,
                   const std::vector<Communicator*>& groups)
      : layers_(layers), experts_(c.num_experts), groups_(groups) {
    if (!c.moe() || c.router != Router::sigmoid) return;
    counts_ = DeviceArray<double>(static_cast<size_t>(layers) * c.num_experts, "the step's summed expert counts");
    for (const OptimizerSegment& s : segments)
      if (s.tensor == kExpertBias)
        owned_.push_back({params.owned(s), params.master() != nullptr ? params.master() + s.state : nullptr,
                          s.param - layout[kExpertBias].offset, s.count});
  }

  // The update from `counts` (layers × E device ints: this rank's step, every micro-batch), queued
  // on s; the counts are summed over the data-parallel group first, so every rank moves the same
  // way. Every rank of the group calls it (the sum is a collective), owned elements or not.
  void apply(const int* counts, float rate, cudaStream_t s) {
    if (counts_.count() == 0) return;
    moe_widen_counts(counts_.get(), counts, counts_.count(), s);
    for (Communicator* group : groups_)
      if (group != nullptr && group->world_size() > 1)
        group->ordered_with(s, [&] { group->all_reduce(counts_.get(), counts_.count(), ncclSum); });
    for (const Owned& o : owned_)
      moe_update_expert_bias(o.param, o.master, counts_.get(), rate, layers_, experts_, o.first, o.count, s);
  }

 private:
  struct Owned {
    Elem* param;
    float* master;        // nullptr for fp32 parameters
    size_t first, count;  // elements of the (L, E) tensor
  };
  int layers_ = 0, experts_ = 0;
  std::vector<Communicator*> groups_;
  DeviceArray<double> counts_;  // (layers, E), summed over the group
  std::vector<Owned> owned_;
};
