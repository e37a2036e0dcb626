// gpt2.h — the GPT-2 model on the GPU: parameters, gradients, AdamW state and activations in
// device memory, and the host code that runs the kernels of kernels/ for the forward pass, the
// backward pass and the optimizer step. Also the model presets and the llm.c model file
// (FORMATS.md, "Model file").
//
// GPT2<T> stores parameters, gradients and activations as T (float: --dtype fp32, bf16: the
// default). LayerNorm statistics, attention log-sum-exps, losses, AdamW moments and (for bf16)
// the master weights are fp32. Parameters and gradients are each one contiguous buffer in the
// llm.c tensor order, so a model file body, a ZeRO shard or an all-reduce is a plain slice.
//
// Errors (bad configuration, file, token) throw std::runtime_error with a one-line message that
// names the file or setting and says what was expected and what was found. All shapes are
// checked here before any kernel launcher sees them (the launchers exit on bad shapes).
#pragma once
#include "../kernels/common.cuh"
#include "../kernels/encoder.cuh"
#include "../kernels/gelu.cuh"
#include "../kernels/layernorm.cuh"
#include "../kernels/matmul.cuh"
#include "../kernels/attention.cuh"
#include "../kernels/classifier.cuh"
#include "../kernels/global_norm.cuh"
#include "../kernels/adamw.cuh"
#include "comm.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

enum class DType { fp32, bf16 };

// ---------------------------------------------------------------------------------------
// Configuration and presets.

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
// Parameter layout (llm.c order; FORMATS.md).

enum ParameterTensor : int {
  kWte, kWpe, kLn1w, kLn1b, kQkvw, kQkvb, kAttprojw, kAttprojb,
  kLn2w, kLn2b, kFcw, kFcb, kFcprojw, kFcprojb, kLnfw, kLnfb,
  kNumParameterTensors
};

struct ParameterInfo {
  const char* name = "";
  size_t count = 0;      // elements
  size_t offset = 0;     // elements from the start of the parameter buffer
  bool decayed = false;  // 2-D weight matrix: AdamW applies weight decay
};

struct ParameterLayout {
  std::array<ParameterInfo, kNumParameterTensors> tensors{};
  size_t total = 0;

  ParameterLayout() = default;
  explicit ParameterLayout(const GPT2Config& c) {
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
};

// ---------------------------------------------------------------------------------------
// Model file header.

constexpr int kModelMagic = 20240326;
constexpr int kModelVersionFp32 = 3;
constexpr int kModelVersionBf16 = 5;
constexpr int kModelHeaderInts = 256;
constexpr size_t kModelHeaderBytes = kModelHeaderInts * sizeof(int32_t);

struct ModelFileInfo {
  GPT2Config config;
  int version = 0;  // kModelVersionFp32 or kModelVersionBf16
  size_t element_bytes() const { return version == kModelVersionFp32 ? 4 : 2; }
};

// Opens an llm.c model file and checks everything but the tensor values: header magic and
// version, a configuration the kernels support, and a file size of exactly header + body.
inline ModelFileInfo read_model_file_info(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) throw std::runtime_error(path + ": cannot open model file: " + std::strerror(errno));
  int32_t header[kModelHeaderInts] = {};
  const size_t got = std::fread(header, sizeof(int32_t), kModelHeaderInts, f);
  std::fseek(f, 0, SEEK_END);
  const long file_bytes = std::ftell(f);
  std::fclose(f);
  if (got != static_cast<size_t>(kModelHeaderInts))
    throw std::runtime_error(path + ": expected an llm.c model file with a " + std::to_string(kModelHeaderBytes) +
                             "-byte header, found a " + std::to_string(file_bytes) + "-byte file");
  if (header[0] != kModelMagic)
    throw std::runtime_error(path + ": expected model file magic " + std::to_string(kModelMagic) + ", found " +
                             std::to_string(header[0]) + " (not an llm.c model file)");
  if (header[1] != kModelVersionFp32 && header[1] != kModelVersionBf16)
    throw std::runtime_error(path + ": expected model file version 3 (fp32) or 5 (bf16), found " +
                             std::to_string(header[1]));
  ModelFileInfo info;
  info.version = header[1];
  info.config = GPT2Config{header[2], header[3], header[7], header[4], header[5], header[6]};
  gpt2_check_config(info.config, path);
  const size_t expected = kModelHeaderBytes + ParameterLayout(info.config).total * info.element_bytes();
  if (static_cast<size_t>(file_bytes) != expected)
    throw std::runtime_error(path + ": expected " + std::to_string(expected) + " bytes for a version " +
                             std::to_string(info.version) + " model with " + describe(info.config) + ", found " +
                             std::to_string(file_bytes) + " bytes");
  return info;
}

inline GPT2Config read_model_header(const std::string& path) { return read_model_file_info(path).config; }

// ---------------------------------------------------------------------------------------
// Optimizer settings and host helpers.

struct OptimizerSettings {
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.0f, grad_clip = 1.0f;  // grad_clip 0: off
  uint64_t seed = 0;  // stochastic rounding of bf16 parameters
};

// Seed of the stochastic rounding for one AdamW call: a hash of (run seed, step, tensor), so every
// tensor and step draws fresh bits and a resumed run reproduces them.
inline unsigned adamw_rounding_seed(uint64_t seed, int step, int tensor) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + ((static_cast<uint64_t>(step) << 5) | static_cast<uint64_t>(tensor));
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  x ^= x >> 31;
  return static_cast<unsigned>(x >> 32);
}

inline void gpt2_cuda_check(cudaError_t err, const std::string& what) {
  if (err != cudaSuccess) throw std::runtime_error(what + ": " + cudaGetErrorString(err));
}

// Host conversions between storage types and float (common.cuh's to_float/from_float are
// device functions). float → bf16 rounds to nearest even.
inline float host_to_float(float x) { return x; }
inline float host_to_float(bf16 x) { return __bfloat162float(x); }
template <typename T> T host_from_float(float x);
template <> inline float host_from_float<float>(float x) { return x; }
template <> inline bf16 host_from_float<bf16>(float x) { return __float2bfloat16_rn(x); }

// Standard normal numbers from mt19937_64 (fully specified by the C++ standard) with Box–Muller,
// rather than std::normal_distribution, whose algorithm differs between standard libraries.
class NormalSampler {
 public:
  explicit NormalSampler(uint64_t seed) : rng_(seed) {}
  double next() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double radius = std::sqrt(-2.0 * std::log(uniform_open()));
    const double angle = 6.283185307179586 * uniform_open();  // 2π
    spare_ = radius * std::sin(angle);
    has_spare_ = true;
    return radius * std::cos(angle);
  }

 private:
  double uniform_open() { return (static_cast<double>(rng_() >> 11) + 0.5) * 0x1.0p-53; }  // in (0, 1)
  std::mt19937_64 rng_;
  bool has_spare_ = false;
  double spare_ = 0.0;
};

// A device allocation that frees itself.
template <typename U>
class DeviceArray {
 public:
  DeviceArray() = default;
  DeviceArray(size_t count, const char* what) : count_(count) {
    if (count == 0) return;
    const cudaError_t err = cudaMalloc(reinterpret_cast<void**>(&ptr_), bytes());
    if (err != cudaSuccess) {
      throw std::runtime_error(std::string("allocating ") + what + " (" + std::to_string(bytes() >> 20) +
                               " MiB of device memory): " + cudaGetErrorString(err));
    }
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  DeviceArray(DeviceArray&& o) noexcept : ptr_(o.ptr_), count_(o.count_) {
    o.ptr_ = nullptr;
    o.count_ = 0;
  }
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(count_, o.count_);
    return *this;
  }
  ~DeviceArray() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  U* get() const { return ptr_; }
  size_t count() const { return count_; }
  size_t bytes() const { return count_ * sizeof(U); }

