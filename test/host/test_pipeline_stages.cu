// Which layers each pipeline chunk holds (src/dist/pipeline_stages.h): the cost model against
// hand-written parameter counts; the balanced cut of every preset at several p and v is
// contiguous, gives every chunk a layer, covers the L layers once and has the least largest chunk
// cost there is (a brute force over every cut where L is small, an independent recursion
// elsewhere), with the documented tie-break; --pp-layers's cut and each of its errors.
#include <catch2/catch.hpp>

#include "src/dist/pipeline_stages.h"

#include <algorithm>
#include <climits>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace {

// The cost of each layer as the planner sees it: every layer alike, the LM head on the last.
std::vector<long long> layer_costs(const ModelConfig& m, int seq_len) {
  std::vector<long long> costs(m.num_layers, pipeline_layer_cost(m, seq_len));
  costs.back() += pipeline_head_cost(m);
  return costs;
}

std::vector<long long> chunk_costs(const PipelineStages& st, const std::vector<long long>& costs) {
  std::vector<long long> out;
  for (int s = 0; s < st.chunks(); ++s) {
    long long sum = 0;
    for (int l = st.chunk_first[s]; l < st.chunk_first[s] + st.chunk_layers[s]; ++l) sum += costs[l];
    out.push_back(sum);
  }
  return out;
}

long long largest(const std::vector<long long>& v) { return *std::max_element(v.begin(), v.end()); }

// The least largest chunk cost over every cut of `costs` into `chunks` non-empty runs, by trying
// them all (small L only).
long long brute_force_best(const std::vector<long long>& costs, int chunks) {
  const int L = static_cast<int>(costs.size());
  long long best = LLONG_MAX;
  std::vector<int> cut;  // the first layer of chunks 1..chunks-1
  std::function<void(int)> place = [&](int from) {
    if (static_cast<int>(cut.size()) == chunks - 1) {
      long long worst = 0, sum = 0;
      size_t next = 0;
      for (int l = 0; l < L; ++l) {
        if (next < cut.size() && cut[next] == l) {
          worst = std::max(worst, sum);
          sum = 0;
          ++next;
        }
        sum += costs[l];
      }
      best = std::min(best, std::max(worst, sum));
      return;
    }
    for (int f = from; f < L; ++f) {
      cut.push_back(f);
      place(f + 1);
      cut.pop_back();
    }
  };
  place(1);
  return best;
}

// The same least largest cost by a memoized recursion on (layers left from `first`, chunks left).
long long recursive_best(const std::vector<long long>& costs, int chunks) {
  const int L = static_cast<int>(costs.size());
  std::map<std::pair<int, int>, long long> memo;
  std::function<long long(int, int)> go = [&](int first, int left) -> long long {
    if (left == 1) {
      long long sum = 0;
      for (int l = first; l < L; ++l) sum += costs[l];
      return sum;
    }
    auto it = memo.find({first, left});
    if (it != memo.end()) return it->second;
    long long best = LLONG_MAX, sum = 0;
    for (int end = first + 1; L - end >= left - 1; ++end) {
      sum += costs[end - 1];
      best = std::min(best, std::max(sum, go(end, left - 1)));
    }
    return memo[{first, left}] = best;
  };
  return go(0, chunks);
}

void check_well_formed(const PipelineStages& st, int L, int p, int v) {
  REQUIRE(st.stages == p);
  REQUIRE(st.virtual_stages == v);
  REQUIRE(st.chunk_first.size() == static_cast<size_t>(p * v));
  REQUIRE(st.chunk_layers.size() == static_cast<size_t>(p * v));
  int next = 0;
  for (int s = 0; s < p * v; ++s) {
    CHECK(st.chunk_layers[s] >= 1);
    CHECK(st.chunk_first[s] == next);  // contiguous, in model order
    next += st.chunk_layers[s];
  }
  CHECK(next == L);
  // rank_layers: chunks r, r + p, ... in order; every layer on exactly one rank.
  std::vector<int> holders(L, 0);
  for (int r = 0; r < p; ++r) {
    std::vector<int> want;
    for (int s = r; s < p * v; s += p)
      for (int l = 0; l < st.chunk_layers[s]; ++l) want.push_back(st.chunk_first[s] + l);
    CHECK(st.rank_layers(r) == want);
    for (int l : st.rank_layers(r)) ++holders[l];
  }
  CHECK(std::count(holders.begin(), holders.end(), 1) == L);
}

