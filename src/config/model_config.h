// model_config.h — what a model is: its shape and architecture (ModelConfig: GPT-2 and Llama 3 are
// two settings of one transformer), the presets, the checks that the kernels can run it, the
// storage dtype, and the parameter layout (the llm.c tensor order of docs/FORMATS.md: one
// contiguous buffer, so a model file body, a ZeRO shard or an all-reduce is a plain slice).
#pragma once
#include "kernels/rope_config.h"
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

// The architecture's choices, each a switch the transformer's blocks read (src/model/transformer.h).
enum class Norm : uint8_t { layernorm, rmsnorm };  // LayerNorm with weight and bias | RMSNorm (weight only)
enum class Positions : uint8_t { learned, rope };  // wpe added to the embeddings | RoPE on q and k
enum class Mlp : uint8_t { gelu, swiglu };         // fcproj(gelu(fc·x)) | fcproj(silu(fc·x) ⊙ fc2·x)
// A mixture of experts' router (docs/MOE.md): softmax over the experts, top-K, gates renormalised
// over the K (Mixtral) | sigmoid scores, top-K of score + expert bias, gates the K scores
// normalised (aux-loss-free balancing: the bias steers selection and is updated outside the gradient).
enum class Router : uint8_t { softmax, sigmoid };
inline const char* router_name(Router r) { return r == Router::sigmoid ? "sigmoid" : "softmax"; }
// The most experts a layer may have (the routing kernels' per-token work is O(E)).
constexpr int kMaxExperts = 256;

struct ModelConfig {
  int max_seq_len = 0;        // longest sequence: rows of wpe (maxT)
  int vocab_size = 0;         // V: real tokens
  int padded_vocab_size = 0;  // Vp >= V: rows of wte / columns of the logits; rows V..Vp-1 stay zero
  int num_layers = 0;         // L
  int num_heads = 0;          // NH: query heads
  int channels = 0;           // C
  // The architecture; the defaults are GPT-2's.
  int num_kv_heads = 0;  // NKV: K/V heads, each serving NH/NKV query heads (0: NH, multi-head attention)
  int hidden_size = 0;   // H: the MLP's hidden units (0: 4C)
  Norm norm = Norm::layernorm;
  float norm_eps = 1e-5f;
  Positions positions = Positions::learned;
  RopeConfig rope{};  // Positions::rope only
  Mlp mlp = Mlp::gelu;
  bool biases = true;           // the linear layers' biases (qkvb, attprojb, fcb, fcprojb)
  bool tied_embeddings = true;  // the lm head is wte (else its own tensor lm_head)
  // Mixture of experts (Llama only): each block's MLP is E SwiGLU experts of H hidden units, K per token.
  int num_experts = 0;        // E (0: the dense MLP)
  int experts_per_token = 0;  // K
  Router router = Router::softmax;
  float aux_loss_coef = 0.0f;  // the load-balancing loss's weight in the objective (training, not architecture)

  int kv_heads() const { return num_kv_heads > 0 ? num_kv_heads : num_heads; }
  int hidden() const { return hidden_size > 0 ? hidden_size : 4 * channels; }
  int head_size() const { return channels / num_heads; }
  // Columns of the fused q|k|v product: (NH + 2·NKV)·HS.
  int qkv_channels() const { return (num_heads + 2 * kv_heads()) * head_size(); }
  // The MLP's products kept per row, H wide each: fc's, and SwiGLU's fc2's.
  int mlp_products() const { return mlp == Mlp::swiglu ? 2 : 1; }
  // Llama 3's settings (RMSNorm, RoPE, SwiGLU, no biases): its model file and checkpoint names.
  bool is_llama() const { return norm == Norm::rmsnorm; }
  bool moe() const { return num_experts > 0; }
  // Experts whose weights a layer holds: E, or 1 for the dense MLP (fcw, fc2w, fcprojw are that many stacked).
  int experts() const { return moe() ? num_experts : 1; }
};

// Llama's MLP width: int(2·4C/3), times ffn_dim_multiplier, rounded up to a multiple of multiple_of
// (Meta's model.py).
int llama_hidden_size(int channels, float ffn_dim_multiplier, int multiple_of);
// A Llama 3 configuration with Meta's settings (RMSNorm eps 1e-5, RoPE θ 500,000, SwiGLU, no
// biases); rope scaling and tying as given. Vp = V (Llama's 128,256 is a multiple of 128).
ModelConfig llama3_config(int max_seq_len, int vocab_size, int num_layers, int num_heads, int num_kv_heads,
                          int channels, int hidden_size, const RopeConfig& rope, bool tied_embeddings);
