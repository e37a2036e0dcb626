// model_config.cpp — model configurations (GPT-2's and Llama 3's), presets and checks; the parameter layout
#include "src/config/model_config.h"

#include "src/base/rng.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

bool operator==(const ModelConfig& a, const ModelConfig& b) {
  return a.max_seq_len == b.max_seq_len && a.vocab_size == b.vocab_size &&
         a.padded_vocab_size == b.padded_vocab_size && a.num_layers == b.num_layers &&
         a.num_heads == b.num_heads && a.channels == b.channels && a.kv_heads() == b.kv_heads() &&
         a.hidden() == b.hidden() && a.norm == b.norm && a.norm_eps == b.norm_eps && a.positions == b.positions &&
         (a.positions != Positions::rope || a.rope == b.rope) && a.mlp == b.mlp && a.biases == b.biases &&
         a.tied_embeddings == b.tied_embeddings && a.num_experts == b.num_experts &&
         a.experts_per_token == b.experts_per_token && (!a.moe() || a.router == b.router);
}

namespace {
std::string number_text(float v) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", static_cast<double>(v));
  return text;
}
}  // namespace

std::string describe(const ModelConfig& c) {
  std::string text = "L=" + std::to_string(c.num_layers) + " NH=" + std::to_string(c.num_heads) + " C=" +
                     std::to_string(c.channels) + " maxT=" + std::to_string(c.max_seq_len) + " V=" +
                     std::to_string(c.vocab_size) + " Vp=" + std::to_string(c.padded_vocab_size);
  if (!c.is_llama()) return text;
  text += " NKV=" + std::to_string(c.kv_heads()) + " H=" + std::to_string(c.hidden()) + " llama3 (rope theta " +
          number_text(c.rope.theta);
  if (c.rope.scaled) text += " factor " + number_text(c.rope.factor);
  text += c.tied_embeddings ? ", tied)" : ", untied)";
  if (!c.moe()) return text;
  return text + " E=" + std::to_string(c.num_experts) + " K=" + std::to_string(c.experts_per_token) + " " +
         router_name(c.router) + " router";
}

int llama_hidden_size(int channels, float ffn_dim_multiplier, int multiple_of) {
  int hidden = static_cast<int>(2.0 * 4 * channels / 3);
  hidden = static_cast<int>(ffn_dim_multiplier * static_cast<float>(hidden));
  return multiple_of * ((hidden + multiple_of - 1) / multiple_of);
}

RopeConfig llama31_rope() { return RopeConfig{500000.0f, true, 8.0f, 1.0f, 4.0f, 8192}; }
RopeConfig llama32_rope() { return RopeConfig{500000.0f, true, 32.0f, 1.0f, 4.0f, 8192}; }

ModelConfig llama3_config(int max_seq_len, int vocab_size, int num_layers, int num_heads, int num_kv_heads,
                          int channels, int hidden_size, const RopeConfig& rope, bool tied_embeddings) {
  ModelConfig c{max_seq_len, vocab_size, vocab_size, num_layers, num_heads, channels};
  c.num_kv_heads = num_kv_heads;
  c.hidden_size = hidden_size;
  c.norm = Norm::rmsnorm;
  c.norm_eps = 1e-5f;
  c.positions = Positions::rope;
  c.rope = rope;
  c.mlp = Mlp::swiglu;
  c.biases = false;
  c.tied_embeddings = tied_embeddings;
  return c;
}

ModelConfig with_experts(ModelConfig dense, int num_experts, int experts_per_token, Router router,
                         float aux_loss_coef) {
  dense.num_experts = num_experts;
  dense.experts_per_token = experts_per_token;
  dense.router = router;
  dense.aux_loss_coef = aux_loss_coef;
  return dense;
}