std::string error_of(const ModelConfig& m, int p, int v, const std::vector<int>& layers) {
  try {
    plan_pipeline_stages(m, p, v, layers);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("the cost model: 6 per layer parameter plus attention's 6CT; the LM head 6·C·Vp", "[pipeline_stages]") {
  // GPT-2 d12: a block holds 12C² + 13C parameters (ln1 2C, qkv 3C² + 3C, attproj C² + C, ln2 2C,
  // fc 4C² + 4C, fcproj 4C² + C).
  const ModelConfig d12 = model_preset("d12");
  const long long C = 768;
  CHECK(pipeline_layer_cost(d12, 1024) == 6 * (12 * C * C + 13 * C) + 6 * C * 1024);
  CHECK(pipeline_head_cost(d12) == 6 * C * 50304);
  // Llama 3.1 8B: two RMSNorm weights, q|k|v C·(NH + 2·NKV)·HS, wo C², w1 w3 w2 3·C·H; no biases.
  const ModelConfig l8 = model_preset("llama3.1-8b");
  const long long C8 = 4096, H8 = 14336;
  CHECK(pipeline_layer_cost(l8, 8192) == 6 * (2 * C8 + C8 * (32 + 2 * 8) * 128 + C8 * C8 + 3 * C8 * H8) + 6 * C8 * 8192);
  CHECK(pipeline_head_cost(l8) == 6 * C8 * 128256);
}

TEST_CASE("balanced cuts: contiguous, every chunk a layer, the least largest cost", "[pipeline_stages]") {
  for (const char* name : {"nano", "micro", "d12", "d24", "gpt3-125m", "llama-nano", "llama-micro", "llama3.2-1b",
                           "llama3.1-8b", "llama3.1-70b"}) {
    const ModelConfig m = model_preset(name);
    const int L = m.num_layers;
    for (int seq_len : {0, 64, 1024}) {
      const std::vector<long long> costs = layer_costs(m, seq_len > 0 ? seq_len : m.max_seq_len);
      for (int p : {1, 2, 3, 4, 8}) {
        for (int v : {1, 2, 3}) {
          if (p * v > L) continue;
          INFO(name << " T " << seq_len << " p " << p << " v " << v);
          const PipelineStages st = plan_pipeline_stages(m, p, v, {}, seq_len);
          check_well_formed(st, L, p, v);
          const std::vector<long long> got = chunk_costs(st, costs);
          const long long want = L <= 16 ? brute_force_best(costs, p * v) : recursive_best(costs, p * v);
          CHECK(largest(got) == want);
        }
      }
    }
  }
}

TEST_CASE("balanced cuts: ties leave the earlier chunks balanced and give spare layers to later ones",
          "[pipeline_stages]") {
  // d12 at T 1024: the head costs ~4.9 layers, so the last chunk holds one layer (~5.9) and the 11
  // others split as evenly as can be, the extra layers late.
  const ModelConfig d12 = model_preset("d12");
  CHECK(plan_pipeline_stages(d12, 4, 1, {}, 1024).chunk_layers == std::vector<int>{3, 4, 4, 1});
  CHECK(plan_pipeline_stages(d12, 2, 1, {}, 1024).chunk_layers == std::vector<int>{8, 4});
  CHECK(plan_pipeline_stages(d12, 12, 1, {}, 1024).chunk_layers == std::vector<int>(12, 1));
  // Llama 3.1 70B (80 layers) at T 8192 over 4 ranks x 2 chunks: the head (~0.6 of a layer)
  // leaves the last chunk one layer short.
  const ModelConfig l70 = model_preset("llama3.1-70b");
  CHECK(plan_pipeline_stages(l70, 4, 2, {}, 8192).chunk_layers == std::vector<int>{10, 10, 10, 10, 10, 10, 11, 9});
}

TEST_CASE("--pp-layers: each rank's count split into --pp-virtual equal chunks", "[pipeline_stages]") {
  const ModelConfig d12 = model_preset("d12");
  PipelineStages st = plan_pipeline_stages(d12, 3, 1, {5, 4, 3});
  check_well_formed(st, 12, 3, 1);
  CHECK(st.chunk_layers == std::vector<int>{5, 4, 3});
  st = plan_pipeline_stages(d12, 2, 2, {8, 4});
  check_well_formed(st, 12, 2, 2);
  CHECK(st.chunk_layers == std::vector<int>{4, 2, 4, 2});
  CHECK(st.chunk_first == std::vector<int>{0, 4, 6, 10});
  CHECK(st.rank_layers(0) == std::vector<int>{0, 1, 2, 3, 6, 7, 8, 9});
  CHECK(st.rank_layers(1) == std::vector<int>{4, 5, 10, 11});
}

TEST_CASE("bad pipeline splits: one line naming the flag", "[pipeline_stages]") {
  const ModelConfig d12 = model_preset("d12");
  CHECK(error_of(d12, 4, 4, {}) ==
        "--pp 4 x --pp-virtual 4 = 16 pipeline chunks for a model of 12 layers (each chunk holds at least one layer)");
  CHECK(error_of(d12, 13, 1, {}).rfind("--pp 13 x --pp-virtual 1 = 13 pipeline chunks", 0) == 0);
  CHECK(error_of(d12, 3, 1, {6, 6}) == "--pp-layers: 2 counts for --pp 3 (one per pipeline rank)");
  CHECK(error_of(d12, 2, 1, {12, 0}) == "--pp-layers: pipeline rank 1 has 0 layers (at least 1)");
  CHECK(error_of(d12, 2, 1, {6, 5}) == "--pp-layers: the counts sum to 11 layers, the model has 12");
  CHECK(error_of(d12, 2, 2, {7, 5}) ==
        "--pp-layers: pipeline rank 0's 7 layers are not a multiple of --pp-virtual 2 (each rank's layers split "
        "into equal chunks)");
  CHECK(error_of(d12, 0, 1, {}).rfind("--pp 0", 0) == 0);
  CHECK(error_of(d12, 2, 0, {}).rfind("--pp-virtual 0", 0) == 0);
  TrainConfig cfg;
  cfg.pp = 2;
  cfg.pp_layers = {6, 5};
  CHECK_THROWS_WITH(check_pipeline_split(d12, cfg), "--pp-layers: the counts sum to 11 layers, the model has 12");
  cfg.pp_layers = {6, 6};
  CHECK_NOTHROW(check_pipeline_split(d12, cfg));
}
