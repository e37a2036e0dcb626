// comm_plan.cpp — a step's gradient and parameter collectives by ZeRO stage (comm_plan.h).
#include "src/dist/comm_plan.h"

#include "src/config/model_config.h"
#include "src/dist/tensor_split.h"

#include <vector>

namespace {

// One call on a buffer of `elements` chunked over `ranks`, `passes` ring halves (1: reduce-scatter
// or all-gather, 2: all-reduce).
void add_call(CollectiveTraffic& t, size_t elements, int ranks, size_t elem_bytes, int passes) {
  ++t.calls;
  t.bytes_sent += ring_bytes_sent(static_cast<double>(elements * elem_bytes), ranks, passes);
}

}  // namespace

StepTraffic step_traffic(const GradientBuckets& buckets, int world_size, int stage, int micro_steps, int prefetch,
                         size_t elem_bytes) {
  StepTraffic t;
  const int R = world_size;
  const std::vector<GradientBucket>& all = buckets.buckets();
  if (R < 2) return t;
  for (const GradientBucket& b : all) {
    const size_t chunked = b.chunk * static_cast<size_t>(buckets.ranks());
    if (stage == 0) add_call(t.all_reduce, b.elements, R, elem_bytes, 2);
    for (int m = 0; m < (stage >= 2 ? micro_steps : stage == 1 ? 1 : 0); ++m)
      add_call(t.reduce_scatter, chunked, R, elem_bytes, 1);
    if (stage == 1 || stage == 2) add_call(t.all_gather, chunked, R, elem_bytes, 1);
  }
  if (stage != 3) return t;
  // Layer buckets are 0..K-2 (top layers first); the forward walks them from K-2 down, the
  // backward from 0 up; wte/wpe/lnf (bucket K-1) is gathered once.
  const size_t layer_buckets = all.size() - 1;
  add_call(t.all_gather, all.back().chunk * static_cast<size_t>(R), R, elem_bytes, 1);
  for (int pass = 0; pass < 2 * micro_steps; ++pass) {
    const bool forward = pass % 2 == 0;
    const size_t resident = pass == 0 ? 0 : static_cast<size_t>(prefetch) + 1;
    for (size_t k = resident; k < layer_buckets; ++k) {
      const GradientBucket& b = all[forward ? layer_buckets - 1 - k : k];
      add_call(t.all_gather, b.chunk * static_cast<size_t>(R), R, elem_bytes, 1);
    }
  }
  return t;
}

StepTraffic tp_step_traffic(const ModelConfig& cfg, int B, int T, const TensorParallelism& tp, int recompute,
                            int head_chunks, int micro_steps, const GradientBuckets& buckets, bool every_micro_step,
                            size_t elem_bytes, bool embeds, bool head) {
  StepTraffic t;
  const int n = tp.size, L = cfg.num_layers;
  if (n < 2) return t;
  const size_t rows = static_cast<size_t>(B) * T, activation = rows * static_cast<size_t>(cfg.channels);
  const bool sp = tp.sequence_parallel;
  const auto gather = [&](int calls) {
    for (int k = 0; sp && k < calls; ++k) add_call(t.all_gather, activation, n, elem_bytes, 1);
  };
  const auto reduce = [&](int calls) {
    for (int k = 0; k < calls; ++k)
      add_call(sp ? t.reduce_scatter : t.all_reduce, activation, n, elem_bytes, sp ? 1 : 2);
  };
  // Per layer: the branches summed over the group (experts run on the rank's own rows: only
  // attention's), and what the backward recomputes (activations.h's block_keeps).
  const int branches = cfg.moe() ? 1 : 2;
  const int regathered = recompute >= 2 ? branches : 0, rereduced = recompute == 3 ? 1 : 0;
  for (int m = 0; m < micro_steps; ++m) {
    reduce((embeds ? 1 : 0) + branches * L);  // embedding, each layer's projections
    gather(branches * L + (head ? 1 : 0));    // ln1 (and ln2) of each layer, lnf
    for (int c = 0; head && c < head_chunks; ++c) {  // each chunk's row maxima, then sums and target logits
      const size_t chunk_rows = rows / head_chunks + (static_cast<size_t>(c) < rows % head_chunks ? 1 : 0);
      add_call(t.all_reduce, chunk_rows, n, sizeof(float), 2);
      add_call(t.all_reduce, 2 * chunk_rows, n, sizeof(float), 2);
    }
    reduce(head ? 1 : 0);  // d lnf
    reduce((branches + rereduced) * L);
    gather((branches + regathered) * L + (embeds ? 1 : 0));
    // The micro-batch's routing figures (expert_mlp.h's expert_aux_gradient): counts and
    // probability sums, 2·E fp64 values.
    if (sp && cfg.moe()) add_call(t.all_reduce, 2 * static_cast<size_t>(cfg.num_experts), n, sizeof(double), 2);
    if (sp && (every_micro_step || m + 1 == micro_steps))
      for (const GradientBucket& b : buckets.buckets())
        if (b.tp_replicated.count() > 0) add_call(t.all_reduce, b.tp_replicated.count(), n, elem_bytes, 2);
  }
  // The sigmoid router's step counts (expert_bias.h): L × E fp64 values.
  if (sp && cfg.moe() && cfg.router == Router::sigmoid)
    add_call(t.all_reduce, static_cast<size_t>(L) * cfg.num_experts, n, sizeof(double), 2);
  return t;
}

ExpertTraffic ep_step_traffic(const ModelConfig& cfg, int rows, int ranks, bool forward_reruns, int micro_steps,
                              const GradientBuckets& buckets, bool every_micro_step, size_t elem_bytes) {
  ExpertTraffic t;
  const long long E = cfg.num_experts, P = ranks, remote = E * (P - 1) / P;
  const double row_bytes = static_cast<double>(cfg.channels) * static_cast<double>(elem_bytes);
  const double R = static_cast<double>(rows) * cfg.experts_per_token * static_cast<double>(P - 1) / static_cast<double>(P);
  const CollectiveTraffic forward{(P - 1) + 2 * remote, 4.0 * static_cast<double>((E + 1) * (P - 1)) + 2 * R * row_bytes};
  const CollectiveTraffic backward{3 * remote, 3 * R * row_bytes};
  const long long passes = static_cast<long long>(cfg.num_layers) * micro_steps, runs = forward_reruns ? 2 : 1;
  t.sends = {passes * (runs * forward.calls + backward.calls),
             static_cast<double>(passes) * (static_cast<double>(runs) * forward.bytes_sent + backward.bytes_sent)};
  for (int m = every_micro_step ? 0 : micro_steps - 1; m < micro_steps; ++m)
    for (const GradientBucket& b : buckets.buckets())
      if (b.ep_replicated.count() > 0) add_call(t.all_reduce, b.ep_replicated.count(), ranks, elem_bytes, 2);
  if (cfg.router == Router::sigmoid)
    add_call(t.all_reduce, static_cast<size_t>(cfg.num_layers) * cfg.num_experts, ranks, sizeof(double), 2);
  return t;
}
