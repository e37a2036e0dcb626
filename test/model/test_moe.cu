// The whole model with mixture-of-experts MLPs (src/model/expert_mlp.h) against PyTorch:
// dev/mixtral_reference.py (Hugging Face Mixtral's arithmetic: softmax router, top-2 of 4 experts
// with the gates renormalised, the load-balancing loss pooled over the layers) computes, for a
// tiny Mixtral-style Llama (L=2 NH=4 NKV=2 C=64 H=192 per expert, V=250 padded to 256, B=2 T=37),
// the step-1 logits, objective and gradients and 8 steps of clipped AdamW:
//   build/reference/mixtral:       the objective cross-entropy + 0.02 · aux;
//   build/reference/mixtral-noaux: cross-entropy alone;
//   build/reference/mixtral-sigmoid: DeepSeek-V3's sigmoid router over E=8 experts (no aux loss)
//   and its balancing bias, moved by ± 0.01 after each AdamW step from the step's counts per layer
//   (from step 2 on it changes some rows' choices).
// Routing is dropless: some experts get 2 to 5 of the 74 rows at step 1, and at later steps some
// get none. The reference keeps every routing decision away from a tie by more than fp32's error.
//
// Checked: logits, cross-entropy and the auxiliary loss at step 1, every gradient (the router's and
// the experts' included), 8 steps' losses and gradient norms and the final parameters (fp32); the
// bf16 model's losses; every --recompute setting gives the same bits; the step's expert counts; the
// model file round trip.
#include "test/reference_file.h"
#include "src/gen/generate.h"

#include <cmath>
#include <cstring>
#include <numeric>

#include <unistd.h>

namespace {

const std::vector<std::string> kReferenceDirs = {"build/reference/mixtral", "build/reference/mixtral-noaux",
                                                 "build/reference/mixtral-sigmoid"};

// reference.bin version 3: version 2's slots, then E, K, the router kind and the aux coefficient's bits (20-23).
ModelConfig mixtral_reference_config(const int32_t* h) {
  return with_experts(llama_reference_config(h), h[20], h[21], h[22] == 1 ? Router::sigmoid : Router::softmax,
                      float_of(h[23]));
}

// A reference's sections after the final parameters: cross-entropy and aux loss per step.
struct MoeReference {
  Reference r;
  std::vector<float> ce, aux;
  float bias_rate = 0.0f;  // header slot 24: the sigmoid router's --bias-rate
};

float header_float(const std::string& dir, int slot) {
  const std::string bin = read_file(dir + "/reference.bin");
  int32_t bits = 0;
  std::memcpy(&bits, bin.data() + slot * sizeof(int32_t), sizeof(bits));
  return float_of(bits);
}

const std::vector<MoeReference>& references() {
  static const std::vector<MoeReference> all = [] {
    std::vector<MoeReference> v;
    for (const std::string& dir : kReferenceDirs) {
      MoeReference m{load_reference(dir, 3, mixtral_reference_config), {}, {}};
      const size_t K = m.r.K;
      m.ce.assign(m.r.more.begin(), m.r.more.begin() + K);
      m.aux.assign(m.r.more.begin() + K, m.r.more.begin() + 2 * K);
      m.bias_rate = header_float(dir, 24);
      v.push_back(m);
    }
    return v;
  }();
  return all;
}

std::string temp_path(const std::string& name) { return "build/test_moe_" + std::to_string(getpid()) + "_" + name; }

}  // namespace

