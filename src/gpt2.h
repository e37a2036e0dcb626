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
#include "../kernels/layernorm.cuh"
#include "../kernels/matmul.cuh"
#include "../kernels/attention.cuh"
#include "../kernels/classifier.cuh"
#include "../kernels/global_norm.cuh"
#include "../kernels/adamw.cuh"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <type_traits>
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
// The model.

template <typename T>
class GPT2 {
  static_assert(std::is_same<T, float>::value || std::is_same<T, bf16>::value, "GPT2<T>: T is float or bf16");

 public:
  static constexpr DType dtype = std::is_same<T, float>::value ? DType::fp32 : DType::bf16;

  // Allocates parameters, gradients, optimizer state and the activations of one B×seq_len
  // micro-batch (the sequence length is fixed for the model's lifetime). Parameters, gradients and
  // optimizer state start at zero: call init_random() or load().
  GPT2(const GPT2Config& cfg, int B, int seq_len) : cfg_(cfg), B_(B), T_(seq_len) {
    gpt2_check_config(cfg, "model configuration");
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
      allocate();
    } catch (...) {
      cudaStreamDestroy(stream_);  // no destructor runs for a constructor that throws
      throw;
    }
  }
  GPT2(const GPT2&) = delete;
  GPT2& operator=(const GPT2&) = delete;
  ~GPT2() {
    if (stream_ != nullptr) {
      cudaStreamSynchronize(stream_);
      cudaStreamDestroy(stream_);
    }
  }

  const GPT2Config& config() const { return cfg_; }
  const ParameterLayout& layout() const { return layout_; }
  int batch_size() const { return B_; }
  int seq_len() const { return T_; }
  cudaStream_t stream() const { return stream_; }

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
  // mean cross-entropy over the B·T positions and keeps the logits (logits()). targets may be
  // nullptr (no loss: returns NaN), e.g. for sampling.
  float forward(const int* inputs, const int* targets) {
    upload_tokens(inputs, targets);
    run_forward();
    if (targets == nullptr) {
      gpt2_cuda_check(cudaStreamSynchronize(stream_), "forward pass");
      return std::numeric_limits<float>::quiet_NaN();
    }
    fused_classifier(acts_.logits.get(), acts_.losses.get(), acts_.targets.get(), rows(), cfg_.vocab_size,
                     cfg_.padded_vocab_size, 0.0f, false, stream_);
    return mean_loss();
  }

  // Forward pass, then the gradient of (mean loss / grad_accum_steps) ADDED to the parameter
  // gradients (call zero_grad() before the first micro-step of an optimizer step). Returns this
  // micro-batch's mean loss. Overwrites the logits with their gradient.
  float forward_backward(const int* inputs, const int* targets, int grad_accum_steps) {
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
    const float dloss = 1.0f / (static_cast<float>(rows()) * static_cast<float>(grad_accum_steps));
    fused_classifier(acts_.logits.get(), acts_.losses.get(), acts_.targets.get(), rows(), cfg_.vocab_size,
                     cfg_.padded_vocab_size, dloss, true, stream_);
    run_backward();
    return mean_loss();
  }

  void zero_grad() {
    gpt2_cuda_check(cudaMemsetAsync(grads_.get(), 0, grads_.bytes(), stream_), "zeroing gradients");
  }

  // One optimizer step (step is 1-based) from the accumulated gradients. Returns the global
  // gradient norm before clipping; when grad_clip > 0 and the norm exceeds it, the gradients enter
  // AdamW scaled by grad_clip / norm. AdamW runs per tensor, weight decay only on the 2-D weights
  // (wte, wpe, qkvw, attprojw, fcw, fcprojw). T = bf16 updates the fp32 master weights and stores
  // them stochastically rounded (seed adamw_rounding_seed(opt.seed, step, tensor)); T = float
  // updates the parameters themselves. A non-finite norm is returned as is (the caller decides).
  float update(const OptimizerSettings& opt, float lr, int step) {
    const float norm = gradient_norm();
    apply_update(opt, lr, step, norm);
    return norm;
  }

  // The global norm of the accumulated gradients (update()'s first half, for callers that look at
  // the norm before deciding whether to apply the step).
  float gradient_norm() {
    float* norm_squared = acts_.norm_squared.get();
    gpt2_cuda_check(cudaMemsetAsync(norm_squared, 0, sizeof(float), stream_), "gradient norm");
    global_norm_squared(norm_squared, acts_.scratch.get(), grads_.get(), layout_.total, stream_);
    float norm_squared_host = 0.0f;
    download(&norm_squared_host, norm_squared, sizeof(float));
    return std::sqrt(norm_squared_host);
  }

  // update()'s second half: the AdamW step, given gradient_norm()'s result for the clipping.
  void apply_update(const OptimizerSettings& opt, float lr, int step, float norm) {
    if (step < 1) throw std::runtime_error("optimizer step: expected step >= 1, found " + std::to_string(step));
    const float grad_scale = (opt.grad_clip > 0.0f && norm > opt.grad_clip) ? opt.grad_clip / norm : 1.0f;
    for (int i = 0; i < kNumParameterTensors; ++i) {
      const ParameterInfo& t = layout_[i];
      float* master = master_.get() != nullptr ? master_.get() + t.offset : nullptr;
      adamw_update(params_.get() + t.offset, master, grads_.get() + t.offset, adam_m_.get() + t.offset,
                   adam_v_.get() + t.offset, t.count, lr, opt.beta1, opt.beta2, opt.eps,
                   t.decayed ? opt.weight_decay : 0.0f, grad_scale, step, adamw_rounding_seed(opt.seed, step, i),
                   stream_);
    }
  }

  size_t num_parameters() const { return layout_.total; }

  // Host copies as float, llm.c order.
  std::vector<float> parameters() const { return download_floats(params_.get(), layout_.total); }
  std::vector<float> gradients() const { return download_floats(grads_.get(), layout_.total); }
  // B·T·Vp values ([B][T][Vp]) from the last forward(); after forward_backward() they are the
  // logits' gradients.
  std::vector<float> logits() const { return download_floats(acts_.logits.get(), acts_.logits.count()); }
  // The Vp logits of position (b, t) from the last forward() (for sampling).
  std::vector<float> logits_at(int b, int t) const {
    if (b < 0 || b >= B_ || t < 0 || t >= T_)
      throw std::runtime_error("logits_at: position (" + std::to_string(b) + ", " + std::to_string(t) +
                               ") is outside the micro-batch " + std::to_string(B_) + "x" + std::to_string(T_));
    const size_t row = static_cast<size_t>(b) * T_ + t;
    return download_floats(acts_.logits.get() + row * cfg_.padded_vocab_size, cfg_.padded_vocab_size);
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
  // with the micro-batch (activations kept for the backward pass, gradient buffers, scratch, tokens).
  size_t parameter_bytes() const { return params_.bytes() + grads_.bytes(); }
  size_t optimizer_bytes() const { return adam_m_.bytes() + adam_v_.bytes() + master_.bytes(); }
  size_t activation_bytes() const { return activation_bytes_; }

 private:
  // Activations of one micro-batch, N = B·T rows. Per-layer tensors hold L slices.
  struct Activations {
    DeviceArray<T> encoded;                       // (N, C) wte[token] + wpe[t]: layer 0's input
    DeviceArray<T> ln1, atty, residual2, ln2;     // (L, N, C)
    DeviceArray<T> residual3;                     // (L, N, C) residual2 + fcproj: the next layer's input
    DeviceArray<T> qkv;                           // (L, N, 3C)
    DeviceArray<T> fch, fch_gelu;                 // (L, N, 4C) before / after GELU
    DeviceArray<float> ln1_mean, ln1_rstd, ln2_mean, ln2_rstd;  // (L, N)
    DeviceArray<float> lse;                       // (L, B, NH, T) attention log-sum-exp
    DeviceArray<T> lnf;                           // (N, C)
    DeviceArray<float> lnf_mean, lnf_rstd;        // (N)
    DeviceArray<T> logits;                        // (N, Vp); the classifier writes dlogits in place
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
    const size_t L = cfg_.num_layers, C = cfg_.channels, N = static_cast<size_t>(rows());
    const size_t P = layout_.total;
    params_ = DeviceArray<T>(P, "parameters");
    grads_ = DeviceArray<T>(P, "gradients");
    adam_m_ = DeviceArray<float>(P, "AdamW first moments");
    adam_v_ = DeviceArray<float>(P, "AdamW second moments");
    if (dtype == DType::bf16) master_ = DeviceArray<float>(P, "fp32 master weights");
    gpt2_cuda_check(cudaMemset(params_.get(), 0, params_.bytes()), "zeroing parameters");
    if (master_.get() != nullptr)
      gpt2_cuda_check(cudaMemset(master_.get(), 0, master_.bytes()), "zeroing master weights");
    reset_training_state();

    Activations& a = acts_;
    a.encoded = DeviceArray<T>(N * C, "activations (encoded)");
    a.ln1 = DeviceArray<T>(L * N * C, "activations (ln1)");
    a.atty = DeviceArray<T>(L * N * C, "activations (attention output)");
    a.residual2 = DeviceArray<T>(L * N * C, "activations (residual2)");
    a.ln2 = DeviceArray<T>(L * N * C, "activations (ln2)");
    a.residual3 = DeviceArray<T>(L * N * C, "activations (residual3)");
    a.qkv = DeviceArray<T>(L * N * 3 * C, "activations (qkv)");
    a.fch = DeviceArray<T>(L * N * 4 * C, "activations (fch)");
    a.fch_gelu = DeviceArray<T>(L * N * 4 * C, "activations (fch_gelu)");
    a.ln1_mean = DeviceArray<float>(L * N, "activations (ln1 mean)");
    a.ln1_rstd = DeviceArray<float>(L * N, "activations (ln1 rstd)");
    a.ln2_mean = DeviceArray<float>(L * N, "activations (ln2 mean)");
    a.ln2_rstd = DeviceArray<float>(L * N, "activations (ln2 rstd)");
    a.lse = DeviceArray<float>(L * N * cfg_.num_heads, "activations (attention lse)");
    a.lnf = DeviceArray<T>(N * C, "activations (lnf)");
    a.lnf_mean = DeviceArray<float>(N, "activations (lnf mean)");
    a.lnf_rstd = DeviceArray<float>(N, "activations (lnf rstd)");
    a.logits = DeviceArray<T>(N * cfg_.padded_vocab_size, "activations (logits)");
    a.losses = DeviceArray<float>(N, "activations (losses)");
    a.branch = DeviceArray<T>(N * C, "activations (branch output / input gradient)");
    a.dresidual = DeviceArray<T>(N * C, "activation gradients (residual)");
    a.dwide = DeviceArray<T>(N * 4 * C, "activation gradients (fch / qkv)");
    const size_t scratch_bytes =
        std::max({layernorm_backward_scratch_bytes(rows(), cfg_.channels),
                  attention_backward_scratch_bytes(B_, T_, cfg_.num_heads), global_norm_scratch_bytes()});
    a.scratch = DeviceArray<float>(ceil_div(scratch_bytes, sizeof(float)), "scratch");
    a.norm_squared = DeviceArray<float>(1, "gradient norm");
    a.inputs = DeviceArray<int>(N, "input tokens");
    a.targets = DeviceArray<int>(N, "target tokens");
    const size_t bucket_bytes = encoder_backward_scratch_bytes(B_, T_);
    a.buckets = DeviceArray<int>(bucket_bytes / sizeof(int), "encoder-gradient buckets");
    buckets_host_.assign(bucket_bytes / sizeof(int), 0);

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
    gpt2_cuda_check(cudaMemsetAsync(grads_.get(), 0, grads_.bytes(), stream_), "zeroing gradients");
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
    if (master_.get() != nullptr) {
      gpt2_cuda_check(cudaMemcpy(master_.get() + t.offset, values.data(), t.count * sizeof(float),
                                 cudaMemcpyHostToDevice),
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
  T* grad(int tensor, size_t layer_stride, int layer) const {
    return grads_.get() + layout_[tensor].offset + layer_stride * layer;
  }

  void run_forward() {
    const int N = rows(), C = cfg_.channels, NH = cfg_.num_heads, L = cfg_.num_layers;
    const size_t NC = static_cast<size_t>(N) * C, c = C;
    Activations& a = acts_;
    cudaStream_t s = stream_;
    encoder_forward(a.encoded.get(), a.inputs.get(), param(kWte, 0, 0), param(kWpe, 0, 0), B_, T_, C, s);
    // Layer 0 normalizes the embeddings; every later ln1 (and lnf) comes out of the previous
    // layer's fused residual add + LayerNorm.
    layernorm_forward(a.ln1.get(), a.ln1_mean.get(), a.ln1_rstd.get(), a.encoded.get(), param(kLn1w, c, 0),
                      param(kLn1b, c, 0), N, C, s);
    for (int l = 0; l < L; ++l) {
      const T* residual = l == 0 ? a.encoded.get() : a.residual3.get() + (l - 1) * NC;
      T* ln1 = a.ln1.get() + l * NC;
      T* qkv = a.qkv.get() + l * 3 * NC;
      T* atty = a.atty.get() + l * NC;
      T* residual2 = a.residual2.get() + l * NC;
      T* ln2 = a.ln2.get() + l * NC;
      T* fch = a.fch.get() + l * 4 * NC;
      T* fch_gelu = a.fch_gelu.get() + l * 4 * NC;
      T* residual3 = a.residual3.get() + l * NC;
      matmul_forward(qkv, static_cast<T*>(nullptr), ln1, param(kQkvw, 3 * c * c, l), param(kQkvb, 3 * c, l), N, C,
                     3 * C, s);
      attention_forward(atty, a.lse.get() + l * static_cast<size_t>(N) * NH, qkv, B_, T_, C, NH, s);
      matmul_forward(a.branch.get(), static_cast<T*>(nullptr), atty, param(kAttprojw, c * c, l),
                     param(kAttprojb, c, l), N, C, C, s);
      residual_layernorm_forward(residual2, ln2, a.ln2_mean.get() + l * N, a.ln2_rstd.get() + l * N, residual,
                                 a.branch.get(), param(kLn2w, c, l), param(kLn2b, c, l), N, C, s);
      matmul_forward(fch_gelu, fch, ln2, param(kFcw, 4 * c * c, l), param(kFcb, 4 * c, l), N, C, 4 * C, s);
      matmul_forward(a.branch.get(), static_cast<T*>(nullptr), fch_gelu, param(kFcprojw, 4 * c * c, l),
                     param(kFcprojb, c, l), N, 4 * C, C, s);
      if (l + 1 < L) {
        residual_layernorm_forward(residual3, a.ln1.get() + (l + 1) * NC, a.ln1_mean.get() + (l + 1) * N,
                                   a.ln1_rstd.get() + (l + 1) * N, residual2, a.branch.get(),
                                   param(kLn1w, c, l + 1), param(kLn1b, c, l + 1), N, C, s);
      } else {
        residual_layernorm_forward(residual3, a.lnf.get(), a.lnf_mean.get(), a.lnf_rstd.get(), residual2,
                                   a.branch.get(), param(kLnfw, 0, 0), param(kLnfb, 0, 0), N, C, s);
      }
    }
    // Tied lm head over all Vp columns; the zero padding rows of wte give zero padding logits.
    matmul_forward(a.logits.get(), static_cast<T*>(nullptr), a.lnf.get(), param(kWte, 0, 0), static_cast<T*>(nullptr),
                   N, C, cfg_.padded_vocab_size, s);
  }

  // Backward from the dlogits the classifier left in a.logits. Parameter gradients accumulate;
  // dresidual holds d loss / d (residual stream) at the current depth: the skip connections pass
  // it through unchanged and each LayerNorm backward adds its branch's share.
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

    matmul_backward(dbranch, grad(kWte, 0, 0), static_cast<T*>(nullptr), static_cast<T*>(nullptr), a.logits.get(),
                    a.lnf.get(), param(kWte, 0, 0), static_cast<const T*>(nullptr), N, C, cfg_.padded_vocab_size, s);
    layernorm_backward(dresidual, grad(kLnfw, 0, 0), grad(kLnfb, 0, 0), scratch, dbranch,
                       a.residual3.get() + (L - 1) * NC, param(kLnfw, 0, 0), a.lnf_mean.get(), a.lnf_rstd.get(), N,
                       C, s);
    for (int l = L - 1; l >= 0; --l) {
      const T* residual = l == 0 ? a.encoded.get() : a.residual3.get() + (l - 1) * NC;
      const T* ln1 = a.ln1.get() + l * NC;
      const T* qkv = a.qkv.get() + l * 3 * NC;
      const T* atty = a.atty.get() + l * NC;
      const T* residual2 = a.residual2.get() + l * NC;
      const T* ln2 = a.ln2.get() + l * NC;
      const T* fch = a.fch.get() + l * 4 * NC;
      const T* fch_gelu = a.fch_gelu.get() + l * 4 * NC;
      // MLP branch; dresidual = d/d residual3 = d/d fcproj.
      matmul_backward(dwide, grad(kFcprojw, 4 * c * c, l), grad(kFcprojb, c, l), static_cast<T*>(nullptr),
                      dresidual, fch_gelu, param(kFcprojw, 4 * c * c, l), static_cast<const T*>(nullptr), N, 4 * C,
                      C, s);
      matmul_backward(dbranch, grad(kFcw, 4 * c * c, l), grad(kFcb, 4 * c, l), dwide, dwide, ln2,
                      param(kFcw, 4 * c * c, l), fch, N, C, 4 * C, s);
      layernorm_backward(dresidual, grad(kLn2w, c, l), grad(kLn2b, c, l), scratch, dbranch, residual2,
                         param(kLn2w, c, l), a.ln2_mean.get() + l * N, a.ln2_rstd.get() + l * N, N, C, s);
      // Attention branch; dresidual = d/d residual2 = d/d attproj.
      matmul_backward(dbranch, grad(kAttprojw, c * c, l), grad(kAttprojb, c, l), static_cast<T*>(nullptr), dresidual,
                      atty, param(kAttprojw, c * c, l), static_cast<const T*>(nullptr), N, C, C, s);
      attention_backward(dwide, scratch, dbranch, qkv, atty, a.lse.get() + l * static_cast<size_t>(N) * NH, B_, T_,
                         C, NH, s);
      matmul_backward(dbranch, grad(kQkvw, 3 * c * c, l), grad(kQkvb, 3 * c, l), static_cast<T*>(nullptr), dwide,
                      ln1, param(kQkvw, 3 * c * c, l), static_cast<const T*>(nullptr), N, C, 3 * C, s);
      layernorm_backward(dresidual, grad(kLn1w, c, l), grad(kLn1b, c, l), scratch, dbranch, residual,
                         param(kLn1w, c, l), a.ln1_mean.get() + l * N, a.ln1_rstd.get() + l * N, N, C, s);
    }
    encoder_backward(grad(kWte, 0, 0), grad(kWpe, 0, 0), a.buckets.get(), num_buckets_, dresidual, B_, T_, C, s);
  }

  GPT2Config cfg_;
  int B_, T_;
  ParameterLayout layout_;
  cudaStream_t stream_ = nullptr;
  DeviceArray<T> params_, grads_;
  DeviceArray<float> adam_m_, adam_v_, master_;
  Activations acts_;
  size_t activation_bytes_ = 0;
  std::vector<int> buckets_host_;
  int num_buckets_ = 0;
};
