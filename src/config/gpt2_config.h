// gpt2_config.h — what a GPT-2 model is: its architecture (GPT2Config), the presets, the checks
// that the kernels can run it, the storage dtype, and the parameter layout (the llm.c tensor order
// of docs/FORMATS.md: one contiguous buffer, so a model file body, a ZeRO shard or an all-reduce is
// a plain slice).
#pragma once
#include "src/base/rng.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

// Storage type of parameters, activations and gradients. The values are the state file's dtype
// code (docs/CHECKPOINTS.md).
// --bucket-mib's default: large enough for NCCL's bandwidth, small enough to overlap the backward.
constexpr double kDefaultBucketMiB = 32.0;

enum class DType : uint32_t { fp32 = 0, bf16 = 1 };

inline const char* dtype_name(DType d) { return d == DType::bf16 ? "bf16" : "fp32"; }
// The DType a --dtype / --save-dtype value names (the flags accept only "fp32" and "bf16").
inline DType dtype_named(const std::string& name) { return name == "fp32" ? DType::fp32 : DType::bf16; }

struct GPT2Config {
  int max_seq_len = 0;        // rows of wpe (maxT)
  int vocab_size = 0;         // V: real tokens
  int padded_vocab_size = 0;  // Vp >= V: rows of wte / columns of the logits; rows V..Vp-1 stay zero
  int num_layers = 0;         // L
  int num_heads = 0;          // NH
  int channels = 0;           // C
};

inline bool operator==(const GPT2Config& a, const GPT2Config& b) {
  return a.max_seq_len == b.max_seq_len && a.vocab_size == b.vocab_size &&
         a.padded_vocab_size == b.padded_vocab_size && a.num_layers == b.num_layers &&
         a.num_heads == b.num_heads && a.channels == b.channels;
}
inline bool operator!=(const GPT2Config& a, const GPT2Config& b) { return !(a == b); }

// "L=12 NH=12 C=768 maxT=1024 V=50257 Vp=50304"
inline std::string describe(const GPT2Config& c) {
  return "L=" + std::to_string(c.num_layers) + " NH=" + std::to_string(c.num_heads) + " C=" +
         std::to_string(c.channels) + " maxT=" + std::to_string(c.max_seq_len) + " V=" + std::to_string(c.vocab_size) +
         " Vp=" + std::to_string(c.padded_vocab_size);
}

struct GPT2Preset {
  const char* name;
  GPT2Config config;
};

// GPT-2 sizes (124M, 350M, 774M, 1.5B) and two small models on the GPT-2 vocabulary that train
// on the CPU build.
inline const std::vector<GPT2Preset>& gpt2_presets() {
  static const std::vector<GPT2Preset> presets = {
      {"nano", {128, 50257, 50304, 2, 4, 64}},     {"micro", {256, 50257, 50304, 4, 4, 128}},
      {"d12", {1024, 50257, 50304, 12, 12, 768}},  {"d24", {1024, 50257, 50304, 24, 16, 1024}},
      {"d36", {1024, 50257, 50304, 36, 20, 1280}}, {"d48", {1024, 50257, 50304, 48, 25, 1600}},
  };
  return presets;
}

inline std::vector<std::string> gpt2_preset_names() {
  std::vector<std::string> names;
  for (const GPT2Preset& p : gpt2_presets()) names.push_back(p.name);
  return names;
}

inline GPT2Config gpt2_preset(const std::string& name) {
  std::string valid;
  for (const GPT2Preset& p : gpt2_presets()) {
    if (name == p.name) return p.config;
    valid += (valid.empty() ? "" : ", ") + std::string(p.name);
  }
  throw std::invalid_argument("unknown model preset '" + name + "' (valid: " + valid + ")");
}

// Throws unless the kernels can run this configuration: C = NH·HS with the head size HS a
// multiple of 8 and at most 128 (attention), which also makes C a multiple of 8 (matmul,
// 128-bit row accesses); 1 <= V <= Vp with Vp a multiple of 8 (lm-head matmul, classifier).
// `source` names where the configuration came from (a file, a flag).
inline void gpt2_check_config(const GPT2Config& c, const std::string& source) {
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

// ---------------------------------------------------------------------------------------
// Parameter layout (llm.c order; docs/FORMATS.md).

enum ParameterTensor : int {
  kWte, kWpe, kLn1w, kLn1b, kQkvw, kQkvb, kAttprojw, kAttprojb,
  kLn2w, kLn2b, kFcw, kFcb, kFcprojw, kFcprojb, kLnfw, kLnfb,
  kNumParameterTensors
};

// Whether tensor i has one slice per layer (ln1w .. fcprojb) rather than one for the whole model.
inline bool is_layer_tensor(int i) { return i >= kLn1w && i <= kFcprojb; }

struct ParameterInfo {
  const char* name = "";
  size_t count = 0;      // elements
  size_t offset = 0;     // elements from the start of the parameter buffer
  bool decayed = false;  // 2-D weight matrix: AdamW applies weight decay
};

struct ParameterLayout {
  std::array<ParameterInfo, kNumParameterTensors> tensors{};
  size_t total = 0;
  size_t num_layers = 0, vocab_size = 0, channels = 0;

  ParameterLayout() = default;
  explicit ParameterLayout(const GPT2Config& c) : num_layers(c.num_layers), vocab_size(c.vocab_size), channels(c.channels) {
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
  const ParameterInfo& operator[](int i) const { return tensors[i]; }

  // Elements of one slice of tensor i: a layer's for per-layer tensors, else the whole tensor.
  size_t slice_count(int i) const { return is_layer_tensor(i) ? tensors[i].count / num_layers : tensors[i].count; }
  // Where layer `layer`'s slice of tensor i starts (layer ignored for wte, wpe, lnf).
  size_t slice_offset(int i, int layer) const {
    return tensors[i].offset + (is_layer_tensor(i) ? slice_count(i) * static_cast<size_t>(layer) : 0);
  }
};

// GPT-2's initial values of tensor i, drawn from `normal` in llm.c tensor order (call for i = 0,
// 1, ... in turn): weights N(0, 0.02), the residual-branch projections attprojw and fcprojw
// N(0, 0.02/sqrt(2L)), biases 0, LayerNorm weights 1 and biases 0, wte's padding rows 0 (not drawn).
inline std::vector<float> gpt2_initial_values(const ParameterLayout& layout, int i, NormalSampler& normal) {
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
      for (size_t k = 0; k < drawn; ++k) values[k] = static_cast<float>(normal.next()) * stddev;
    }
  }
  return values;
}