const std::vector<ModelPreset>& model_presets() {
  static const std::vector<ModelPreset> presets = {
      {"nano", {128, 50257, 50304, 2, 4, 64}},     {"micro", {256, 50257, 50304, 4, 4, 128}},
      {"d12", {1024, 50257, 50304, 12, 12, 768}},  {"d24", {1024, 50257, 50304, 24, 16, 1024}},
      {"d36", {1024, 50257, 50304, 36, 20, 1280}}, {"d48", {1024, 50257, 50304, 48, 25, 1600}},
      // GPT-3's sizes (Brown et al. 2020, table 2.1) with dense attention and GPT-2's vocabulary;
      // XL and 13B are left out: the table's heads x head size is not their width.
      {"gpt3-125m", {2048, 50257, 50304, 12, 12, 768}},  {"gpt3-350m", {2048, 50257, 50304, 24, 16, 1024}},
      {"gpt3-760m", {2048, 50257, 50304, 24, 16, 1536}}, {"gpt3-2.7b", {2048, 50257, 50304, 32, 32, 2560}},
      {"gpt3-6.7b", {2048, 50257, 50304, 32, 32, 4096}}, {"gpt3-175b", {2048, 50257, 50304, 96, 96, 12288}},
      // Llama 3 (Meta's params.json: dim, n_layers, n_heads, n_kv_heads, ffn_dim_multiplier,
      // multiple_of; 3.2 ties the embeddings) at their 131,072-token context, and two small ones.
      {"llama-nano", llama3_config(128, 128256, 2, 4, 2, 64, 192, llama32_rope(), true)},
      {"llama-micro", llama3_config(256, 128256, 4, 4, 1, 128, llama_hidden_size(128, 1.0f, 64), llama31_rope(),
                                    false)},
      {"llama3.2-1b", llama3_config(131072, 128256, 16, 32, 8, 2048, llama_hidden_size(2048, 1.5f, 256),
                                    llama32_rope(), true)},
      {"llama3.2-3b", llama3_config(131072, 128256, 28, 24, 8, 3072, llama_hidden_size(3072, 1.0f, 256),
                                    llama32_rope(), true)},
      {"llama3.1-8b", llama3_config(131072, 128256, 32, 32, 8, 4096, llama_hidden_size(4096, 1.3f, 1024),
                                    llama31_rope(), false)},
      {"llama3.1-70b", llama3_config(131072, 128256, 80, 64, 8, 8192, llama_hidden_size(8192, 1.3f, 4096),
                                     llama31_rope(), false)},
      {"llama3.1-405b", llama3_config(131072, 128256, 126, 128, 8, 16384, llama_hidden_size(16384, 1.2f, 4096),
                                      llama31_rope(), false)},
      // Mixtures of experts: a small one that trains on the CPU build, and two published shapes
      // (their config.json) for --plan: OLMoE-1B-7B (without its QK norm) and Mixtral 8x7B.
      {"moe-nano", with_experts(llama3_config(128, 128256, 2, 4, 2, 64, 96, llama32_rope(), true), 4, 2,
                                Router::softmax, 0.01f)},
      {"olmoe-1b-7b", with_experts(llama3_config(4096, 50304, 16, 16, 16, 2048, 1024, RopeConfig{10000.0f}, false),
                                   64, 8, Router::softmax, 0.01f)},
      {"mixtral-8x7b", with_experts(llama3_config(32768, 32000, 32, 32, 8, 4096, 14336, RopeConfig{1e6f}, false), 8,
                                    2, Router::softmax, 0.02f)},
  };
  return presets;
}

std::vector<std::string> model_preset_names() {
  std::vector<std::string> names;
  for (const ModelPreset& p : model_presets()) names.push_back(p.name);
  return names;
}

ModelConfig model_preset(const std::string& name) {
  std::string valid;
  for (const ModelPreset& p : model_presets()) {
    if (name == p.name) return p.config;
    valid += (valid.empty() ? "" : ", ") + std::string(p.name);
  }
  throw std::invalid_argument("unknown model preset '" + name + "' (valid: " + valid + ")");
}

void check_model_config(const ModelConfig& c, const std::string& source) {
  auto fail = [&](const std::string& what) {
    throw std::runtime_error(source + ": " + what + " (got " + describe(c) + ")");
  };
  if (c.max_seq_len < 1 || c.vocab_size < 1 || c.num_layers < 1 || c.num_heads < 1 || c.channels < 1)
    fail("expected maxT, V, L, NH and C to be positive");
  if (c.channels % c.num_heads != 0) fail("expected C divisible by NH");
  const int head_size = c.channels / c.num_heads;
  if (head_size % 8 != 0 || head_size > 128) fail("expected head size C/NH a multiple of 8 and at most 128");
  if (c.padded_vocab_size < c.vocab_size || c.padded_vocab_size % 8 != 0)
    fail("expected padded vocab Vp >= V and a multiple of 8");
  if (c.num_kv_heads < 0 || c.num_heads % c.kv_heads() != 0) fail("expected NH a multiple of the K/V heads NKV");
  if (c.hidden_size < 0 || c.hidden() % 8 != 0) fail("expected the MLP's hidden size H a multiple of 8");
  const bool gpt2 = c.norm == Norm::layernorm && c.positions == Positions::learned && c.mlp == Mlp::gelu && c.biases &&
                    c.tied_embeddings && c.kv_heads() == c.num_heads && c.hidden() == 4 * c.channels;
  const bool llama = c.norm == Norm::rmsnorm && c.positions == Positions::rope && c.mlp == Mlp::swiglu && !c.biases;
  if (!gpt2 && !llama)
    fail("expected GPT-2's architecture (LayerNorm, learned positions, GELU, biases, tied, NKV = NH, H = 4C) or "
         "Llama 3's (RMSNorm, RoPE, SwiGLU, no biases)");
  if (llama && !(c.norm_eps > 0.0f && c.rope.theta > 0.0f))
    fail("expected a positive RMSNorm eps and RoPE theta");
  if (c.moe() && !llama) fail("expected experts (E > 0) only on Llama 3's architecture");
  if (c.num_experts < 0 || c.num_experts > kMaxExperts)
    fail("expected the experts E between 0 and " + std::to_string(kMaxExperts));
  if (c.moe() && (c.experts_per_token < 1 || c.experts_per_token > c.num_experts))
    fail("expected experts per token K between 1 and E");
  if (!c.moe() && c.experts_per_token != 0) fail("expected experts per token K = 0 without experts");
  if (c.moe() && c.router == Router::sigmoid && c.num_experts % 8 != 0)  // E bias values per layer
    fail("expected E a multiple of 8 with the sigmoid router (its per-layer expert bias keeps the parameter and "
         "gradient buffers 16-byte aligned)");
  if (c.moe() && !(c.aux_loss_coef >= 0.0f && std::isfinite(c.aux_loss_coef)))
    fail("expected a finite, non-negative auxiliary loss coefficient");
  if (llama && c.rope.scaled &&
      !(c.rope.factor > 0.0f && c.rope.high_freq_factor > c.rope.low_freq_factor && c.rope.original_context > 0))
    fail("expected RoPE scaling with factor > 0, high_freq_factor > low_freq_factor and an original context > 0");
}