TEMPLATE_TEST_CASE("MoE step 1 matches PyTorch: logits, losses, every gradient", "[moe]", float, bf16) {
  for (const MoeReference& m : references()) {
    const Reference& r = m.r;
    INFO(r.dir);
    REQUIRE(r.config.moe());
    REQUIRE(read_model_header(r.model_path()) == r.config);
    REQUIRE(ParameterLayout(r.config).total == r.P);
    Transformer<TestType> model(r.config, r.B, r.T);
    model.load(r.model_path());
    const Batch b = batch(r, 0);

    const float loss = model.forward(b.inputs.data(), b.targets.data());
    INFO("cross-entropy " << loss << " vs PyTorch " << m.ce[0]);
    CHECK(std::fabs(loss - m.ce[0]) <= loss_tolerance<TestType>() * m.ce[0]);
    const double logit_tol = std::is_same<TestType, float>::value ? 1e-5 : 1e-2;
    // bf16's router input moves sigmoid scores by ~1e-3, more than the sigmoid reference's 2.9e-4
    // margin from a tie: a row may pick another expert, so bf16 checks its loss alone there.
    if (std::is_same<TestType, float>::value || r.config.router == Router::softmax)
      CHECK(test::all_close("logits", model.logits(), r.logits, logit_tol, logit_tol));

    model.zero_grad();
    model.forward_backward(b.inputs.data(), b.targets.data(), 1);
    CHECK(model.mean_loss() == loss);
    const double aux = model.expert_stats().aux_loss();
    INFO("aux loss " << aux << " vs PyTorch " << m.aux[0]);
    CHECK(std::fabs(aux - m.aux[0]) <= loss_tolerance<TestType>() * m.aux[0]);
    // Every (row, k) of every layer went to some expert.
    const std::vector<int64_t>& tokens = model.expert_stats().tokens;
    CHECK(std::accumulate(tokens.begin(), tokens.end(), int64_t{0}) ==
          int64_t{r.config.num_layers} * r.B * r.T * r.config.experts_per_token);
    if (!std::is_same<TestType, float>::value) continue;  // bf16 may route a near-tied row elsewhere
    const std::vector<float> grads = model.gradients();
    const ParameterLayout& layout = model.layout();
    for (int i = 0; i < kNumParameterTensors; ++i) {
      if (i == kExpertBias) {  // no gradient: the bias only selects (and PyTorch's is 0 too)
        for (size_t j = layout[i].offset; j < layout[i].offset + layout[i].count; ++j) CHECK(grads[j] == 0.0f);
        continue;
      }
      const double err = tensor_relative_error(grads, r.grads, layout[i]);
      INFO("gradient of " << layout[i].name << ": relative error " << err);
      CHECK(err <= gradient_tolerance<TestType>(i));
    }
  }
}

TEST_CASE("MoE 8 AdamW steps match PyTorch: cross-entropy, aux loss, norms, final parameters", "[moe]") {
  for (const MoeReference& m : references()) {
    const Reference& r = m.r;
    INFO(r.dir);
    Transformer<float> model(r.config, r.B, r.T);
    model.load(r.model_path());
    OptimizerSettings opt = r.opt;
    opt.expert_bias_rate = m.bias_rate;
    for (int k = 0; k < r.K; ++k) {
      const Batch b = batch(r, k);
      model.zero_grad();
      model.forward_backward(b.inputs.data(), b.targets.data(), 1);
      const float loss = model.mean_loss();
      const double aux = model.expert_stats().aux_loss();
      const float norm = test::optimizer_step(model, opt, r.lr, k + 1);
      INFO("step " << k + 1 << ": cross-entropy " << loss << " vs " << m.ce[k] << ", aux " << aux << " vs " << m.aux[k]
                   << ", norm " << norm << " vs " << r.norms[k]);
      CHECK(std::fabs(loss - m.ce[k]) <= 1e-5 * m.ce[k]);
      CHECK(std::fabs(aux - m.aux[k]) <= 1e-5 * m.aux[k]);  // 0 = 0 for the sigmoid router
      CHECK(std::fabs(norm - r.norms[k]) <= 1e-5 * r.norms[k]);
    }
    // Within Llama's bound (test_llama.cu): absolute 2e-5. Measured 1.7e-6 at most, which is 1.3e-5 to
    // 2.6e-5 of the largest weight of each expert tensor: an expert routed 2 rows has small gradients,
    // whose few-ulp errors AdamW's m/√v normalises up to the size of a full step.
    CHECK(test::all_close("final parameters", model.parameters(), r.final, 0.0, 2e-5));
    if (r.config.router == Router::sigmoid) {
      // The bias moves only by ± rate in fp32 from the same integer comparisons: exactly PyTorch's,
      // and it did move (the reference keeps every choice 2.9e-4 of score + bias from a tie).
      const ParameterLayout layout(r.config);
      const ParameterInfo& t = layout[kExpertBias];
      const std::vector<float> got = model.parameters();
      bool moved = false;
      for (size_t i = t.offset; i < t.offset + t.count; ++i) {
        INFO("expert_bias[" << i - t.offset << "]");
        CHECK(got[i] == r.final[i]);
        moved = moved || r.final[i] != 0.0f;
      }
      CHECK(moved);
    }
  }
}

