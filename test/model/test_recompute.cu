// Activation recomputation (--recompute, src/model/transformer.h): settings 1-3 keep fewer activations and
// recompute the rest in the backward pass with the same deterministic kernels, so a run must
// give bit-identical losses, gradients, gradient norms and weights at every setting. Checked
// for T = float and T = bf16 over several AdamW steps with two accumulated micro-steps each, on
// tiny GPT-2 and Llama 3 (GQA, SwiGLU, RoPE, untied) models with 2 layers (the backward of layer 0 runs after layer 1 has overwritten every
// one-layer slice, so a missing recomputation shows). Also: the activation memory formula
// against an independently written one for GPT-2 124M at B=8, T=1024, the allocation against
// the formula, and the errors for bad settings.
#include "test/test_util.h"
#include "src/config/config.h"
#include "src/model/transformer.h"

#include <cstring>
#include <string>
#include <vector>

namespace {

// L=2 NH=4 C=64 (head size 16), V=500 padded to 512, maxT=32.
const ModelConfig kTiny{32, 500, 512, 2, 4, 64};
// The same shape as Llama 3: GQA with NKV=2, SwiGLU H=192, RMSNorm, RoPE (3.2's scaling), untied head.
const ModelConfig kTinyLlama = llama3_config(32, 256, 2, 4, 2, 64, 192, llama32_rope(), false);
constexpr int kBatch = 2, kSeqLen = 13;  // 26 rows: partial LayerNorm (8-row) and warp blocks
constexpr int kSteps = 3, kMicroSteps = 2;

// Everything a short training run produces, as raw bits.
struct Trace {
  std::vector<float> losses;               // every micro-step
  std::vector<float> norms;                // every optimizer step
  std::vector<std::vector<float>> grads;   // accumulated gradients before every update
  std::vector<float> params;               // after the last step
  float eval_loss = 0;                     // forward() after the last step
  std::vector<float> eval_logits;
};

template <typename T>
Trace train(const ModelConfig& config, int recompute, size_t* activation_bytes) {
  Transformer<T> model(config, kBatch, kSeqLen, recompute);
  *activation_bytes = model.activation_bytes();
  model.init_random(42);
  OptimizerSettings opt;
  opt.weight_decay = 0.1f;
  opt.seed = 5;
  const size_t rows = static_cast<size_t>(kBatch) * kSeqLen;
  Trace trace;
  for (int step = 1; step <= kSteps; ++step) {
    model.zero_grad();
    for (int micro = 0; micro < kMicroSteps; ++micro) {
      const std::vector<int> tokens = test::random_tokens(rows + 1, config.vocab_size, 100 * step + micro);
      const std::vector<int> inputs(tokens.begin(), tokens.end() - 1), targets(tokens.begin() + 1, tokens.end());
      model.forward_backward(inputs.data(), targets.data(), kMicroSteps);
      trace.losses.push_back(model.mean_loss());
    }
    trace.grads.push_back(model.gradients());
    trace.norms.push_back(test::optimizer_step(model, opt, 1e-2f, step));
  }
  trace.params = model.parameters();
  const std::vector<int> tokens = test::random_tokens(rows + 1, config.vocab_size, 999);
  const std::vector<int> inputs(tokens.begin(), tokens.end() - 1), targets(tokens.begin() + 1, tokens.end());
  trace.eval_loss = model.forward(inputs.data(), targets.data());
  trace.eval_logits = model.logits();
  return trace;
}

// The first parameter tensor whose values differ in any bit from `want` ("" if none).
std::string first_differing_tensor(const std::vector<float>& got, const std::vector<float>& want,
                                   const ParameterLayout& layout) {
  if (got.size() != want.size()) return "(size)";
  for (int i = 0; i < kNumParameterTensors; ++i) {
    const ParameterInfo& t = layout[i];
    if (std::memcmp(got.data() + t.offset, want.data() + t.offset, t.count * sizeof(float)) != 0) return t.name;
  }
  return "";
}

template <typename T> DType dtype_of() { return std::is_same<T, float>::value ? DType::fp32 : DType::bf16; }

}  // namespace