ParameterLayout::ParameterLayout(const ModelConfig& c) : num_layers(c.num_layers), vocab_size(c.vocab_size), channels(c.channels) {
  const size_t L = c.num_layers, C = c.channels, Vp = c.padded_vocab_size, H = c.hidden(), QKV = c.qkv_channels();
  const size_t wpe = c.positions == Positions::learned ? c.max_seq_len * C : 0;
  const size_t norm_bias = c.norm == Norm::layernorm ? 1 : 0, bias = c.biases ? 1 : 0;
  const size_t fc2 = c.mlp == Mlp::swiglu ? 1 : 0, lm_head = c.tied_embeddings ? 0 : 1;
  // E experts' MLPs stacked (1 for the dense MLP); the router (E × C) and expert_bias (E) with experts.
  const size_t E = c.experts(), router = c.moe() ? c.num_experts : 0,
               expert_bias = c.moe() && c.router == Router::sigmoid ? c.num_experts : 0;
  const struct { const char* name; size_t count; bool decayed; } specs[kNumParameterTensors] = {
      {"wte", Vp * C, true},          {"wpe", wpe, true},               {"ln1w", L * C, false},
      {"ln1b", norm_bias * L * C, false}, {"qkvw", L * QKV * C, true},  {"qkvb", bias * L * QKV, false},
      {"attprojw", L * C * C, true},  {"attprojb", bias * L * C, false}, {"ln2w", L * C, false},
      {"ln2b", norm_bias * L * C, false}, {"router", L * router * C, true}, {"fcw", L * E * H * C, true},
      {"fcb", bias * L * H, false},   {"fc2w", fc2 * L * E * H * C, true}, {"fcprojw", L * E * C * H, true},
      {"fcprojb", bias * L * C, false}, {"expert_bias", L * expert_bias, false}, {"lnfw", C, false},
      {"lnfb", norm_bias * C, false}, {"lm_head", lm_head * Vp * C, true},
  };
  for (int i = 0; i < kNumParameterTensors; ++i) {
    tensors[i] = ParameterInfo{specs[i].name, specs[i].count, total, specs[i].decayed};
    total += specs[i].count;
  }
}

std::vector<float> initial_values(const ParameterLayout& layout, int i, NormalSampler& normal) {
  std::vector<float> values(layout[i].count, 0.0f);
  switch (i) {
    case kLn1w: case kLn2w: case kLnfw:
      std::fill(values.begin(), values.end(), 1.0f);
      break;
    case kLn1b: case kLn2b: case kLnfb: case kQkvb: case kAttprojb: case kFcb: case kFcprojb: case kExpertBias:
      break;
    default: {
      const float residual_std = 0.02f / std::sqrt(2.0f * static_cast<float>(layout.num_layers));
      const float stddev = (i == kAttprojw || i == kFcprojw) ? residual_std : 0.02f;
      const bool vocabulary_rows = i == kWte || i == kLmHead;
      const size_t drawn = vocabulary_rows ? std::min(values.size(), static_cast<size_t>(layout.vocab_size) * layout.channels)
                                           : values.size();
      normal.fill(values.data(), drawn, stddev);
    }
  }
  return values;
}