// `dense` (a Llama) with each MLP made E experts of its H hidden units, K per token.
ModelConfig with_experts(ModelConfig dense, int num_experts, int experts_per_token, Router router, float aux_loss_coef);
// Llama 3.1's and 3.2's RoPE scaling (factor 8 and 32; low 1, high 4, original context 8,192).
RopeConfig llama31_rope();
RopeConfig llama32_rope();

bool operator==(const ModelConfig& a, const ModelConfig& b);
inline bool operator!=(const ModelConfig& a, const ModelConfig& b) { return !(a == b); }

// "L=12 NH=12 C=768 maxT=1024 V=50257 Vp=50304"; a Llama adds "NKV=8 H=8192 llama3 (rope factor 32, tied)", a
// mixture of experts "E=8 K=2 softmax router".
std::string describe(const ModelConfig& c);

struct ModelPreset {
  const char* name;
  ModelConfig config;
};

// GPT-2 sizes (124M, 350M, 774M, 1.5B), GPT-3's, Llama 3.1 and 3.2's (Meta's shapes), and small
// models on each vocabulary that train on the CPU build.
const std::vector<ModelPreset>& model_presets();

std::vector<std::string> model_preset_names();

ModelConfig model_preset(const std::string& name);

// Throws unless the kernels can run this configuration: C = NH·HS with the head size HS a
// multiple of 8 and at most 128 (attention), which also makes C a multiple of 8 (matmul,
// 128-bit row accesses); NH a multiple of NKV; H a multiple of 8; 1 <= V <= Vp with Vp a multiple
// of 8 (lm-head matmul, classifier); and the architecture one of the two this project trains
// (GPT-2's or Llama 3's). `source` names where the configuration came from (a file, a flag).
void check_model_config(const ModelConfig& c, const std::string& source);

// ---------------------------------------------------------------------------------------
// Parameter layout (llm.c order; docs/FORMATS.md).

// Every tensor either architecture has, in file order; a tensor the configuration lacks has no
// elements (GPT-2: fc2w, lm_head; Llama: wpe, the biases; dense MLPs: router, expert_bias). For
// Llama: ln1w/ln2w/lnfw are the RMSNorm weights, qkvw is wq|wk|wv, attprojw wo, fcw w1, fc2w w3,
// fcprojw w2 (Meta's names); with experts, router is the gate (E × C), fcw/fc2w/fcprojw hold the E
// experts' w1/w3/w2 stacked, and expert_bias (E, sigmoid router only) is the balancing bias.
enum ParameterTensor : int {
  kWte, kWpe, kLn1w, kLn1b, kQkvw, kQkvb, kAttprojw, kAttprojb,
  kLn2w, kLn2b, kRouterw, kFcw, kFcb, kFc2w, kFcprojw, kFcprojb, kExpertBias, kLnfw, kLnfb, kLmHead,
  kNumParameterTensors
};
constexpr int kFirstLayerTensor = kLn1w, kLastLayerTensor = kExpertBias;

// Whether tensor i has one slice per layer (ln1w .. expert_bias) rather than one for the whole model.
inline bool is_layer_tensor(int i) { return i >= kFirstLayerTensor && i <= kLastLayerTensor; }

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
  // Whether the layout holds a mixture's router (and so its experts).
  bool mixture() const { return tensors[kRouterw].count > 0; }

  // Elements of one slice of tensor i: a layer's for per-layer tensors, else the whole tensor.
  size_t slice_count(int i) const { return is_layer_tensor(i) ? tensors[i].count / num_layers : tensors[i].count; }
  // Where layer `layer`'s slice of tensor i starts (layer ignored for wte, wpe, lnf).
  size_t slice_offset(int i, int layer) const {
    return tensors[i].offset + (is_layer_tensor(i) ? slice_count(i) * static_cast<size_t>(layer) : 0);
  }
};

// The initial values of tensor i, drawn from `normal` in tensor order (call for i = 0, 1, ... in
// turn): GPT-2's scheme for both architectures: weights N(0, 0.02), the residual-branch
// projections attprojw and fcprojw N(0, 0.02/sqrt(2L)), biases 0, norm weights 1 and biases 0,
// the padding rows of wte and lm_head 0 (not drawn). Tensors without elements draw nothing.
std::vector<float> initial_values(const ParameterLayout& layout, int i, NormalSampler& normal);