TEMPLATE_TEST_CASE("recompute 1-3: losses, every gradient, norms and weights bit-identical to 0", "[recompute]", float,
                   bf16) {
  const ModelConfig config = GENERATE(kTiny, kTinyLlama);
  INFO(describe(config));
  const ParameterLayout layout(config);
  size_t bytes0 = 0;
  const Trace want = train<TestType>(config, 0, &bytes0);
  CHECK(bytes0 == model_activation_bytes(config, kBatch, kSeqLen, 0, dtype_of<TestType>()).total());
  // The run is not degenerate: it learns (weights move, gradients change from step to step).
  REQUIRE(!test::same_bits(want.grads[0], want.grads[1]));
  REQUIRE(want.eval_loss == want.eval_loss);

  // The comparison sees a single bit: one gradient element of one tensor one ulp off.
  std::vector<float> nudged = want.grads[0];
  const size_t k = layout[kLn1w].offset + 3;
  nudged[k] = std::nextafter(nudged[k], 1.0f);
  CHECK(first_differing_tensor(nudged, want.grads[0], layout) == "ln1w");

  size_t previous_bytes = bytes0;
  for (int recompute = 1; recompute <= kRecomputeMax; ++recompute) {
    INFO("recompute " << recompute);
    size_t bytes = 0;
    const Trace got = train<TestType>(config, recompute, &bytes);
    // The allocation is what the formula says and shrinks with every setting.
    CHECK(bytes == model_activation_bytes(config, kBatch, kSeqLen, recompute, dtype_of<TestType>()).total());
    CHECK(bytes < previous_bytes);
    previous_bytes = bytes;

    CHECK(test::same_bits(got.losses, want.losses));
    CHECK(test::same_bits(got.norms, want.norms));
    for (int step = 0; step < kSteps; ++step) {
      INFO("gradients before update " << step + 1);
      CHECK(first_differing_tensor(got.grads[step], want.grads[step], layout) == "");
    }
    CHECK(first_differing_tensor(got.params, want.params, layout) == "");
    CHECK(std::memcmp(&got.eval_loss, &want.eval_loss, sizeof(float)) == 0);
    CHECK(test::same_bits(got.eval_logits, want.eval_logits));
  }
}

