// model_config.cpp — GPT-2 configurations, presets and checks; the parameter layout
#include "src/config/model_config.h"

#include "src/base/rng.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

bool operator==(const ModelConfig& a, const ModelConfig& b) {
  return a.max_seq_len == b.max_seq_len && a.vocab_size == b.vocab_size &&
         a.padded_vocab_size == b.padded_vocab_size && a.num_layers == b.num_layers &&
         a.num_heads == b.num_heads && a.channels == b.channels;
}

std::string describe(const ModelConfig& c) {
  return "L=" + std::to_string(c.num_layers) + " NH=" + std::to_string(c.num_heads) + " C=" +
         std::to_string(c.channels) + " maxT=" + std::to_string(c.max_seq_len) + " V=" + std::to_string(c.vocab_size) +
         " Vp=" + std::to_string(c.padded_vocab_size);
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
      {"gpt3-6.7b", {2048, 50257, 50304, 32, 32, 4096}},
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
}

ParameterLayout::ParameterLayout(const ModelConfig& c) : num_layers(c.num_layers), vocab_size(c.vocab_size), channels(c.channels) {
  const size_t L = c.num_layers, C = c.channels, Vp = c.padded_vocab_size, maxT = c.max_seq_len;
  const struct { const char* name; size_t count; bool decayed; } specs[kNumParameterTensors] = {
      {"wte", Vp * C, true},         {"wpe", maxT * C, true},     {"ln1w", L * C, false},
      {"ln1b", L * C, false},        {"qkvw", L * 3 * C * C, true}, {"qkvb", L * 3 * C, false},
      {"attprojw", L * C * C, true}, {"attprojb", L * C, false},  {"ln2w", L * C, false},
      {"ln2b", L * C, false},        {"fcw", L * 4 * C * C, true}, {"fcb", L * 4 * C, false},
      {"fcprojw", L * C * 4 * C, true}, {"fcprojb", L * C, false}, {"lnfw", C, false},
      {"lnfb", C, false},
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
    case kLn1b: case kLn2b: case kLnfb: case kQkvb: case kAttprojb: case kFcb: case kFcprojb:
      break;
    default: {
      const float residual_std = 0.02f / std::sqrt(2.0f * static_cast<float>(layout.num_layers));
      const float stddev = (i == kAttprojw || i == kFcprojw) ? residual_std : 0.02f;
      const size_t drawn = i == kWte ? static_cast<size_t>(layout.vocab_size) * layout.channels : values.size();
      normal.fill(values.data(), drawn, stddev);
    }
  }
  return values;
}
