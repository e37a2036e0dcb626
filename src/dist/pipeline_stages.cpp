// pipeline_stages.cpp — which layers each pipeline chunk holds: --pp-layers's cut, or the cut balanced by cost
#include "src/dist/pipeline_stages.h"

#include <algorithm>
#include <climits>
#include <utility>
#include <stdexcept>
#include <string>

std::vector<int> PipelineStages::rank_layers(int rank) const {
  std::vector<int> layers;
  for (int s = rank; s < chunks(); s += stages)
    for (int l = chunk_first[s]; l < chunk_first[s] + chunk_layers[s]; ++l) layers.push_back(l);
  return layers;
}

long long pipeline_layer_cost(const ModelConfig& model, int seq_len) {
  const ParameterLayout layout(model);
  long long parameters = 0;
  for (int i = 0; i < kNumParameterTensors; ++i)
    if (is_layer_tensor(i)) parameters += static_cast<long long>(layout.slice_count(i));
  return 6 * parameters + 6LL * model.channels * seq_len;
}

long long pipeline_head_cost(const ModelConfig& model) { return 6LL * model.channels * model.padded_vocab_size; }

namespace {

// The balanced cut (the header's rule) of layers with these costs into `chunks` chunks: counts in
// model order. best[e][k]: the least largest chunk cost of layers [0, e) cut into k chunks
// (kNone: impossible), by dynamic programming over the last chunk's first layer.
std::vector<int> balanced_counts(const std::vector<long long>& costs, int chunks) {
  const int L = static_cast<int>(costs.size());
  constexpr long long kNone = LLONG_MAX;
  std::vector<long long> prefix(L + 1, 0);
  for (int l = 0; l < L; ++l) prefix[l + 1] = prefix[l] + costs[l];
  std::vector<std::vector<long long>> best(L + 1, std::vector<long long>(chunks + 1, kNone));
  best[0][0] = 0;
  for (int k = 1; k <= chunks; ++k)
    for (int e = k; e <= L; ++e)
      for (int f = k - 1; f < e; ++f)
        if (best[f][k - 1] != kNone) best[e][k] = std::min(best[e][k], std::max(best[f][k - 1], prefix[e] - prefix[f]));
  // From the last chunk backwards: keep the least largest cost, then the most balanced chunks
  // before this one, then the most layers in this one.
  std::vector<int> counts(chunks, 0);
  int end = L;
  for (int s = chunks - 1; s >= 0; --s) {
    int first = -1;
    auto key = [&](int f) { return std::make_pair(std::max(best[f][s], prefix[end] - prefix[f]), best[f][s]); };
    for (int f = s; f < end; ++f)
      if (best[f][s] != kNone && (first < 0 || key(f) < key(first))) first = f;
    counts[s] = end - first;
    end = first;
  }
  return counts;
}

}  // namespace

PipelineStages plan_pipeline_stages(const ModelConfig& model, int pp, int virtual_stages,
                                    const std::vector<int>& pp_layers, int seq_len) {
  const int L = model.num_layers;
  if (pp < 1) throw std::invalid_argument("--pp " + std::to_string(pp) + ": need at least 1 pipeline stage");
  if (virtual_stages < 1)
    throw std::invalid_argument("--pp-virtual " + std::to_string(virtual_stages) + ": need at least 1 chunk per rank");
  PipelineStages stages;
  stages.stages = pp;
  stages.virtual_stages = virtual_stages;
  const int chunks = stages.chunks();
  if (chunks > L)
    throw std::invalid_argument("--pp " + std::to_string(pp) + " x --pp-virtual " + std::to_string(virtual_stages) +
                                " = " + std::to_string(chunks) + " pipeline chunks for a model of " +
                                std::to_string(L) + " layers (each chunk holds at least one layer)");
  std::vector<int> counts(chunks);
  if (!pp_layers.empty()) {
    if (static_cast<int>(pp_layers.size()) != pp)
      throw std::invalid_argument("--pp-layers: " + std::to_string(pp_layers.size()) + " counts for --pp " +
                                  std::to_string(pp) + " (one per pipeline rank)");
    long long sum = 0;
    for (int r = 0; r < pp; ++r) {
      const int n = pp_layers[r];
      if (n < 1)
        throw std::invalid_argument("--pp-layers: pipeline rank " + std::to_string(r) + " has " + std::to_string(n) +
                                    " layers (at least 1)");
      if (n % virtual_stages != 0)
        throw std::invalid_argument("--pp-layers: pipeline rank " + std::to_string(r) + "'s " + std::to_string(n) +
                                    " layers are not a multiple of --pp-virtual " + std::to_string(virtual_stages) +
                                    " (each rank's layers split into equal chunks)");
      sum += n;
    }
    if (sum != L)
      throw std::invalid_argument("--pp-layers: the counts sum to " + std::to_string(sum) + " layers, the model has " +
                                  std::to_string(L));
    for (int s = 0; s < chunks; ++s) counts[s] = pp_layers[s % pp] / virtual_stages;
  } else {
    std::vector<long long> costs(L, pipeline_layer_cost(model, seq_len > 0 ? seq_len : model.max_seq_len));
    costs.back() += pipeline_head_cost(model);  // the embedding on chunk 0 costs nothing
    counts = balanced_counts(costs, chunks);
  }
  int first = 0;
  for (int s = 0; s < chunks; ++s) {
    stages.chunk_first.push_back(first);
    stages.chunk_layers.push_back(counts[s]);
    first += counts[s];
  }
  return stages;
}

void check_pipeline_split(const ModelConfig& model, const TrainConfig& cfg) {
  plan_pipeline_stages(model, cfg.pp, cfg.pp_virtual, cfg.pp_layers, cfg.seq_len);
}
