// Generation with a KV cache (src/gen/generate.h) on the tiny PyTorch reference model
// (build/reference/tiny, written by dev/gpt2_reference.py before `make test`):
//  - the decoder's greedy tokens and logits equal those of the training forward (src/model/transformer.h)
//    recomputed over the whole sequence without a cache: fp32 tightly, bf16 within its rounding;
//  - they equal PyTorch's greedy decoding (generate.json, float64, full recomputation): fp32 the
//    same tokens and logits to 1e-5; bf16, fed PyTorch's tokens, logits within bf16 error and the
//    same argmax wherever PyTorch's top two logits are clearly apart;
//  - choose_token: greedy ties, top-k support, frequencies of seeded draws, determinism;
//  - the cache's capacity and token errors;
//  - a random tiny Llama 3 (GQA with NKV < NH, RoPE with 3.1's scaling, RMSNorm, SwiGLU, untied lm
//    head, no biases): the decoder's logits at every position, prefilled or appended, equal the
//    training forward's; generation stops at EOS or eot of Llama 3's vocabulary (vocabulary.h),
//    and prompts start with BOS.
#include "test/test_util.h"
#include "src/gen/generate.h"
#include "src/gen/vocabulary.h"
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

namespace {

// A random tiny Llama 3 over `vocab` tokens: 2 layers, 4 query heads sharing 2 K/V heads (HS 16),
// Llama 3.1's RoPE scaling, SwiGLU, untied lm head, no biases.
ModelConfig tiny_llama(int vocab) {
  ModelConfig cfg = llama3_config(32, vocab, 2, 4, 2, 64, llama_hidden_size(64, 1.0f, 16), llama31_rope(), false);
  check_model_config(cfg, "the test's tiny Llama");
  return cfg;
}

}  // namespace

TEST_CASE("KV-cache decoding of a tiny Llama 3 (GQA, RoPE, SwiGLU, untied) equals the training forward", "[generate]") {
  const ModelConfig cfg = tiny_llama(256);
  REQUIRE(cfg.kv_heads() < cfg.num_heads);
  REQUIRE(!cfg.tied_embeddings);
  REQUIRE(cfg.rope.scaled);
  const std::vector<int> prompt = {3, 141, 59, 26, 255};
  const int P = static_cast<int>(prompt.size()), N = 14, T = P + N - 1;  // T = 18: not a multiple of 8
  Transformer<float> model(cfg, 1, T);
  model.init_random(11);
  KvCacheDecoder<float> decoder(cfg, model.params_device(), T, model.attention(), model.stream());
  // The cache holds each K/V head once (2 of the 4 heads' width), not a copy per query head.
  CHECK(kv_decoder_counts(cfg, T).cache == static_cast<size_t>(cfg.num_layers) * T * 2 * cfg.head_size());

  // Greedy generation after the prompt, then the training forward over the whole sequence.
  std::vector<std::vector<float>> step_logits;
  const std::vector<int> generated = generate_tokens(
      decoder, prompt, N, SamplingSettings{0.0, 0, 0},
      [&](int, const std::vector<float>& logits) { step_logits.push_back(logits); });
  REQUIRE(generated.size() == static_cast<size_t>(N));
  std::vector<int> sequence = prompt;
  sequence.insert(sequence.end(), generated.begin(), generated.end() - 1);
  model.forward(sequence.data(), nullptr);
  const std::vector<float> full = model.logits();
  const size_t V = static_cast<size_t>(cfg.vocab_size), Vp = static_cast<size_t>(cfg.padded_vocab_size);
  auto want = [&](int position) {
    const auto row = full.begin() + static_cast<std::ptrdiff_t>(position * Vp);
    return std::vector<float>(row, row + static_cast<std::ptrdiff_t>(V));
  };
  const double rel_tol = 1e-5, abs_tol = 2e-6;
  for (int i = 0; i < N; ++i) {
    INFO("generated token " << i);
    CHECK(test::all_close("logits", step_logits[i], want(P - 1 + i), rel_tol, abs_tol));
    CHECK(generated[i] == argmax(want(P - 1 + i)));
  }
  // Every position through the prefill (the prefix ending there) and through appends after a
  // one-token prefill (RoPE at first_position t, the cache read at every length).
  for (int t = 1; t <= T; ++t) {
    INFO("prefill of " << t << " token(s)");
    CHECK(test::all_close("logits", decoder.prefill(std::vector<int>(sequence.begin(), sequence.begin() + t)),
                          want(t - 1), rel_tol, abs_tol));
  }
  std::vector<float> logits = decoder.prefill({sequence[0]});
  for (int t = 0; t < T; ++t) {
    INFO("position " << t << (t == 0 ? " (prefilled)" : " (appended)"));
    CHECK(test::all_close("logits", logits, want(t), rel_tol, abs_tol));
    if (t + 1 < T) logits = decoder.append(sequence[t + 1]);
  }
}

