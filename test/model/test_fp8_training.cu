// --fp8 (src/model/fp8_state.h): tiny GPT-2 and Llama 3 models trained 200 AdamW steps with the
// blocks' Linear products in FP8 (the CPU build answers them through simt's exact cuBLASLt FP8
// oracle) stay within 2% of the same run in bf16 at every step past warm-up (20 steps), for
// delayed and current scaling; the FP8 run really is another computation (its losses differ from
// bf16's), its scales moved away from their initial 1 to format max / amax, and it holds the
// bytes --plan counts. Also: the FP8 state's checkpointed values restore into a fresh model (same
// scales), and --recompute 2 and 3 (the norms' outputs recomputed, or every block rerun in the
// backward, its inputs cast again) give the same bits as --recompute 0. The input casts fused into
// their producers, the norms and the MLP activation (Fp8State::producer_output), and the output
// gradients' casts made by the kernels that make the gradients (SwiGLU's backward; the bias and
// GELU gradients'), and the transposed cast of the activation recomputed for the backward, give the
// same bits as separate casts at --recompute 1, validations between the steps included, with three
// fewer cast launches per layer and forward, and four (Llama) or five (GPT-2) per layer and
// backward.
#include "test/test_util.h"
#include "src/config/config.h"
#include "src/model/transformer.h"

#include <cmath>
#include <cstdio>
#include <optional>
#include <utility>
#include <vector>

namespace {

// L=2 NH=2 C=32 (head size 16), hidden 128, V=128: every product's width a multiple of 16.
const ModelConfig kTinyGpt2{16, 128, 128, 2, 2, 32};
// Llama 3's shape: GQA NKV=1, SwiGLU H=64 (fc and fc2 share their input's scale), RoPE, untied head.
const ModelConfig kTinyLlama = llama3_config(16, 128, 2, 2, 1, 32, 64, llama32_rope(), false);
constexpr int kBatch = 2, kSeqLen = 16;  // 32 rows
constexpr int kSteps = 200, kWarmup = 20;

// A learnable stream: each token a fixed function of the previous one, with 1 in 8 replaced by noise.
std::vector<int> markov_tokens(size_t n, int vocab, uint64_t seed) {
  const std::vector<int> noise = test::random_tokens(n, vocab, seed);
  std::vector<int> v(n);
  v[0] = noise[0];
  for (size_t i = 1; i < n; ++i) v[i] = i % 8 == 0 ? noise[i] : (v[i - 1] * 5 + 3) % vocab;
  return v;
}

Transformer<bf16> make_model(const ModelConfig& cfg, const std::optional<Fp8Settings>& fp8, int recompute = 0) {
  return Transformer<bf16>(cfg, kBatch, kSeqLen, recompute, nullptr, 0, "auto", kDefaultBucketMiB, kLogitsChunkRows,
                           kDefaultZero3Prefetch, nullptr, false, {}, nullptr, fp8);
}

// The mean loss of every step of a kSteps-step run (one micro-step per step); validate: after each
// step also the loss of a forward alone on other tokens (a validation: it records no amax).
std::vector<float> train(Transformer<bf16>& model, int steps, bool validate = false) {
  OptimizerSettings opt;
  opt.weight_decay = 0.0f;
  const size_t rows = static_cast<size_t>(kBatch) * kSeqLen;
  std::vector<float> losses;
  for (int step = 1; step <= steps; ++step) {
    model.zero_grad();
    const std::vector<int> tokens = markov_tokens(rows + 1, model.config().vocab_size, step);
    const std::vector<int> inputs(tokens.begin(), tokens.end() - 1), targets(tokens.begin() + 1, tokens.end());
    model.forward_backward(inputs.data(), targets.data(), 1);
    losses.push_back(model.mean_loss());
    const float lr = 3e-3f * std::min(1.0f, static_cast<float>(step) / 10.0f);
    test::optimizer_step(model, opt, lr, step);
    if (!validate) continue;
    const std::vector<int> other = markov_tokens(rows + 1, model.config().vocab_size, 1000 + step);
    const std::vector<int> other_inputs(other.begin(), other.end() - 1), other_targets(other.begin() + 1, other.end());
    losses.push_back(model.forward(other_inputs.data(), other_targets.data()));
  }
  return losses;
}

// train()'s losses, and the launches of fp8_cast it made (either kernel, from bf16 to E4M3 or E5M2:
// the activations', the gradients' and the weights' casts, the last alike in the runs compared).
std::pair<std::vector<float>, long long> train_counting_casts(Transformer<bf16>& model, int steps) {
  DeviceProfiler& profiler = DeviceProfiler::get();
  profiler.clear();
  profiler.start();
  const std::vector<float> losses = train(model, steps, true);
  profiler.stop();
  long long casts = 0;
  for (const ProfileSite& site : profiler.sites())
    for (const char* kernel :
         {"fp8_cast_kernel<__nv_bfloat16, __nv_fp8_e", "fp8_cast_wide_kernel<Fp8Stored<__nv_bfloat16>, __nv_fp8_e"})
      if (site.name.rfind(kernel, 0) == 0) casts += site.calls;
  profiler.clear();
  return {losses, casts};
}

}  // namespace