 private:
  U* ptr_ = nullptr;
  size_t count_ = 0;
};

// ---------------------------------------------------------------------------------------
// Activation recomputation and activation memory.
//
// --recompute trades compute for memory: the backward pass recomputes part of what the forward
// pass computed instead of keeping it for every layer.
//   0  every layer keeps everything its backward reads
//   1  the GELU outputs fch_gelu (4C per row) are recomputed from the kept pre-activations fch
//   2  also the LayerNorm outputs ln1 and ln2 (C each), from their kept inputs
//   3  only the residual stream (every block's input) is kept: the backward reruns a block's
//      forward from its input right before differentiating it
// A tensor not kept for every layer has one layer-sized slice that the forward and the
// recomputation reuse layer after layer. Recomputation runs the same deterministic kernels on the
// same bits (a LayerNorm output recomputed by layernorm_forward is bitwise the fused residual
// LayerNorm's: both round the residual to T first and share layernorm_row), so every setting
// gives bit-identical losses and gradients.
constexpr int kRecomputeMax = 3;
constexpr int kRecomputeDefault = 1;

inline void gpt2_check_recompute(int recompute) {
  if (recompute < 0 || recompute > kRecomputeMax)
    throw std::runtime_error("recompute: expected 0, 1, 2 or 3, found " + std::to_string(recompute));
}

// Element counts of the activation buffers of one B×T micro-batch, N = B·T rows. A per-layer
// tensor holds L slices when kept for the backward pass, else 1 (block_keeps).
struct ActivationCounts {
  // T elements.
  size_t encoded = 0, residual3 = 0;                        // the residual stream: (N, C), (L, N, C)
  size_t ln1 = 0, atty = 0, residual2 = 0, ln2 = 0;         // (slices, N, C)
  size_t qkv = 0;                                           // (slices, N, 3C)
  size_t fch = 0, fch_gelu = 0;                             // (slices, N, 4C)
  size_t lnf = 0, logits = 0, branch = 0, dresidual = 0, dwide = 0;
  // fp32 elements.
  size_t ln_stat = 0;  // each of ln1_mean, ln1_rstd, ln2_mean, ln2_rstd: (slices, N)
  size_t lse = 0;      // (slices, B, NH, T)
  size_t lnf_stat = 0, losses = 0, scratch = 0, norm_squared = 0;
  // int elements.
  size_t tokens = 0;  // each of inputs, targets
  size_t buckets = 0;
};

enum class BlockTensor { fch_gelu, ln_output, other };

// Whether setting `recompute` keeps a block tensor for every layer (see above): GELU outputs up
// to 0, LayerNorm outputs up to 1, everything else (qkv, attention output and lse, residual2, fch,
// LayerNorm statistics) up to 2. The residual stream is always kept.
inline bool block_keeps(BlockTensor tensor, int recompute) {
  switch (tensor) {
    case BlockTensor::fch_gelu: return recompute < 1;
    case BlockTensor::ln_output: return recompute < 2;
    case BlockTensor::other: return recompute < 3;
  }
  return true;
}

// The lm head and the classifier run over chunks of at most this many rows of the micro-batch,
// so the logits (Vp wide: the largest activation per row) need a (chunk, Vp) buffer, not (N, Vp).
constexpr size_t kLogitsChunkRows = 1024;

inline ActivationCounts gpt2_activation_counts(const GPT2Config& cfg, int B, int seq_len, int recompute) {
  gpt2_check_recompute(recompute);
  const size_t L = cfg.num_layers, C = cfg.channels, N = static_cast<size_t>(B) * seq_len;
  auto slices = [&](BlockTensor t) { return block_keeps(t, recompute) ? L : 1; };
  ActivationCounts n;
  n.encoded = N * C;
  n.residual3 = L * N * C;
  n.ln1 = n.ln2 = slices(BlockTensor::ln_output) * N * C;
  n.atty = n.residual2 = slices(BlockTensor::other) * N * C;
  n.qkv = slices(BlockTensor::other) * N * 3 * C;
  n.fch = slices(BlockTensor::other) * N * 4 * C;
  n.fch_gelu = slices(BlockTensor::fch_gelu) * N * 4 * C;
  n.lnf = n.branch = n.dresidual = N * C;
  n.logits = std::min(N, kLogitsChunkRows) * cfg.padded_vocab_size;
  n.dwide = N * 4 * C;
  n.ln_stat = slices(BlockTensor::other) * N;
  n.lse = slices(BlockTensor::other) * N * cfg.num_heads;
  n.lnf_stat = n.losses = N;
  const size_t scratch_bytes =
      std::max({layernorm_backward_scratch_bytes(static_cast<int>(N), cfg.channels),
                attention_backward_scratch_bytes(B, seq_len, cfg.num_heads), global_norm_scratch_bytes()});
  n.scratch = ceil_div(scratch_bytes, sizeof(float));
  n.norm_squared = 1;
  n.tokens = N;
  n.buckets = encoder_backward_scratch_bytes(B, seq_len) / sizeof(int);
  return n;
}

// Device memory of the activations (everything that scales with the micro-batch) in two parts:
//   blocks: the transformer blocks' activations: the residual stream and what the blocks keep for
//           the backward pass, including the one-layer slices the recomputation refills. This is
//           what --recompute shrinks.
//   other:  final LayerNorm, logits (min(N, kLogitsChunkRows)·Vp), losses, activation-gradient
//           buffers, scratch, tokens. The same at every setting.
struct ActivationBytes {
  size_t blocks = 0, other = 0;
  size_t total() const { return blocks + other; }
};

inline ActivationBytes gpt2_activation_bytes(const GPT2Config& cfg, int B, int seq_len, int recompute, DType dtype) {
  const ActivationCounts n = gpt2_activation_counts(cfg, B, seq_len, recompute);
  const size_t t = dtype == DType::fp32 ? sizeof(float) : sizeof(bf16), f = sizeof(float);
  ActivationBytes bytes;
  bytes.blocks = t * (n.encoded + n.residual3 + n.ln1 + n.atty + n.residual2 + n.ln2 + n.qkv + n.fch + n.fch_gelu) +
                 f * (4 * n.ln_stat + n.lse);
  bytes.other = t * (n.lnf + n.logits + n.branch + n.dresidual + n.dwide) +
                f * (2 * n.lnf_stat + n.losses + n.scratch + n.norm_squared) + sizeof(int) * (2 * n.tokens + n.buckets);
  return bytes;
}

// ---------------------------------------------------------------------------------------
// The model.

template <typename T>
class GPT2 {
  static_assert(std::is_same<T, float>::value || std::is_same<T, bf16>::value, "GPT2<T>: T is float or bf16");

 public:
  static constexpr DType dtype = std::is_same<T, float>::value ? DType::fp32 : DType::bf16;