TEST_CASE("Text vocabularies: Llama 3's prompts start with BOS; its EOS and eot stop, GPT-2's <|endoftext|>",
          "[generate]") {
  ModelConfig gpt2, llama;
  gpt2.vocab_size = kGpt2VocabSize;
  llama.vocab_size = kLlama3VocabSize;
  REQUIRE(text_vocabulary(gpt2) == TextVocabulary::gpt2);
  REQUIRE(text_vocabulary(llama) == TextVocabulary::llama3);
  CHECK(stop_tokens(TextVocabulary::gpt2, kGpt2VocabSize) == std::vector<int>{50256});
  CHECK(stop_tokens(TextVocabulary::gpt2, 256).empty());  // a test vocabulary without <|endoftext|>
  CHECK(stop_tokens(TextVocabulary::llama3, kLlama3VocabSize) == std::vector<int>{128001, 128009});
  CHECK(prompt_tokens(TextVocabulary::llama3, {2028, 374}) == std::vector<int>{128000, 2028, 374});
  CHECK(prompt_tokens(TextVocabulary::llama3, {}) == std::vector<int>{128000});
  CHECK(prompt_tokens(TextVocabulary::gpt2, {15496, 11}) == std::vector<int>{15496, 11});
  CHECK(prompt_tokens(TextVocabulary::gpt2, {}) == std::vector<int>{50256});
  CHECK(default_vocab_dir(TextVocabulary::llama3) == "data/llama3_bpe");
}

TEST_CASE("Generation from a Llama 3 with its real vocabulary stops after EOS or eot", "[generate]") {
  // A model whose greedy token is `target` after the prompt: the attention and MLP projections are
  // zero, so the residual stream at the last position is the prompt's last token's embedding e,
  // the final RMSNorm (weight 1) scales it by a positive factor, and the lm head's only non-zero
  // row, target's, is e: target's logit is positive, every other one 0.
  ModelConfig cfg = llama3_config(16, kLlama3VocabSize, 1, 2, 1, 32, 64, llama32_rope(), false);
  check_model_config(cfg, "the test's Llama");
  const ParameterLayout layout(cfg);
  const std::vector<int> prompt = prompt_tokens(TextVocabulary::llama3, {9906, 11, 1917});
  const SamplingSettings greedy{0.0, 0, 0, stop_tokens(text_vocabulary(cfg), cfg.vocab_size)};
  const size_t C = static_cast<size_t>(cfg.channels);
  for (const int target : {static_cast<int>(kLlama3EndOfText), static_cast<int>(kLlama3EndOfTurn), 300}) {
    INFO("the model's greedy token: " << target);
    std::vector<float> host(layout.total, 0.0f);
    NormalSampler normal(5);
    for (int i = 0; i < kNumParameterTensors; ++i) {
      const ParameterInfo& t = layout[i];
      const bool norm_weight = i == kLn1w || i == kLn2w || i == kLnfw;
      const bool zero = i == kAttprojw || i == kFcprojw || i == kLmHead;
      for (size_t k = 0; k < t.count; ++k)
        host[t.offset + k] = norm_weight ? 1.0f : zero ? 0.0f : static_cast<float>(0.02 * normal.next());
    }
    std::copy_n(host.begin() + static_cast<std::ptrdiff_t>(layout[kWte].offset + prompt.back() * C), C,
                host.begin() + static_cast<std::ptrdiff_t>(layout[kLmHead].offset + target * C));
    DeviceArray<float> params(layout.total, "the test's parameters");
    upload_floats(params.get(), host, "the test's parameters");
    KvCacheDecoder<float> decoder(cfg, params.get(), static_cast<int>(prompt.size()) + 5, AttentionKernel::simple,
                                  nullptr);
    const std::vector<int> generated = generate_tokens(decoder, prompt, 6, greedy);
    REQUIRE(!generated.empty());
    CHECK(generated[0] == target);
    if (target == 300) CHECK(generated.size() == 6);  // an ordinary token: no stop
    else CHECK(generated == std::vector<int>{target});
  }
}
