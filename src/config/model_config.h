// model_config.h — what a GPT-2 model is: its architecture (ModelConfig), the presets, the checks
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

// --bucket-mib's default: large enough for NCCL's bandwidth, small enough to overlap the backward.
constexpr double kDefaultBucketMiB = 32.0;
// ZeRO 3: buckets of parameters gathered ahead of the one computing (--zero3-prefetch), and its limit.
constexpr int kDefaultZero3Prefetch = 1, kMaxZero3Prefetch = 8;

// Storage type of parameters, activations and gradients. The values are the state file's dtype
// code (docs/CHECKPOINTS.md).
enum class DType : uint32_t { fp32 = 0, bf16 = 1 };

inline const char* dtype_name(DType d) { return d == DType::bf16 ? "bf16" : "fp32"; }
// The DType a --dtype / --save-dtype value names (the flags accept only "fp32" and "bf16").
inline DType dtype_named(const std::string& name) { return name == "fp32" ? DType::fp32 : DType::bf16; }

struct ModelConfig {
  int max_seq_len = 0;        // rows of wpe (maxT)
  int vocab_size = 0;         // V: real tokens
  int padded_vocab_size = 0;  // Vp >= V: rows of wte / columns of the logits; rows V..Vp-1 stay zero
  int num_layers = 0;         // L
  int num_heads = 0;          // NH
  int channels = 0;           // C
};

bool operator==(const ModelConfig& a, const ModelConfig& b);
inline bool operator!=(const ModelConfig& a, const ModelConfig& b) { return !(a == b); }

// "L=12 NH=12 C=768 maxT=1024 V=50257 Vp=50304"
std::string describe(const ModelConfig& c);

struct ModelPreset {
  const char* name;
  ModelConfig config;
};

// GPT-2 sizes (124M, 350M, 774M, 1.5B) and two small models on the GPT-2 vocabulary that train
// on the CPU build.
const std::vector<ModelPreset>& model_presets();

std::vector<std::string> model_preset_names();

ModelConfig model_preset(const std::string& name);

// Throws unless the kernels can run this configuration: C = NH·HS with the head size HS a
// multiple of 8 and at most 128 (attention), which also makes C a multiple of 8 (matmul,
// 128-bit row accesses); 1 <= V <= Vp with Vp a multiple of 8 (lm-head matmul, classifier).
// `source` names where the configuration came from (a file, a flag).
void check_model_config(const ModelConfig& c, const std::string& source);

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
  explicit ParameterLayout(const ModelConfig& c);
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
std::vector<float> initial_values(const ParameterLayout& layout, int i, NormalSampler& normal);