  // Allocates parameters, gradients, optimizer state and the activations of one B×seq_len
  // micro-batch (the sequence length is fixed for the model's lifetime) at activation
  // recomputation setting `recompute` (0..3, see kRecomputeMax). Parameters, gradients and
  // optimizer state start at zero: call init_random() or load().
  //
  // Data parallel (comm with more than one rank): every rank holds all parameters and gradients
  // (padded to R·S elements, S = ceil(P/R) rounded up to a multiple of 8, so shard boundaries are
  // 16-byte aligned) and runs the same steps on its own micro-batches.
  //   zero_stage 0: gradients are averaged over ranks (all-reduce); every rank keeps the full
  //     optimizer state and runs the full AdamW update.
  //   zero_stage 1: rank r owns elements [r·S, (r+1)·S) ∩ [0, P): gradients are averaged onto
  //     their owner only, the owner keeps AdamW moments (and fp32 master weights) for its shard
  //     alone — 1/R of the optimizer state — and updates its shard, then the parameters are
  //     all-gathered.
  //   zero_stage 2: as 1, and no rank holds the full gradient: the backward pass writes layer l's
  //     gradients into one of two per-layer working blocks (layer l % 2) and wte/wpe/lnf's into a
  //     block of their own; each block is summed onto the owners' gradient shards (S elements)
  //     as soon as it is complete, and a working block is reused only after its communication
  //     finished (event). The loss gradient is pre-divided by R so the sum is the average. With
  //     gradient accumulation every micro-step communicates (the working blocks cannot keep a
  //     sum): before a block is written again, the owner copies its accumulated shard values
  //     into its own part of the block, so the backward pass adds this micro-step's gradient to
  //     them and the next sum over ranks yields the running total.
  // Gradient communication overlaps the backward pass: layer l's gradients are sent on the
  // communicator's stream as soon as layer l's backward is queued (wte, wpe and lnf after the
  // last layer), and (stages 0 and 1) only on the last micro-step of an optimizer step.
  // One rank (or no communicator) always runs stage 0: with R = 1 the stages compute the same.
  GPT2(const GPT2Config& cfg, int B, int seq_len, int recompute = kRecomputeDefault, Communicator* comm = nullptr,
       int zero_stage = 0)
      : cfg_(cfg), B_(B), T_(seq_len), recompute_(recompute), comm_(comm) {
    gpt2_check_config(cfg, "model configuration");
    gpt2_check_recompute(recompute);
    if (zero_stage < 0 || zero_stage > 2)
      throw std::runtime_error("ZeRO stage: expected 0, 1 or 2, found " + std::to_string(zero_stage));
    if (comm != nullptr) {
      world_ = comm->world_size();
      rank_ = comm->rank();
    }
    zero_ = world_ > 1 ? zero_stage : 0;
    if (B < 1) throw std::runtime_error("batch size: expected B >= 1, found " + std::to_string(B));
    if (seq_len < 1 || seq_len > cfg.max_seq_len)
      throw std::runtime_error("sequence length: expected 1 <= T <= max_seq_len (" + std::to_string(cfg.max_seq_len) +
                               "), found " + std::to_string(seq_len));
    // The kernels index rows (B·T) and attention rows (B·NH·T) with int.
    if (static_cast<size_t>(B) * seq_len * cfg.num_heads > static_cast<size_t>(INT_MAX))
      throw std::runtime_error("micro-batch: B*T*NH = " + std::to_string(B) + "*" + std::to_string(seq_len) + "*" +
                               std::to_string(cfg.num_heads) + " exceeds the kernels' int indexing");
    layout_ = ParameterLayout(cfg);
    matmul_init();
    gpt2_cuda_check(cudaStreamCreate(&stream_), "creating the model's CUDA stream");
    try {
      if (zero_ == 2)
        for (cudaEvent_t& e : block_free_)
          gpt2_cuda_check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "creating a gradient-block event");
      allocate();
    } catch (...) {
      destroy_stream_and_events();  // no destructor runs for a constructor that throws
      throw;
    }
  }
  GPT2(const GPT2&) = delete;
  GPT2& operator=(const GPT2&) = delete;
  ~GPT2() {
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);
    if (communicating()) cudaStreamSynchronize(comm_->stream());
    destroy_stream_and_events();
  }

  const GPT2Config& config() const { return cfg_; }
  const ParameterLayout& layout() const { return layout_; }
  int batch_size() const { return B_; }
  int seq_len() const { return T_; }
  int recompute() const { return recompute_; }
  cudaStream_t stream() const { return stream_; }
  int zero_stage() const { return zero_; }
  // This rank's optimizer shard: elements [begin, end) of the parameter buffer (all of it at
  // ZeRO stage 0).
  size_t optimizer_shard_begin() const { return state_begin_; }
  size_t optimizer_shard_end() const { return state_end_; }

  // Device buffers (llm.c order), for communication and checkpointing code.
  T* params_device() const { return params_.get(); }
  T* grads_device() const { return grads_.get(); }
  float* adam_m_device() const { return adam_m_.get(); }
  float* adam_v_device() const { return adam_v_.get(); }
  float* master_device() const { return master_.get(); }  // nullptr for T = float

  // GPT-2 initialization from `seed`: weights N(0, 0.02), the residual-branch projections attprojw
  // and fcprojw N(0, 0.02/sqrt(2L)), biases 0, LayerNorm weights 1 and biases 0, wte padding rows 0.
  // Values are drawn in fp32 in llm.c tensor order (padding rows skipped); bf16 parameters are
  // those values rounded to nearest and the master weights the fp32 values. Gradients and optimizer
  // state are reset.
  void init_random(uint64_t seed) {
    NormalSampler normal(seed);
    const float residual_std = 0.02f / std::sqrt(2.0f * cfg_.num_layers);
    for (int i = 0; i < kNumParameterTensors; ++i) {
      std::vector<float> values(layout_[i].count, 0.0f);
      switch (i) {
        case kLn1w: case kLn2w: case kLnfw:
          std::fill(values.begin(), values.end(), 1.0f);
          break;
        case kLn1b: case kLn2b: case kLnfb: case kQkvb: case kAttprojb: case kFcb: case kFcprojb:
          break;
        default: {
          const float stddev = (i == kAttprojw || i == kFcprojw) ? residual_std : 0.02f;
          const size_t drawn = i == kWte ? static_cast<size_t>(cfg_.vocab_size) * cfg_.channels : values.size();
          for (size_t k = 0; k < drawn; ++k) values[k] = static_cast<float>(normal.next()) * stddev;
        }
      }
      upload_tensor(i, values);
    }
    reset_training_state();
  }

  // Reads an llm.c model file: version 3 (fp32) or 5 (bf16) into either dtype. Its header must
  // describe this model's configuration. fp32 values load into bf16 parameters rounded to nearest
  // (the master weights keep the fp32 values); bf16 values load into fp32 exactly. Gradients and
  // optimizer state are reset.
  void load(const std::string& path) {
    const ModelFileInfo info = read_model_file_info(path);
    if (info.config != cfg_)
      throw std::runtime_error(path + ": model file has " + describe(info.config) + ", expected " + describe(cfg_) +
                               " (the configuration this model was built with)");
    std::FILE* f = std::fopen(path.c_str(), "rb");
    if (f == nullptr) throw std::runtime_error(path + ": cannot open model file: " + std::strerror(errno));
    try {
      std::fseek(f, static_cast<long>(kModelHeaderBytes), SEEK_SET);
      for (int i = 0; i < kNumParameterTensors; ++i) {
        const size_t n = layout_[i].count;
        std::vector<float> values(n);
        bool complete;
        if (info.version == kModelVersionFp32) {
          complete = std::fread(values.data(), sizeof(float), n, f) == n;
        } else {
          std::vector<bf16> raw(n);
          complete = std::fread(raw.data(), sizeof(bf16), n, f) == n;
          for (size_t k = 0; k < n; ++k) values[k] = host_to_float(raw[k]);
        }
        if (!complete) throw std::runtime_error(path + ": file ended inside tensor " + layout_[i].name);
        upload_tensor(i, values);
      }
    } catch (...) {
      std::fclose(f);
      throw;
    }
    std::fclose(f);
    reset_training_state();
  }

  // Writes an llm.c model file: version 3 (fp32 values) for T = float, 5 (raw bf16) for T = bf16.
  // The file appears complete or not at all: it is written to path + ".tmp", synced, then renamed.
  void save(const std::string& path) const {
    const std::string temp = path + ".tmp";
    std::FILE* f = std::fopen(temp.c_str(), "wb");
    if (f == nullptr) throw std::runtime_error(temp + ": cannot create model file: " + std::strerror(errno));
    int32_t header[kModelHeaderInts] = {};
    header[0] = kModelMagic;
    header[1] = dtype == DType::fp32 ? kModelVersionFp32 : kModelVersionBf16;
    header[2] = cfg_.max_seq_len;
    header[3] = cfg_.vocab_size;
    header[4] = cfg_.num_layers;
    header[5] = cfg_.num_heads;
    header[6] = cfg_.channels;
    header[7] = cfg_.padded_vocab_size;
    bool ok = std::fwrite(header, sizeof(header), 1, f) == 1;
    try {
      for (int i = 0; ok && i < kNumParameterTensors; ++i) {
        std::vector<T> values(layout_[i].count);
        download(values.data(), params_.get() + layout_[i].offset, values.size() * sizeof(T));
        ok = std::fwrite(values.data(), sizeof(T), values.size(), f) == values.size();
      }
    } catch (...) {
      std::fclose(f);
      std::remove(temp.c_str());
      throw;
    }
    ok = ok && std::fflush(f) == 0 && fsync(fileno(f)) == 0;
    const int saved_errno = errno;
    ok = std::fclose(f) == 0 && ok;
    if (!ok) {
      std::remove(temp.c_str());
      throw std::runtime_error(temp + ": writing the model file failed: " + std::strerror(saved_errno));
    }
    if (std::rename(temp.c_str(), path.c_str()) != 0) {
      const int rename_errno = errno;
      std::remove(temp.c_str());
      throw std::runtime_error(path + ": cannot rename " + temp + " into place: " + std::strerror(rename_errno));
    }
  }

  // Forward pass over one micro-batch of host tokens (B·T each, row-major [B][T]). Returns the
  // mean cross-entropy over the B·T positions and keeps the logits of the last chunk of rows
  // (logits()). targets may be nullptr (no loss: returns NaN).
  float forward(const int* inputs, const int* targets) {
    upload_tokens(inputs, targets);
    run_forward();
    run_head(targets != nullptr, 0.0f, false);
    if (targets == nullptr) {
      gpt2_cuda_check(cudaStreamSynchronize(stream_), "forward pass");
      return std::numeric_limits<float>::quiet_NaN();
    }
    return mean_loss();
  }

  // Forward pass, then the gradient of (mean loss / grad_accum_steps) ADDED to the parameter
  // gradients (call zero_grad() before the first micro-step of an optimizer step). Returns this
  // micro-batch's mean loss. Overwrites the logits with their gradient. With several ranks, the
  // micro-step with last_micro_step = true also averages the accumulated gradients over the ranks
  // (onto their owners at ZeRO stage 1), overlapped with its backward pass; earlier micro-steps
  // only accumulate locally.
  float forward_backward(const int* inputs, const int* targets, int grad_accum_steps, bool last_micro_step = true) {
    if (grad_accum_steps < 1)
      throw std::runtime_error("gradient accumulation: expected at least 1 micro-step, found " +
                               std::to_string(grad_accum_steps));
    if (targets == nullptr) throw std::runtime_error("forward_backward: targets are required");
    upload_tokens(inputs, targets);
    num_buckets_ = encoder_backward_build_buckets(buckets_host_.data(), inputs, B_, T_, cfg_.vocab_size);
    gpt2_cuda_check(cudaMemcpyAsync(acts_.buckets.get(), buckets_host_.data(), acts_.buckets.bytes(),
                                    cudaMemcpyHostToDevice, stream_),
                    "uploading encoder-gradient buckets");
    run_forward();
    // ZeRO 2 sums over ranks (ncclSum; see the constructor), so each rank's share is pre-divided.
    const float ranks_summed = zero_ == 2 ? static_cast<float>(world_) : 1.0f;
    const float dloss = 1.0f / (static_cast<float>(rows()) * static_cast<float>(grad_accum_steps) * ranks_summed);
    if (zero_ == 2) {
      comm_->order_before(stream_);  // the previous micro-step's sums into the shard are complete
      prepare_gradient_block(model_grads_.get(), model_grads_.count(), {kWte, kWpe, kLnfw, kLnfb}, 0);
    }
    run_head(true, dloss, true);
    communicate_gradients_ = communicating() && (last_micro_step || zero_ == 2);
    run_backward();
    communicate_gradients_ = false;
    shard_holds_gradients_ = zero_ == 2;
    return mean_loss();
  }

  void zero_grad() {
    if (zero_ == 2) {
      gpt2_cuda_check(cudaMemsetAsync(shard_grads_.get(), 0, shard_grads_.bytes(), stream_), "zeroing gradients");
      shard_holds_gradients_ = false;
      return;
    }
    gpt2_cuda_check(cudaMemsetAsync(grads_.get(), 0, grads_.bytes(), stream_), "zeroing gradients");
  }

  // One optimizer step (step is 1-based) from the accumulated gradients. Returns the global
  // gradient norm before clipping; when grad_clip > 0 and the norm exceeds it, the gradients enter
  // AdamW scaled by grad_clip / norm. AdamW runs per tensor, weight decay only on the 2-D weights
  // (wte, wpe, qkvw, attprojw, fcw, fcprojw). T = bf16 updates the fp32 master weights and stores
  // them stochastically rounded (seed adamw_rounding_seed(opt.seed, step, tensor)); T = float
  // updates the parameters themselves. A non-finite norm is returned as is (the caller decides).
  //
  // Data parallel: the update waits for the gradient communication. At ZeRO stage 1 the norm is
  // the square root of the sum over ranks of each shard's squared norm, each rank updates its
  // shard tensor piece by tensor piece (weight decay per tensor; the stochastic rounding uses the
  // element's index within its tensor, so the bits match an unsharded update), and the updated
  // parameters are all-gathered before anything else runs on the model's stream.
  float update(const OptimizerSettings& opt, float lr, int step) {
    if (step < 1) throw std::runtime_error("optimizer step: expected step >= 1, found " + std::to_string(step));
    const float norm = gradient_norm();
    apply_update(opt, lr, step, norm);
    return norm;
  }

  // The global norm of the accumulated gradients (update()'s first half, for callers that look at
  // the norm before deciding whether to apply the step). Waits for the gradient communication.
  float gradient_norm() {
    if (communicating()) comm_->order_before(stream_);
    float* norm_squared = acts_.norm_squared.get();
    gpt2_cuda_check(cudaMemsetAsync(norm_squared, 0, sizeof(float), stream_), "gradient norm");
    const T* shard_grads = zero_ == 2 ? shard_grads_.get() : grads_.get() + state_begin_;
    global_norm_squared(norm_squared, acts_.scratch.get(), shard_grads, state_end_ - state_begin_, stream_);
    if (communicating() && zero_ >= 1) {
      comm_->wait_for(stream_);
      comm_->all_reduce(norm_squared, 1, ncclSum);
      comm_->order_before(stream_);
    }
    float norm_squared_host = 0.0f;
    download(&norm_squared_host, norm_squared, sizeof(float));
    return std::sqrt(norm_squared_host);
  }

  // update()'s second half: the AdamW step, given gradient_norm()'s result for the clipping.
  void apply_update(const OptimizerSettings& opt, float lr, int step, float norm) {
    if (step < 1) throw std::runtime_error("optimizer step: expected step >= 1, found " + std::to_string(step));
    const float grad_scale = (opt.grad_clip > 0.0f && norm > opt.grad_clip) ? opt.grad_clip / norm : 1.0f;
    const T* shard_grads = zero_ == 2 ? shard_grads_.get() : grads_.get() + state_begin_;
    for (int i = 0; i < kNumParameterTensors; ++i) {
      const ParameterInfo& t = layout_[i];
      const size_t begin = std::max(t.offset, state_begin_), end = std::min(t.offset + t.count, state_end_);
      if (begin >= end) continue;
      const size_t state = begin - state_begin_;  // index into this rank's optimizer state
      float* master = master_.get() != nullptr ? master_.get() + state : nullptr;
      adamw_update(params_.get() + begin, master, shard_grads + state, adam_m_.get() + state, adam_v_.get() + state,
                   end - begin, lr, opt.beta1, opt.beta2, opt.eps, t.decayed ? opt.weight_decay : 0.0f, grad_scale,
                   step, adamw_rounding_seed(opt.seed, step, i), begin - t.offset, stream_);
    }
    if (communicating() && zero_ >= 1) {
      comm_->wait_for(stream_);
      comm_->all_gather(params_.get() + rank_ * shard_size_, params_.get(), shard_size_);
      comm_->order_before(stream_);
    }
  }

  size_t num_parameters() const { return layout_.total; }

  // Host copies as float, llm.c order.
  std::vector<float> parameters() const { return download_floats(params_.get(), layout_.total); }
  // (At ZeRO stage 2 no rank holds them all: throws.)
  std::vector<float> gradients() const {
    if (zero_ == 2) throw std::runtime_error("gradients(): at ZeRO stage 2 each rank holds only its gradient shard");
    return download_floats(grads_.get(), layout_.total);
  }
  // The logits of the last forward(): rows [N - r, N) of the micro-batch, r = N mod
  // kLogitsChunkRows (or kLogitsChunkRows), which is every row when B·T <= kLogitsChunkRows.
  // After forward_backward() they hold the logits' gradients.
  std::vector<float> logits() const {
    const size_t last_chunk = rows() - (rows() - 1) / kLogitsChunkRows * kLogitsChunkRows;
    return download_floats(acts_.logits.get(), last_chunk * cfg_.padded_vocab_size);
  }

  // Replaces all parameters (llm.c order, as float; rounded to nearest for bf16, master weights get
  // the float values). Gradients and optimizer state are kept.
  void set_parameters(const std::vector<float>& values) {
    if (values.size() != layout_.total)
      throw std::runtime_error("set_parameters: expected " + std::to_string(layout_.total) + " values, found " +
                               std::to_string(values.size()));
    for (int i = 0; i < kNumParameterTensors; ++i) {
      const auto begin = values.begin() + static_cast<std::ptrdiff_t>(layout_[i].offset);
      upload_tensor(i, std::vector<float>(begin, begin + static_cast<std::ptrdiff_t>(layout_[i].count)));
    }
  }

  // Device memory, for the start-up summary. parameter_bytes: parameters and their gradients;
  // optimizer_bytes: AdamW moments and master weights; activation_bytes: everything that scales
  // with the micro-batch (activations kept for the backward pass, gradient buffers, scratch, tokens),
  // the sum of the buffers allocated, which gpt2_activation_bytes(...).total() predicts.
  size_t parameter_bytes() const { return params_.bytes() + gradient_bytes(); }
  size_t gradient_bytes() const {
    return grads_.bytes() + shard_grads_.bytes() + layer_grads_.bytes() + model_grads_.bytes();
  }
  size_t optimizer_bytes() const { return adam_m_.bytes() + adam_v_.bytes() + master_.bytes(); }
  size_t activation_bytes() const { return activation_bytes_; }

 private:
  // Activations of one micro-batch, N = B·T rows. Per-layer tensors hold L slices, or one slice
  // reused by every layer when the recompute setting does not keep them (block_keeps; at()).
  struct Activations {
    DeviceArray<T> encoded;                       // (N, C) wte[token] + wpe[t]: layer 0's input
    DeviceArray<T> ln1, atty, residual2, ln2;     // (L|1, N, C)
    DeviceArray<T> residual3;                     // (L, N, C) residual2 + fcproj: the next layer's input
    DeviceArray<T> qkv;                           // (L|1, N, 3C)
    DeviceArray<T> fch, fch_gelu;                 // (L|1, N, 4C) before / after GELU
    DeviceArray<float> ln1_mean, ln1_rstd, ln2_mean, ln2_rstd;  // (L|1, N)
    DeviceArray<float> lse;                       // (L|1, B, NH, T) attention log-sum-exp
    DeviceArray<T> lnf;                           // (N, C)
    DeviceArray<float> lnf_mean, lnf_rstd;        // (N)
    DeviceArray<T> logits;                        // (chunk, Vp); the classifier writes dlogits in place
    DeviceArray<float> losses;                    // (N)
    // Forward: output of a residual branch's projection before the residual add. Backward: the
    // gradient of the input of the matmul / attention just differentiated.
    DeviceArray<T> branch;                        // (N, C)
    DeviceArray<T> dresidual;                     // (N, C) gradient of the residual stream
    DeviceArray<T> dwide;                         // (N, 4C) gradient of fch_gelu/fch, then of qkv
    DeviceArray<float> scratch;                   // layernorm / attention backward, gradient norm
    DeviceArray<float> norm_squared;              // (1)
    DeviceArray<int> inputs, targets;             // (N)
    DeviceArray<int> buckets;                     // encoder-backward bucket list
  };

  int rows() const { return B_ * T_; }

  void allocate() {
    const size_t P = layout_.total;
    shard_size_ = ceil_div(ceil_div(P, static_cast<size_t>(world_)), size_t(8)) * 8;
    state_begin_ = zero_ == 0 ? 0 : std::min(P, rank_ * shard_size_);
    state_end_ = zero_ == 0 ? P : std::min(P, state_begin_ + shard_size_);
    const size_t state = zero_ == 0 ? P : shard_size_;
    params_ = DeviceArray<T>(shard_size_ * world_, "parameters");
    if (zero_ == 2) {
      // Working blocks: each tensor's offset within the block of its layer / of the model tensors.
      size_t layer_block = 0, model_block = 0;
      for (int i = 0; i < kNumParameterTensors; ++i) {
        size_t& block = is_layer_tensor(i) ? layer_block : model_block;
        block_offset_[i] = block;
        block += is_layer_tensor(i) ? layout_[i].count / cfg_.num_layers : layout_[i].count;
      }
      layer_block_ = layer_block;
      layer_grads_ = DeviceArray<T>(2 * layer_block, "gradients (two per-layer working blocks)");
      model_grads_ = DeviceArray<T>(model_block, "gradients (wte, wpe, lnf working block)");
      shard_grads_ = DeviceArray<T>(shard_size_, "gradients (this rank's shard)");
    } else {
      grads_ = DeviceArray<T>(shard_size_ * world_, "gradients");
    }
    adam_m_ = DeviceArray<float>(state, "AdamW first moments");
    adam_v_ = DeviceArray<float>(state, "AdamW second moments");
    if (dtype == DType::bf16) master_ = DeviceArray<float>(state, "fp32 master weights");
    gpt2_cuda_check(cudaMemset(params_.get(), 0, params_.bytes()), "zeroing parameters");
    if (master_.get() != nullptr)
      gpt2_cuda_check(cudaMemset(master_.get(), 0, master_.bytes()), "zeroing master weights");
    reset_training_state();

    const ActivationCounts n = gpt2_activation_counts(cfg_, B_, T_, recompute_);
    Activations& a = acts_;
    a.encoded = DeviceArray<T>(n.encoded, "activations (encoded)");
    a.ln1 = DeviceArray<T>(n.ln1, "activations (ln1)");
    a.atty = DeviceArray<T>(n.atty, "activations (attention output)");
    a.residual2 = DeviceArray<T>(n.residual2, "activations (residual2)");
    a.ln2 = DeviceArray<T>(n.ln2, "activations (ln2)");
    a.residual3 = DeviceArray<T>(n.residual3, "activations (residual3)");
    a.qkv = DeviceArray<T>(n.qkv, "activations (qkv)");
    a.fch = DeviceArray<T>(n.fch, "activations (fch)");
    a.fch_gelu = DeviceArray<T>(n.fch_gelu, "activations (fch_gelu)");
    a.ln1_mean = DeviceArray<float>(n.ln_stat, "activations (ln1 mean)");
    a.ln1_rstd = DeviceArray<float>(n.ln_stat, "activations (ln1 rstd)");
    a.ln2_mean = DeviceArray<float>(n.ln_stat, "activations (ln2 mean)");
    a.ln2_rstd = DeviceArray<float>(n.ln_stat, "activations (ln2 rstd)");
    a.lse = DeviceArray<float>(n.lse, "activations (attention lse)");
    a.lnf = DeviceArray<T>(n.lnf, "activations (lnf)");
    a.lnf_mean = DeviceArray<float>(n.lnf_stat, "activations (lnf mean)");
    a.lnf_rstd = DeviceArray<float>(n.lnf_stat, "activations (lnf rstd)");
    a.logits = DeviceArray<T>(n.logits, "activations (logits)");
    a.losses = DeviceArray<float>(n.losses, "activations (losses)");
    a.branch = DeviceArray<T>(n.branch, "activations (branch output / input gradient)");
    a.dresidual = DeviceArray<T>(n.dresidual, "activation gradients (residual)");
    a.dwide = DeviceArray<T>(n.dwide, "activation gradients (fch / qkv)");
    a.scratch = DeviceArray<float>(n.scratch, "scratch");
    a.norm_squared = DeviceArray<float>(n.norm_squared, "gradient norm");
    a.inputs = DeviceArray<int>(n.tokens, "input tokens");
    a.targets = DeviceArray<int>(n.tokens, "target tokens");
    a.buckets = DeviceArray<int>(n.buckets, "encoder-gradient buckets");
    buckets_host_.assign(n.buckets, 0);

    activation_bytes_ = 0;
    for (size_t bytes : {a.encoded.bytes(), a.ln1.bytes(), a.atty.bytes(), a.residual2.bytes(), a.ln2.bytes(),
                         a.residual3.bytes(), a.qkv.bytes(), a.fch.bytes(), a.fch_gelu.bytes(), a.ln1_mean.bytes(),
                         a.ln1_rstd.bytes(), a.ln2_mean.bytes(), a.ln2_rstd.bytes(), a.lse.bytes(), a.lnf.bytes(),
                         a.lnf_mean.bytes(), a.lnf_rstd.bytes(), a.logits.bytes(), a.losses.bytes(),
                         a.branch.bytes(), a.dresidual.bytes(), a.dwide.bytes(), a.scratch.bytes(),
                         a.norm_squared.bytes(), a.inputs.bytes(), a.targets.bytes(), a.buckets.bytes()})
      activation_bytes_ += bytes;
  }

  void reset_training_state() {
    zero_grad();
    gpt2_cuda_check(cudaMemsetAsync(adam_m_.get(), 0, adam_m_.bytes(), stream_), "zeroing AdamW moments");
    gpt2_cuda_check(cudaMemsetAsync(adam_v_.get(), 0, adam_v_.bytes(), stream_), "zeroing AdamW moments");
    gpt2_cuda_check(cudaStreamSynchronize(stream_), "resetting training state");
  }

  // Parameter tensor i as float values → T parameters (and the fp32 master copy for bf16).
  void upload_tensor(int i, const std::vector<float>& values) {
    const ParameterInfo& t = layout_[i];
    std::vector<T> stored(values.size());
    for (size_t k = 0; k < values.size(); ++k) stored[k] = host_from_float<T>(values[k]);
    gpt2_cuda_check(cudaMemcpy(params_.get() + t.offset, stored.data(), t.count * sizeof(T), cudaMemcpyHostToDevice),
                    std::string("uploading parameter tensor ") + t.name);
    // The master weights of this rank's optimizer shard only.
    const size_t begin = std::max(t.offset, state_begin_), end = std::min(t.offset + t.count, state_end_);
    if (master_.get() != nullptr && begin < end) {
      gpt2_cuda_check(cudaMemcpy(master_.get() + (begin - state_begin_), values.data() + (begin - t.offset),
                                 (end - begin) * sizeof(float), cudaMemcpyHostToDevice),
                      std::string("uploading master weights of ") + t.name);
    }
  }

  void download(void* dst, const void* src, size_t bytes) const {
    gpt2_cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_), "copying to the host");
    gpt2_cuda_check(cudaStreamSynchronize(stream_), "copying to the host");
  }

  std::vector<float> download_floats(const T* src, size_t count) const {
    std::vector<T> raw(count);
    download(raw.data(), src, count * sizeof(T));
    std::vector<float> values(count);
    for (size_t k = 0; k < count; ++k) values[k] = host_to_float(raw[k]);
    return values;
  }

  // Every token must index a real vocabulary row; anything else means the data was tokenized for
  // another vocabulary than the model's.
  void check_tokens(const int* tokens, const char* what) const {
    if (tokens == nullptr) throw std::runtime_error(std::string(what) + " tokens: expected B*T ids, found nullptr");
    for (int p = 0; p < rows(); ++p) {
      if (tokens[p] < 0 || tokens[p] >= cfg_.vocab_size)
        throw std::runtime_error(std::string(what) + " token " + std::to_string(tokens[p]) + " at batch row " +
                                 std::to_string(p / T_) + ", position " + std::to_string(p % T_) +
                                 ": expected an id in [0, " + std::to_string(cfg_.vocab_size) +
                                 ") (the model's vocabulary); data and model disagree on the vocabulary");
    }
  }

  void upload_tokens(const int* inputs, const int* targets) {
    check_tokens(inputs, "input");
    gpt2_cuda_check(cudaMemcpyAsync(acts_.inputs.get(), inputs, acts_.inputs.bytes(), cudaMemcpyHostToDevice, stream_),
                    "uploading input tokens");
    if (targets != nullptr) {
      check_tokens(targets, "target");
      gpt2_cuda_check(
          cudaMemcpyAsync(acts_.targets.get(), targets, acts_.targets.bytes(), cudaMemcpyHostToDevice, stream_),
          "uploading target tokens");
    }
  }

  // Per-position losses summed on the host in position order (double), over B·T.
  float mean_loss() const {
    std::vector<float> losses(rows());
    download(losses.data(), acts_.losses.get(), losses.size() * sizeof(float));
    double sum = 0.0;
    for (float x : losses) sum += x;
    return static_cast<float>(sum / rows());
  }

  const T* param(int tensor, size_t layer_stride, int layer) const {
    return params_.get() + layout_[tensor].offset + layer_stride * layer;
  }
  // Where the backward pass accumulates tensor `tensor`'s gradient (of layer `layer`).
  T* grad(int tensor, size_t layer_stride, int layer) const {
    if (zero_ == 2)
      return is_layer_tensor(tensor) ? layer_grads_.get() + (layer % 2) * layer_block_ + block_offset_[tensor]
                                     : model_grads_.get() + block_offset_[tensor];
    return grads_.get() + layout_[tensor].offset + layer_stride * layer;
  }
  static bool is_layer_tensor(int tensor) { return tensor >= kLn1w && tensor <= kFcprojb; }

  // Elements [offset, offset + n) of the parameter buffer that tensor `tensor`'s slice for
  // `layer` covers (layer ignored for wte, wpe, lnf).
  std::pair<size_t, size_t> global_range(int tensor, int layer) const {
    const ParameterInfo& t = layout_[tensor];
    if (!is_layer_tensor(tensor)) return {t.offset, t.count};
    const size_t per_layer = t.count / cfg_.num_layers;
    return {t.offset + per_layer * layer, per_layer};
  }

  // ZeRO 2: makes a working block (of `elements`) ready for a backward pass to accumulate into
  // (the caller has ordered it after the block's previous communication): zeroes it and, after
  // an earlier micro-step of this optimizer step, copies this rank's accumulated shard values
  // into its own part of it.
  void prepare_gradient_block(T* block, size_t elements, std::initializer_list<int> tensors, int layer) {
    gpt2_cuda_check(cudaMemsetAsync(block, 0, elements * sizeof(T), stream_), "zeroing a gradient block");
    if (!shard_holds_gradients_) return;
    for (int i : tensors) {
      const auto [offset, n] = global_range(i, layer);
      const size_t begin = std::max(offset, state_begin_), end = std::min(offset + n, state_end_);
      if (begin >= end) continue;
      gpt2_cuda_check(cudaMemcpyAsync(grad(i, n, layer) + (begin - offset), shard_grads_.get() + (begin - state_begin_),
                                      (end - begin) * sizeof(T), cudaMemcpyDeviceToDevice, stream_),
                      "restoring accumulated gradients");
    }
  }

  // Layer l's slice of a per-layer activation of `slice` elements: its own slice when the tensor
  // is kept for every layer, else the one slice all layers reuse.
  template <typename U>
  static U* at(const DeviceArray<U>& a, int l, size_t slice) {
    return a.get() + (a.count() > slice ? static_cast<size_t>(l) * slice : 0);
  }

  // Layer l's input: the embeddings for layer 0, else the previous layer's output.
  const T* block_input(int l) const {
    return l == 0 ? acts_.encoded.get() : acts_.residual3.get() + static_cast<size_t>(l - 1) * rows() * cfg_.channels;
  }

  // Layer l's forward from its ln1 output (already in place) to its GELU output: everything the
  // backward reads except ln1. The attention projection's output is left in a.branch.
  void block_forward(int l) {
    const int N = rows(), C = cfg_.channels, NH = cfg_.num_heads;
    const size_t NC = static_cast<size_t>(N) * C, c = C;
    Activations& a = acts_;
    cudaStream_t s = stream_;
    T* qkv = at(a.qkv, l, 3 * NC);
    T* atty = at(a.atty, l, NC);
    T* fch = at(a.fch, l, 4 * NC);
    matmul_forward(qkv, static_cast<T*>(nullptr), at(a.ln1, l, NC), param(kQkvw, 3 * c * c, l),
                   param(kQkvb, 3 * c, l), N, C, 3 * C, s);
    attention_forward(atty, at(a.lse, l, static_cast<size_t>(N) * NH), qkv, B_, T_, C, NH, s);
    matmul_forward(a.branch.get(), static_cast<T*>(nullptr), atty, param(kAttprojw, c * c, l), param(kAttprojb, c, l),
                   N, C, C, s);
    residual_layernorm_forward(at(a.residual2, l, NC), at(a.ln2, l, NC), at(a.ln2_mean, l, N), at(a.ln2_rstd, l, N),
                               block_input(l), a.branch.get(), param(kLn2w, c, l), param(kLn2b, c, l), N, C, s);
    // GELU as its own kernel on the rounded pre-activation (not cuBLASLt's GELU epilogue on the
    // fp32 product), so that recomputing it from the kept fch reproduces the same bits.
    matmul_forward(fch, static_cast<T*>(nullptr), at(a.ln2, l, NC), param(kFcw, 4 * c * c, l), param(kFcb, 4 * c, l),
                   N, C, 4 * C, s);
    gelu_forward(at(a.fch_gelu, l, 4 * NC), fch, 4 * NC, s);
  }

  void run_forward() {
    const int N = rows(), C = cfg_.channels, L = cfg_.num_layers;
    const size_t NC = static_cast<size_t>(N) * C, c = C;
    Activations& a = acts_;
    cudaStream_t s = stream_;
    encoder_forward(a.encoded.get(), a.inputs.get(), param(kWte, 0, 0), param(kWpe, 0, 0), B_, T_, C, s);
    // Layer 0 normalizes the embeddings; every later ln1 (and lnf) comes out of the previous
    // layer's fused residual add + LayerNorm.
    layernorm_forward(at(a.ln1, 0, NC), at(a.ln1_mean, 0, N), at(a.ln1_rstd, 0, N), a.encoded.get(),
                      param(kLn1w, c, 0), param(kLn1b, c, 0), N, C, s);
    for (int l = 0; l < L; ++l) {
      block_forward(l);
      matmul_forward(a.branch.get(), static_cast<T*>(nullptr), at(a.fch_gelu, l, 4 * NC),
                     param(kFcprojw, 4 * c * c, l), param(kFcprojb, c, l), N, 4 * C, C, s);
      T* residual3 = a.residual3.get() + l * NC;
      if (l + 1 < L) {
        residual_layernorm_forward(residual3, at(a.ln1, l + 1, NC), at(a.ln1_mean, l + 1, N),
                                   at(a.ln1_rstd, l + 1, N), at(a.residual2, l, NC), a.branch.get(),
                                   param(kLn1w, c, l + 1), param(kLn1b, c, l + 1), N, C, s);
      } else {
        residual_layernorm_forward(residual3, a.lnf.get(), a.lnf_mean.get(), a.lnf_rstd.get(),
                                   at(a.residual2, l, NC), a.branch.get(), param(kLnfw, 0, 0), param(kLnfb, 0, 0), N,
                                   C, s);
      }
    }
  }

  // The tied lm head (over all Vp columns; the zero padding rows of wte give zero padding logits)
  // and the classifier, chunk by chunk of rows. With `losses`, each row's loss; with `train`, the
  // classifier leaves dloss·dlogits in the chunk, and the chunk's share of the lm-head backward
  // runs at once: its rows of d lnf (written into a.branch, which run_backward reads) and its
  // product added to the wte gradient, in chunk order.
  void run_head(bool losses, float dloss, bool train) {
    const int N = rows(), C = cfg_.channels, Vp = cfg_.padded_vocab_size;
    const int chunk = static_cast<int>(kLogitsChunkRows);
    Activations& a = acts_;
    for (int r = 0; r < N; r += chunk) {
      const int n = std::min(chunk, N - r);
      const size_t offset = static_cast<size_t>(r) * C;
      matmul_forward(a.logits.get(), static_cast<T*>(nullptr), a.lnf.get() + offset, param(kWte, 0, 0),
                     static_cast<T*>(nullptr), n, C, Vp, stream_);
      if (!losses) continue;
      fused_classifier(a.logits.get(), a.losses.get() + r, a.targets.get() + r, n, cfg_.vocab_size, Vp, dloss, train,
                       stream_);
      if (train)
        matmul_backward(a.branch.get() + offset, grad(kWte, 0, 0), static_cast<T*>(nullptr), static_cast<T*>(nullptr),
                        a.logits.get(), a.lnf.get() + offset, param(kWte, 0, 0), static_cast<const T*>(nullptr), n, C,
                        Vp, stream_);
    }
  }

  // Backward from d lnf, which run_head left in a.branch. Parameter gradients accumulate;
  // dresidual holds d loss / d (residual stream) at the current depth: the skip connections pass
  // it through unchanged and each LayerNorm backward adds its branch's share. Activations the
  // recompute setting did not keep are recomputed into their layer slice right before they are
  // read (a.branch, a.dwide and the scratch are free at the start of each layer).
  void run_backward() {
    const int N = rows(), C = cfg_.channels, NH = cfg_.num_heads, L = cfg_.num_layers;
    const size_t NC = static_cast<size_t>(N) * C, c = C;
    Activations& a = acts_;
    cudaStream_t s = stream_;
    T* dresidual = a.dresidual.get();
    T* dbranch = a.branch.get();
    T* dwide = a.dwide.get();
    float* scratch = a.scratch.get();
    gpt2_cuda_check(cudaMemsetAsync(dresidual, 0, a.dresidual.bytes(), s), "zeroing the residual gradient");

    layernorm_backward(dresidual, grad(kLnfw, 0, 0), grad(kLnfb, 0, 0), scratch, dbranch,
                       a.residual3.get() + (L - 1) * NC, param(kLnfw, 0, 0), a.lnf_mean.get(), a.lnf_rstd.get(), N,
                       C, s);
    const bool rerun_block = !block_keeps(BlockTensor::other, recompute_);
    const bool recompute_gelu = !rerun_block && !block_keeps(BlockTensor::fch_gelu, recompute_);
    const bool recompute_ln = !rerun_block && !block_keeps(BlockTensor::ln_output, recompute_);
    for (int l = L - 1; l >= 0; --l) {
      if (zero_ == 2) prepare_layer_block(l);
      const T* residual = block_input(l);
      T* ln1 = at(a.ln1, l, NC);
      float* ln1_mean = at(a.ln1_mean, l, N);
      float* ln1_rstd = at(a.ln1_rstd, l, N);
      T* ln2 = at(a.ln2, l, NC);
      float* ln2_mean = at(a.ln2_mean, l, N);
      float* ln2_rstd = at(a.ln2_rstd, l, N);
      const T* residual2 = at(a.residual2, l, NC);
      const T* qkv = at(a.qkv, l, 3 * NC);
      const T* atty = at(a.atty, l, NC);
      const T* fch = at(a.fch, l, 4 * NC);
      T* fch_gelu = at(a.fch_gelu, l, 4 * NC);
      // A recomputed ln1 or ln2 (layernorm_forward of the kept, rounded input) equals the forward's
      // fused residual LayerNorm output bit for bit, statistics included (kept statistics are
      // rewritten with the values they hold).
      if (rerun_block) {
        layernorm_forward(ln1, ln1_mean, ln1_rstd, residual, param(kLn1w, c, l), param(kLn1b, c, l), N, C, s);
        block_forward(l);
      }
      if (recompute_gelu) gelu_forward(fch_gelu, fch, 4 * NC, s);
      // MLP branch; dresidual = d/d residual3 = d/d fcproj.
      matmul_backward(dwide, grad(kFcprojw, 4 * c * c, l), grad(kFcprojb, c, l), static_cast<T*>(nullptr),
                      dresidual, fch_gelu, param(kFcprojw, 4 * c * c, l), static_cast<const T*>(nullptr), N, 4 * C,
                      C, s);
      if (recompute_ln)
        layernorm_forward(ln2, ln2_mean, ln2_rstd, residual2, param(kLn2w, c, l), param(kLn2b, c, l), N, C, s);
      matmul_backward(dbranch, grad(kFcw, 4 * c * c, l), grad(kFcb, 4 * c, l), dwide, dwide, ln2,
                      param(kFcw, 4 * c * c, l), fch, N, C, 4 * C, s);
      layernorm_backward(dresidual, grad(kLn2w, c, l), grad(kLn2b, c, l), scratch, dbranch, residual2,
                         param(kLn2w, c, l), ln2_mean, ln2_rstd, N, C, s);
      // Attention branch; dresidual = d/d residual2 = d/d attproj.
      matmul_backward(dbranch, grad(kAttprojw, c * c, l), grad(kAttprojb, c, l), static_cast<T*>(nullptr), dresidual,
                      atty, param(kAttprojw, c * c, l), static_cast<const T*>(nullptr), N, C, C, s);
      attention_backward(dwide, scratch, dbranch, qkv, atty, at(a.lse, l, static_cast<size_t>(N) * NH), B_, T_, C,
                         NH, s);
      if (recompute_ln)
        layernorm_forward(ln1, ln1_mean, ln1_rstd, residual, param(kLn1w, c, l), param(kLn1b, c, l), N, C, s);
      matmul_backward(dbranch, grad(kQkvw, 3 * c * c, l), grad(kQkvb, 3 * c, l), static_cast<T*>(nullptr), dwide,
                      ln1, param(kQkvw, 3 * c * c, l), static_cast<const T*>(nullptr), N, C, 3 * C, s);
      layernorm_backward(dresidual, grad(kLn1w, c, l), grad(kLn1b, c, l), scratch, dbranch, residual,
                         param(kLn1w, c, l), ln1_mean, ln1_rstd, N, C, s);
      if (communicate_gradients_) send_layer_gradients(l);
    }
    encoder_backward(grad(kWte, 0, 0), grad(kWpe, 0, 0), a.buckets.get(), num_buckets_, dresidual, B_, T_, C, s);
    if (communicate_gradients_) send_model_gradients();
  }

  bool communicating() const { return comm_ != nullptr && world_ > 1; }

  void prepare_layer_block(int l) {
    gpt2_cuda_check(cudaStreamWaitEvent(stream_, block_free_[l % 2], 0), "waiting for a gradient block");
    prepare_gradient_block(layer_grads_.get() + (l % 2) * layer_block_, layer_block_,
                           {kLn1w, kLn1b, kQkvw, kQkvb, kAttprojw, kAttprojb, kLn2w, kLn2b, kFcw, kFcb, kFcprojw,
                            kFcprojb},
                           l);
  }

  // Communicates the gradient of tensor i (layer l's slice), at grad(i, ., l), over the ranks:
  // ZeRO 0 averages it everywhere (in place); ZeRO 1 averages each piece onto the owner of the
  // shard it falls in (one in-place reduce per owner); ZeRO 2 sums each piece into the owner's
  // gradient shard.
  void send_gradient(int i, int l) {
    const auto [offset, n] = global_range(i, l);
    T* src = grad(i, n, l);  // n is the layer stride of a per-layer tensor (l = 0 for the others)
    if (zero_ == 0) {
      comm_->all_reduce(src, n, ncclAvg);
      return;
    }
    for (size_t begin = offset; begin < offset + n;) {
      const size_t owner = begin / shard_size_;
      const size_t end = std::min(offset + n, (owner + 1) * shard_size_);
      T* piece = src + (begin - offset);
      if (zero_ == 1) comm_->reduce(piece, piece, end - begin, static_cast<int>(owner), ncclAvg);
      else comm_->reduce(piece, shard_grads_.get() + (begin - owner * shard_size_), end - begin,
                         static_cast<int>(owner), ncclSum);
      begin = end;
    }
  }

  // Layer l's gradients are complete once its backward is queued: send its slice of every
  // per-layer tensor, after that backward (event), while the model's stream moves on to layer l-1.
  void send_layer_gradients(int l) {
    comm_->wait_for(stream_);
    comm_->group_start();
    for (int i = kLn1w; i <= kFcprojb; ++i) send_gradient(i, l);
    comm_->group_end();
    if (zero_ == 2)
      gpt2_cuda_check(cudaEventRecord(block_free_[l % 2], comm_->stream()), "recording a gradient-block event");
  }

  // wte (lm head and embedding), wpe and lnf are complete after the encoder backward.
  void send_model_gradients() {
    comm_->wait_for(stream_);
    comm_->group_start();
    for (int i : {kWte, kWpe, kLnfw, kLnfb}) send_gradient(i, 0);
    comm_->group_end();
  }

  void destroy_stream_and_events() {
    for (cudaEvent_t e : block_free_)
      if (e != nullptr) cudaEventDestroy(e);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  GPT2Config cfg_;
  int B_, T_;
  int recompute_;
  Communicator* comm_ = nullptr;
  int zero_ = 0, world_ = 1;
  size_t rank_ = 0;
  size_t shard_size_ = 0;                     // S: elements per rank's shard of the padded buffers
  size_t state_begin_ = 0, state_end_ = 0;    // elements whose optimizer state this rank holds
  bool communicate_gradients_ = false;        // set during the backward of a micro-step that communicates
  // ZeRO 2 only: working blocks, the gradient shard, and whether the shard holds gradients of
  // earlier micro-steps of the current optimizer step.
  DeviceArray<T> layer_grads_, model_grads_, shard_grads_;
  std::array<size_t, kNumParameterTensors> block_offset_{};
  size_t layer_block_ = 0;
  cudaEvent_t block_free_[2] = {nullptr, nullptr};  // recorded on the comm stream when a layer block is sent
  bool shard_holds_gradients_ = false;
  ParameterLayout layout_;
  cudaStream_t stream_ = nullptr;
  DeviceArray<T> params_, grads_;
  DeviceArray<float> adam_m_, adam_v_, master_;
  Activations acts_;
  size_t activation_bytes_ = 0;
  std::vector<int> buckets_host_;
  int num_buckets_ = 0;
};