TEST_CASE("MoE bf16 training follows PyTorch's fp32 losses", "[moe]") {
  for (const MoeReference& m : references()) {
    const Reference& r = m.r;
    INFO(r.dir);
    Transformer<bf16> model(r.config, r.B, r.T);
    model.load(r.model_path());
    for (int k = 0; k < r.K; ++k) {
      const Batch b = batch(r, k);
      model.zero_grad();
      model.forward_backward(b.inputs.data(), b.targets.data(), 1);
      const float loss = model.mean_loss();
      test::optimizer_step(model, r.opt, r.lr, k + 1);
      INFO("step " << k + 1 << ": cross-entropy " << loss << " vs " << m.ce[k]);
      CHECK(std::fabs(loss - m.ce[k]) <= loss_tolerance<bf16>() * m.ce[k]);
    }
  }
}

TEST_CASE("MoE: every --recompute setting gives the same bits", "[moe]") {
  const Reference& r = references()[0].r;
  std::vector<float> first_grads, first_params;
  for (int recompute = 0; recompute <= kRecomputeMax; ++recompute) {
    INFO("--recompute " << recompute);
    Transformer<float> model(r.config, r.B, r.T, recompute);
    model.load(r.model_path());
    for (int k = 0; k < 2; ++k) {
      const Batch b = batch(r, k);
      model.zero_grad();
      model.forward_backward(b.inputs.data(), b.targets.data(), 1);
      if (k == 0) {
        const std::vector<float> grads = model.gradients();
        if (recompute == 0) first_grads = grads;
        else CHECK(bitwise_equal(grads, first_grads));
      }
      test::optimizer_step(model, r.opt, r.lr, k + 1);
    }
    const std::vector<float> params = model.parameters();
    if (recompute == 0) first_params = params;
    else CHECK(bitwise_equal(params, first_params));
  }
}

TEST_CASE("MoE model file: saved and loaded, the header keeps the experts", "[moe]") {
  for (const MoeReference& m : references()) {  // the sigmoid router's: kind 1 and its expert_bias
    const Reference& r = m.r;
    INFO(r.dir);
    Transformer<float> model(r.config, r.B, r.T);
    model.load(r.model_path());
    const std::string path = temp_path("model.bin");
    model.save(path);
    const ModelConfig read = read_model_header(path);
    CHECK(read == r.config);
    CHECK(read.router == r.config.router);
    CHECK(read.aux_loss_coef == r.config.aux_loss_coef);
    CHECK(read_file(path) == read_file(r.model_path()));
    std::remove(path.c_str());
  }
}

TEST_CASE("MoE presets: shapes and parameter counts", "[moe]") {
  const std::vector<std::string> names = model_preset_names();
  CHECK(std::vector<std::string>(names.end() - 3, names.end()) ==
        std::vector<std::string>{"moe-nano", "olmoe-1b-7b", "mixtral-8x7b"});
  // Mixtral 8x7B: 46.7B parameters (Mistral's count), 12.9B active per token.
  const ModelConfig mixtral = model_preset("mixtral-8x7b");
  CHECK(ParameterLayout(mixtral).total == 46702792704ULL);
  const ModelConfig olmoe = model_preset("olmoe-1b-7b");
  CHECK(olmoe.num_experts == 64);
  CHECK(olmoe.experts_per_token == 8);
  CHECK_NOTHROW(check_model_config(model_preset("moe-nano"), "moe-nano"));
}

TEST_CASE("MoE: the KV-cache decoder's logits equal the training forward's", "[moe]") {
  // The decoder (src/gen/generate.h) runs the experts over the prompt's rows, then over one row per
  // appended token (most experts then get none): each position's logits equal the full forward's.
  const Reference& r = references()[0].r;
  ModelConfig cfg;
  DeviceArray<float> params = load_model_parameters<float>(r.model_path(), &cfg);
  const Batch b = batch(r, 0);
  const int prompt = 9, T = r.T;
  KvCacheDecoder<float> decoder(cfg, params.get(), T, choose_attention("auto", DType::fp32, cfg), nullptr);
  std::vector<std::vector<float>> logits = {decoder.prefill({b.inputs.begin(), b.inputs.begin() + prompt})};
  for (int t = prompt; t < T; ++t) logits.push_back(decoder.append(b.inputs[t]));
  Transformer<float> model(cfg, 1, T);
  model.load(r.model_path());
  model.forward(b.inputs.data(), nullptr);
  const std::vector<float> full = model.logits();
  const size_t Vp = cfg.padded_vocab_size, V = cfg.vocab_size;
  for (int t = prompt - 1; t < T; ++t) {
    INFO("position " << t);
    const auto row = full.begin() + static_cast<std::ptrdiff_t>(t * Vp);
    CHECK(test::all_close("logits", logits[t - prompt + 1], std::vector<float>(row, row + V), 1e-5, 2e-6));
  }
}