TEST_CASE("recompute: activation bytes of GPT-2 124M at B=8, T=1024", "[recompute]") {
  const ModelConfig d12 = model_preset("d12");
  const int B = 8, T = 1024;
  const size_t N = static_cast<size_t>(B) * T, C = 768, L = 12, NH = 12, Vp = 50304;
  // Per row of the micro-batch, written out tensor by tensor. T-typed elements a block keeps for
  // each layer: ln1 C, qkv 3C, attention output C, residual2 C, ln2 C, fch 4C, fch_gelu 4C and
  // its output residual3 C; fp32: mean and rstd of ln1 and ln2 (4) and the lse (NH).
  struct Setting {
    size_t kept_t, kept_f;    // per layer, L times
    size_t slice_t, slice_f;  // one layer-sized slice reused by all layers
  };
  const Setting settings[4] = {
      {16 * C, 4 + NH, 0, 0},                       // 0: everything
      {12 * C, 4 + NH, 4 * C, 0},                   // 1: fch_gelu recomputed
      {10 * C, 4 + NH, 4 * C + 2 * C, 0},           // 2: and ln1, ln2
      {C, 0, 15 * C, 4 + NH},                       // 3: residual3 only; all the rest in one slice
  };
  // Independent of the setting: per row lnf C, branch C, dresidual C, dwide 4C (T); lnf mean and
  // rstd, loss (fp32); input and target tokens (int); logits Vp (T) for one lm-head chunk of
  // min(N, kLogitsChunkRows) = 8,192 rows.
  // The scratch and the encoder-gradient bucket list are sized by the kernels' own functions.
  const size_t scratch = std::max({layernorm_backward_scratch_bytes(static_cast<int>(N), static_cast<int>(C)),
                                   attention_backward_scratch_bytes(B, T, static_cast<int>(NH)),
                                   encoder_backward_scratch_bytes(B, T, static_cast<int>(C)),
                                   global_norm_scratch_bytes()});
  const size_t fixed_bytes = scratch + sizeof(float) + encoder_backward_buckets_bytes(B, T);
  for (DType dtype : {DType::fp32, DType::bf16}) {
    const size_t t = dtype == DType::fp32 ? 4 : 2;
    size_t blocks[4], totals[4];
    for (int r = 0; r <= kRecomputeMax; ++r) {
      INFO((dtype == DType::fp32 ? "fp32" : "bf16") << ", recompute " << r);
      const Setting& s = settings[r];
      // encoded (the input of layer 0) + L kept layers + the one-layer slice.
      const size_t want_blocks = N * (t * (C + L * s.kept_t + s.slice_t) + 4 * (L * s.kept_f + s.slice_f));
      const size_t want_other = N * (t * 7 * C + 4 * 3 + 4 * 2) + t * 8192 * Vp + fixed_bytes;
      const ActivationBytes got = model_activation_bytes(d12, B, T, r, dtype);
      CHECK(got.blocks == want_blocks);
      CHECK(got.other == want_other);
      CHECK(got.total() == want_blocks + want_other);
      blocks[r] = got.blocks;
      totals[r] = got.total();
    }
    CHECK(blocks[1] < blocks[0]);
    CHECK(blocks[2] < blocks[1]);
    CHECK(blocks[3] * 4 <= blocks[0]);
    CHECK(totals[3] * 2 <= totals[0]);  // the fixed part holds the 8,192-row logits chunk (TRAINING.md: 2.6x)
  }
  // bf16: 2322 MiB of block activations at 0, 1794 at 1, 1530 at 2, 336 at 3 (6.9x less).
  CHECK(model_activation_bytes(d12, B, T, 0, DType::bf16).blocks >> 20 == 2322);
  CHECK(model_activation_bytes(d12, B, T, 1, DType::bf16).blocks >> 20 == 1794);
  CHECK(model_activation_bytes(d12, B, T, 2, DType::bf16).blocks >> 20 == 1530);
  CHECK(model_activation_bytes(d12, B, T, 3, DType::bf16).blocks >> 20 == 336);
  // All activations, bf16: 3193 MiB at 0, 1207 MiB at 3 (2.6x less; TRAINING.md, the 8,192-row logits chunk included).
  CHECK(model_activation_bytes(d12, B, T, 0, DType::bf16).total() >> 20 == 3193);
  CHECK(model_activation_bytes(d12, B, T, 3, DType::bf16).total() >> 20 == 1207);
}

TEST_CASE("recompute: bad settings are refused with one clear line", "[recompute]") {
  auto error_of = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const std::exception& e) {
      return e.what();
    }
    return "";
  };
  CHECK(error_of([] { Transformer<float>(kTiny, 1, 8, 4); }) == "recompute: expected 0, 1, 2 or 3, found 4");
  CHECK(error_of([] { Transformer<bf16>(kTiny, 1, 8, -1); }) == "recompute: expected 0, 1, 2 or 3, found -1");
  CHECK(error_of([] { model_activation_bytes(kTiny, 1, 8, 7, DType::bf16); }) ==
        "recompute: expected 0, 1, 2 or 3, found 7");

  // The flag: default kRecomputeDefault, range 0..3, also as a JSON key.
  const TrainConfig defaults;
  CHECK(defaults.recompute == kRecomputeDefault);
  const char* ok[] = {"train_gpt", "--recompute", "3"};
  CHECK(parse_args(3, ok).config.recompute == 3);
  const char* high[] = {"train_gpt", "--recompute", "4"};
  CHECK(error_of([&] { parse_args(3, high); }) == "--recompute: expected an integer in [0, 3], got '4'");
  const char* text[] = {"train_gpt", "--recompute=all"};
  CHECK(error_of([&] { parse_args(2, text); }) == "--recompute: expected an integer in [0, 3], got 'all'");
  CHECK(Transformer<float>(kTiny, 1, 8).recompute() == kRecomputeDefault);
}