TEST_CASE("--fp8: 200 steps within 2% of bf16's loss past warm-up, scales from the amaxes", "[fp8]") {
  const ModelConfig cfg = GENERATE(kTinyGpt2, kTinyLlama);
  const char* arch = cfg.mlp == Mlp::swiglu ? "llama" : "gpt2";
  Transformer<bf16> reference = make_model(cfg, std::nullopt);
  reference.init_random(7);
  const std::vector<float> want = train(reference, kSteps);
  CHECK(want.back() < 0.6f * want[0]);  // the stream is learned: the comparison means something
  for (const bool delayed : {true, false}) {
    CAPTURE(arch, delayed);
    Transformer<bf16> model = make_model(cfg, Fp8Settings{delayed, 16, 0});
    model.init_random(7);
    const std::vector<float> got = train(model, kSteps);
    double worst = 0.0;
    int worst_step = 0;
    bool differs = false;
    for (int s = 0; s < kSteps; ++s) {
      differs = differs || got[s] != want[s];
      if (s < kWarmup) continue;
      const double rel = std::fabs(got[s] - want[s]) / want[s];
      if (rel > worst) worst = rel, worst_step = s + 1;
    }
    std::printf("fp8 %s %s: losses %.4f -> %.4f (bf16 %.4f -> %.4f), worst relative difference past step %d: "
                "%.4f at step %d\n",
                arch, delayed ? "delayed" : "current", got[0], got.back(), want[0], want.back(), kWarmup, worst,
                worst_step);
    CHECK(differs);  // the products did run in FP8
    CHECK(worst <= 0.02);
    // Every product's weight scale is E4M3's max over the weight's amax, the gradients' E5M2's max
    // over theirs: far from the initial 1.
    Fp8State* fp8 = model.fp8_state();
    REQUIRE(fp8 != nullptr);
    CHECK(fp8->bytes() == fp8_state_bytes(fp8_product_shapes(cfg, 1), cfg.num_layers, kBatch * kSeqLen, 16));
    for (Fp8Product p : {Fp8Product::qkv, Fp8Product::attproj, Fp8Product::fc, Fp8Product::fcproj}) {
      CAPTURE(static_cast<int>(p));
      CHECK(fp8->scale(1, p, Fp8Operand::weight) > 100.0f);
      CHECK(fp8->scale(1, p, Fp8Operand::grad) > 1000.0f);
    }
  }
}

TEST_CASE("--fp8: the saved scales and histories restore into a fresh model", "[fp8]") {
  const ModelConfig cfg = GENERATE(kTinyGpt2, kTinyLlama);
  Transformer<bf16> model = make_model(cfg, Fp8Settings{});
  model.init_random(3);
  train(model, 5);
  const std::vector<float> saved = model.fp8_state()->saved_state();
  Transformer<bf16> fresh = make_model(cfg, Fp8Settings{});
  fresh.init_random(3);
  CHECK(fresh.fp8_state()->saved_state() != saved);
  fresh.fp8_state()->restore_state(saved);
  CHECK(fresh.fp8_state()->saved_state() == saved);
  CHECK(fresh.fp8_state()->scale(0, Fp8Product::qkv, Fp8Operand::grad) ==
        model.fp8_state()->scale(0, Fp8Product::qkv, Fp8Operand::grad));
  CHECK_THROWS_WITH(fresh.fp8_state()->restore_state(std::vector<float>(saved.size() - 1)),
                    Catch::Contains("FP8 state") && Catch::Contains("expected"));
}

TEST_CASE("--fp8: the input casts fused into their producers give the bits of separate casts", "[fp8]") {
  const ModelConfig cfg = GENERATE(kTinyGpt2, kTinyLlama);
  const int steps = 4;
  Fp8Settings separate;
  separate.producer_casts = false;
  // At --recompute 1 (the default): the activation recomputed in the backward casts itself too.
  Transformer<bf16> fused_model = make_model(cfg, Fp8Settings{}, 1), separate_model = make_model(cfg, separate, 1);
  fused_model.init_random(9);
  separate_model.init_random(9);
  const auto [fused_losses, fused_casts] = train_counting_casts(fused_model, steps);
  const auto [separate_losses, separate_casts] = train_counting_casts(separate_model, steps);
  CHECK(fused_losses == separate_losses);
  CHECK(fused_model.parameters() == separate_model.parameters());
  // ln1's cast for QKV, ln2's for the MLP and the activation's for its down product, in every
  // forward: each step's and each validation's. Per layer and backward: the recomputed
  // activation's transposed cast; SwiGLU's two gradients' casts and the second transposed cast of
  // their one input; GPT-2's gradient casts of its four products, each with a bias (and fc's with
  // GELU's gradient).
  REQUIRE(cfg.biases == (cfg.mlp == Mlp::gelu));
  const int backward_casts = 1 + (cfg.mlp == Mlp::swiglu ? 3 : 4);
  CHECK(separate_casts - fused_casts == 3 * cfg.num_layers * 2 * steps + backward_casts * cfg.num_layers * steps);
}

TEST_CASE("--fp8 --recompute 1, 2 and 3: the same bits as --recompute 0", "[fp8]") {
  const ModelConfig cfg = GENERATE(kTinyGpt2, kTinyLlama);
  const int recompute = GENERATE(1, 2, 3);
  CAPTURE(recompute);
  Transformer<bf16> kept = make_model(cfg, Fp8Settings{}, 0);
  Transformer<bf16> rerun = make_model(cfg, Fp8Settings{}, recompute);
  kept.init_random(5);
  rerun.init_random(5);
  CHECK(train(kept, 4) == train(rerun, 4));
  CHECK(kept.parameters() == rerun.parameters());
}
