// Generation with a KV cache (src/gen/generate.h) on the tiny PyTorch reference model
// (build/reference/tiny, written by dev/gpt2_reference.py before `make test`):
//  - the decoder's greedy tokens and logits equal those of the training forward (src/model/transformer.h)
//    recomputed over the whole sequence without a cache: fp32 tightly, bf16 within its rounding;
//  - they equal PyTorch's greedy decoding (generate.json, float64, full recomputation): fp32 the
//    same tokens and logits to 1e-5; bf16, fed PyTorch's tokens, logits within bf16 error and the
//    same argmax wherever PyTorch's top two logits are clearly apart;
//  - choose_token: greedy ties, top-k support, frequencies of seeded draws, determinism;
//  - the cache's capacity and token errors.
#include "test/test_util.h"
#include "src/gen/generate.h"
#include "src/model/transformer.h"

#include <nlohmann/json.hpp>

#include <fstream>
#include <map>

namespace {

const std::string kReferenceDir = "build/reference/tiny";

struct GreedyReference {
  std::vector<int> prompt, tokens;
  std::vector<std::vector<float>> logits;  // per generated token, the V logits it was chosen from
};

GreedyReference load_greedy_reference() {
  std::ifstream in(kReferenceDir + "/generate.json");
  if (!in)
    throw std::runtime_error(kReferenceDir + "/generate.json: missing; generate it with `make test` or "
                             "`/usr/bin/python3 dev/gpt2_reference.py --out " + kReferenceDir + "`");
  const nlohmann::json j = nlohmann::json::parse(in);
  GreedyReference r;
  r.prompt = j.at("prompt").get<std::vector<int>>();
  r.tokens = j.at("tokens").get<std::vector<int>>();
  r.logits = j.at("logits").get<std::vector<std::vector<float>>>();
  return r;
}

// The model's parameters from the reference model.bin, as Elem on the device.
template <typename Elem>
DeviceArray<Elem> reference_parameters(ModelConfig* config) {
  return load_model_parameters<Elem>(kReferenceDir + "/model.bin", config);
}

// Gap between the largest and the second largest logit.
float top_two_margin(const std::vector<float>& logits) {
  std::vector<float> sorted = logits;
  std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
  return sorted[0] - sorted[1];
}

int argmax(const std::vector<float>& logits) {
  return static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

}  // namespace

TEMPLATE_TEST_CASE("KV-cache greedy decoding equals the training forward recomputed without a cache", "[generate]",
                   float, bf16) {
  using T = TestType;
  const bool is_bf16 = sizeof(T) == 2;
  const GreedyReference ref = load_greedy_reference();
  ModelConfig cfg;
  DeviceArray<T> params = reference_parameters<T>(&cfg);
  const int P = static_cast<int>(ref.prompt.size()), N = 12;
  KvCacheDecoder<T> decoder(cfg, params.get(), P + N, choose_attention("auto", Transformer<T>::dtype, cfg), nullptr);
  std::vector<std::vector<float>> step_logits;
  const std::vector<int> generated = generate_tokens(
      decoder, ref.prompt, N, SamplingSettings{0.0, 0, 0},
      [&](int, const std::vector<float>& logits) { step_logits.push_back(logits); });
  REQUIRE(generated.size() == static_cast<size_t>(N));
  CHECK(decoder.length() == P + N - 1);  // the last token is chosen, never run

  // The training model over prompt + generated[0..N-2] in one forward: position P-1+i's logits are
  // those generated[i] was chosen from (causal attention: later tokens do not change them).
  std::vector<int> sequence = ref.prompt;
  sequence.insert(sequence.end(), generated.begin(), generated.end() - 1);
  Transformer<T> model(cfg, 1, static_cast<int>(sequence.size()));
  model.load(kReferenceDir + "/model.bin");
  model.forward(sequence.data(), nullptr);
  const std::vector<float> full = model.logits();
  const size_t Vp = static_cast<size_t>(cfg.padded_vocab_size), V = static_cast<size_t>(cfg.vocab_size);
  // bf16: both sides round every activation to bf16, but the full forward's attention is the
  // flash kernel and its matmuls see more rows, so roundings differ now and then (measured: logits
  // up to 4e-3 apart; fp32: 3e-7).
  const double abs_tol = is_bf16 ? 1.6e-2 : 2e-6, rel_tol = is_bf16 ? 1e-2 : 1e-5;
  for (int i = 0; i < N; ++i) {
    INFO("generated token " << i);
    const auto row = full.begin() + static_cast<std::ptrdiff_t>((P - 1 + i) * Vp);
    const std::vector<float> want(row, row + static_cast<std::ptrdiff_t>(V));
    CHECK(test::all_close("logits", step_logits[i], want, rel_tol, abs_tol));
    if (!is_bf16 || top_two_margin(want) > 2 * abs_tol) CHECK(generated[i] == argmax(want));
    CHECK(generated[i] == argmax(step_logits[i]));
  }
}

TEST_CASE("KV-cache greedy decoding in fp32 equals PyTorch's", "[generate]") {
  const GreedyReference ref = load_greedy_reference();
  ModelConfig cfg;
  DeviceArray<float> params = reference_parameters<float>(&cfg);
  const int N = static_cast<int>(ref.tokens.size());
  KvCacheDecoder<float> decoder(cfg, params.get(), static_cast<int>(ref.prompt.size()) + N, AttentionKernel::simple,
                                nullptr);
  std::vector<std::vector<float>> step_logits;
  const std::vector<int> generated = generate_tokens(
      decoder, ref.prompt, N, SamplingSettings{0.0, 0, 0},
      [&](int, const std::vector<float>& logits) { step_logits.push_back(logits); });
  CHECK(generated == ref.tokens);
  for (int i = 0; i < N; ++i) {
    INFO("generated token " << i);
    CHECK(test::all_close("logits", step_logits[i], ref.logits[i], 1e-5, 1e-5));  // measured: up to 3e-7
  }
}

TEST_CASE("KV-cache decoding in bf16, fed PyTorch's tokens, gives PyTorch's logits within bf16 error", "[generate]") {
  const GreedyReference ref = load_greedy_reference();
  ModelConfig cfg;
  DeviceArray<bf16> params = reference_parameters<bf16>(&cfg);
  const int N = static_cast<int>(ref.tokens.size());
  KvCacheDecoder<bf16> decoder(cfg, params.get(), static_cast<int>(ref.prompt.size()) + N,
                               choose_attention("auto", DType::bf16, cfg), nullptr);
  std::vector<float> logits = decoder.prefill(ref.prompt);
  const double abs_tol = 1.6e-2;  // measured: up to 4e-3
  int compared = 0;
  for (int i = 0; i < N; ++i) {
    INFO("generated token " << i);
    CHECK(test::all_close("logits", logits, ref.logits[i], 1e-2, abs_tol));
    if (top_two_margin(ref.logits[i]) > 2 * abs_tol) {
      CHECK(argmax(logits) == ref.tokens[i]);
      ++compared;
    }
    if (i + 1 < N) logits = decoder.append(ref.tokens[i]);
  }
  CHECK(compared >= N / 2);  // the argmax comparison covers most steps
}

TEST_CASE("choose_token: greedy, top-k, temperature, seeded frequencies", "[generate]") {
  SplitMix64 rng{1};
  // Greedy: the largest logit, the lowest id among equal ones; no draw.
  CHECK(choose_token({0.5f, 2.0f, -1.0f, 2.0f}, SamplingSettings{0.0, 0, 0}, rng) == 1);
  // top-k 1 is greedy at any temperature.
  for (int i = 0; i < 20; ++i) CHECK(choose_token({0.5f, 2.0f, -1.0f, 2.0f}, SamplingSettings{5.0, 1, 0}, rng) == 1);

  // Frequencies of 40000 draws against softmax(logits / temperature) over the top k, computed here.
  const std::vector<float> logits = {1.0f, 0.0f, 2.0f, -1.0f, 0.5f, 1.5f};
  for (const auto& [temperature, k] : std::vector<std::pair<double, int>>{{1.0, 0}, {0.7, 3}, {2.0, 4}}) {
    INFO("temperature " << temperature << " top-k " << k);
    std::vector<int> ids(logits.size());
    std::iota(ids.begin(), ids.end(), 0);
    std::sort(ids.begin(), ids.end(), [&](int a, int b) { return logits[a] > logits[b]; });
    const size_t kept = k == 0 ? logits.size() : static_cast<size_t>(k);
    std::vector<double> want(logits.size(), 0.0);
    double total = 0.0;
    for (size_t i = 0; i < kept; ++i) total += want[ids[i]] = std::exp(logits[ids[i]] / temperature);
    for (double& w : want) w /= total;
    SplitMix64 draws{42};
    std::vector<int> count(logits.size(), 0);
    const int n = 40000;
    for (int i = 0; i < n; ++i) ++count[choose_token(logits, SamplingSettings{temperature, k, 0}, draws)];
    for (size_t id = 0; id < logits.size(); ++id) {
      INFO("token " << id << ": " << count[id] << " draws, expected probability " << want[id]);
      if (want[id] == 0.0) CHECK(count[id] == 0);
      else CHECK(std::fabs(count[id] / static_cast<double>(n) - want[id]) < 4.0 * std::sqrt(want[id] / n) + 1e-3);
    }
  }

  // Deterministic for a seed; another seed gives another sequence.
  auto draw_sequence = [&](uint64_t seed) {
    SplitMix64 r{seed};
    std::vector<int> out;
    for (int i = 0; i < 64; ++i) out.push_back(choose_token(logits, SamplingSettings{1.0, 0, seed}, r));
    return out;
  };
  CHECK(draw_sequence(7) == draw_sequence(7));
  CHECK(draw_sequence(7) != draw_sequence(8));
}

TEST_CASE("KvCacheDecoder: seeded sampling is reproducible; the cache's limits are errors", "[generate]") {
  const GreedyReference ref = load_greedy_reference();
  ModelConfig cfg;
  DeviceArray<float> params = reference_parameters<float>(&cfg);
  const int P = static_cast<int>(ref.prompt.size());
  KvCacheDecoder<float> decoder(cfg, params.get(), P + 6, AttentionKernel::simple, nullptr);
  const SamplingSettings sampled{1.0, 40, 123};
  const std::vector<int> first = generate_tokens(decoder, ref.prompt, 6, sampled);
  CHECK(generate_tokens(decoder, ref.prompt, 6, sampled) == first);  // prefill empties the cache

  // The prompt and 6 appended positions fill the cache: one more does not fit.
  decoder.prefill(ref.prompt);
  for (int i = 0; i < 6; ++i) decoder.append(1);
  CHECK(decoder.length() == P + 6);
  CHECK_THROWS_WITH(decoder.append(1), Catch::Contains("holds " + std::to_string(P + 6) + " positions"));
  CHECK_THROWS_WITH(decoder.prefill(std::vector<int>(P + 7, 1)), Catch::Contains("do not fit"));
  CHECK_THROWS_WITH(decoder.prefill({}), Catch::Contains("do not fit"));
  CHECK_THROWS_WITH(decoder.prefill({cfg.vocab_size}), Catch::Contains("the model's vocabulary"));
  CHECK_THROWS_WITH(KvCacheDecoder<float>(cfg, params.get(), cfg.max_seq_len + 1, AttentionKernel::simple, nullptr),
                    Catch::Contains("max_seq_len"));
}
