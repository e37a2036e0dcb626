// model_file.h — llm.c model files (docs/FORMATS.md, "Model file": GPT-2's and Llama 3's): reading
// and checking the header, reading the body tensor by tensor, and writing one (header, then the parameters in
// either dtype) through the one atomic writer of durable_file.h.
#pragma once
#include "src/base/file_formats.h"
#include "src/base/device.h"
#include "src/base/durable_file.h"
#include "src/config/model_config.h"

#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

struct ModelFileInfo {
  ModelConfig config;
  int version = 0;  // kModelVersionFp32 or kModelVersionBf16
  size_t element_bytes() const { return version == kModelVersionFp32 ? 4 : 2; }
};

inline int model_file_version(DType dtype) { return dtype == DType::fp32 ? kModelVersionFp32 : kModelVersionBf16; }

// The header of a model file holding `config` with `dtype` values: GPT-2's (magic 20240326), or
// llm.c's Llama 3 header (magic 20240803) with train_gpt's extension (docs/FORMATS.md).
inline std::array<int32_t, kHeaderInts> model_file_header(const ModelConfig& c, DType dtype) {
  std::array<int32_t, kHeaderInts> header{};
  header[1] = model_file_version(dtype);
  header[2] = c.max_seq_len;
  header[3] = c.vocab_size;
  header[4] = c.num_layers;
  header[5] = c.num_heads;
  if (!c.is_llama()) {
    header[0] = kModelMagic;
    header[6] = c.channels;
    header[7] = c.padded_vocab_size;
    return header;
  }
  const auto float_slot = [&](int slot, float v) { std::memcpy(&header[slot], &v, sizeof v); };
  header[0] = kLlamaModelMagic;
  header[6] = c.kv_heads();
  header[7] = c.channels;
  header[11] = static_cast<int32_t>(c.rope.theta);
  header[12] = c.rope.scaled ? 1 : 0;
  header[14] = 3;  // Llama 3.x: minor 1 or 2 by the RoPE scaling factor
  header[15] = c.rope.scaled && c.rope.factor == 32.0f ? 2 : 1;
  header[kLlamaExtension] = 1;
  header[17] = c.padded_vocab_size;
  header[18] = c.hidden();
  header[19] = c.tied_embeddings ? 1 : 0;
  header[20] = c.rope.original_context;
  float_slot(21, c.norm_eps);
  float_slot(22, c.rope.theta);
  float_slot(23, c.rope.factor);
  float_slot(24, c.rope.low_freq_factor);
  float_slot(25, c.rope.high_freq_factor);
  header[26] = c.num_experts;  // 0: the dense MLP
  header[27] = c.experts_per_token;
  header[28] = c.router == Router::sigmoid ? 1 : 0;
  float_slot(29, c.aux_loss_coef);
  return header;
}

// The configuration a Llama 3 header describes. With train_gpt's extension every field is in it;
// llm.c's llama3-branch files (no extension) hold ffn_dim_multiplier and norm_eps truncated to
// ints, so the MLP width comes from the body's size (`body_bytes`), eps is Meta's 1e-5, the
// embeddings are untied (their writer always stores lm_head), Vp = V and a scaled RoPE is 3.1's.
inline ModelConfig llama_model_config(const int32_t* header, size_t body_bytes, size_t element_bytes,
                                      const std::string& path) {
  const auto float_slot = [&](int slot) {
    float v;
    std::memcpy(&v, &header[slot], sizeof v);
    return v;
  };
  const bool extended = header[kLlamaExtension] == 1;
  RopeConfig rope = header[12] != 0 ? llama31_rope() : RopeConfig{static_cast<float>(header[11])};
  rope.theta = static_cast<float>(header[11]);
  if (extended) rope = RopeConfig{float_slot(22), header[12] != 0, float_slot(23), float_slot(24), float_slot(25), header[20]};
  ModelConfig c = llama3_config(header[2], header[3], header[4], header[5], header[6], header[7], 8, rope,
                                extended && header[19] == 1);
  if (extended) {
    c.padded_vocab_size = header[17];
    c.hidden_size = header[18];
    c.norm_eps = float_slot(21);
    c.num_experts = header[26];
    c.experts_per_token = header[27];
    c.router = header[28] == 1 ? Router::sigmoid : Router::softmax;
    c.aux_loss_coef = float_slot(29);
    if (header[28] != 0 && header[28] != 1)
      throw std::runtime_error(path + ": router kind " + std::to_string(header[28]) +
                               " in header slot 28 (expected 0: softmax or 1: sigmoid)");
    return c;
  }
  // Every tensor but the MLP's three (3·L·H·C elements) has a size the header gives.
  const ParameterLayout without_mlp(c);
  const size_t mlp_per_unit = 3 * static_cast<size_t>(c.num_layers) * c.channels;
  const size_t other = without_mlp.total - mlp_per_unit * c.hidden();
  const size_t elements = body_bytes / element_bytes;
  if (c.num_layers < 1 || c.channels < 1 || body_bytes % element_bytes != 0 || elements <= other ||
      (elements - other) % mlp_per_unit != 0)
    throw std::runtime_error(path + ": an llm.c Llama 3 model file whose " + std::to_string(body_bytes) +
                             "-byte body fits no MLP width for L=" + std::to_string(c.num_layers) +
                             " C=" + std::to_string(c.channels));
  c.hidden_size = static_cast<int>((elements - other) / mlp_per_unit);
  return c;
}

// Writes the model file of `config` with `dtype` values, tensor by tensor from `tensor_values(i,
// values)` (which fills tensor i's Elem values, llm.c order), atomically: version 3 for fp32, 5 for
// bf16. Values widen to fp32 exactly and narrow to bf16 by rounding to nearest even; with the
// parameters' own dtype the body is their bytes.
template <typename Elem, typename TensorValues>
void write_model_file_of(const std::string& path, const ModelConfig& config, DType dtype, TensorValues&& tensor_values) {
  const ParameterLayout layout(config);
  AtomicFileWriter out(path);
  const auto header = model_file_header(config, dtype);
  out.write(header.data(), sizeof header);
  for (int i = 0; i < kNumParameterTensors; ++i) {
    std::vector<Elem> values(layout[i].count);
    tensor_values(i, values);
    if (dtype == (std::is_same<Elem, float>::value ? DType::fp32 : DType::bf16)) {
      out.write(values.data(), values.size() * sizeof(Elem));
    } else if (dtype == DType::fp32) {
      std::vector<float> wide(values.size());
      for (size_t k = 0; k < values.size(); ++k) wide[k] = host_to_float(values[k]);
      out.write(wide.data(), wide.size() * sizeof(float));
    } else {
      std::vector<bf16> narrow(values.size());
      for (size_t k = 0; k < values.size(); ++k) narrow[k] = host_from_float<bf16>(host_to_float(values[k]));
      out.write(narrow.data(), narrow.size() * sizeof(bf16));
    }
  }
  out.commit();
}

// The model file from parameters on the device (`params`, llm.c order).
template <typename Elem>
void write_model_file(const std::string& path, const ModelConfig& config, const Elem* params, DType dtype,
                      cudaStream_t stream) {
  const ParameterLayout layout(config);
  write_model_file_of<Elem>(path, config, dtype, [&](int i, std::vector<Elem>& values) {
    copy_to_host(values.data(), params + layout[i].offset, values.size() * sizeof(Elem), stream);
  });
}

// The model file from parameters in host memory (`params`, llm.c order).
template <typename Elem>
void write_model_file(const std::string& path, const ModelConfig& config, const std::vector<Elem>& params,
                      DType dtype) {
  const ParameterLayout layout(config);
  write_model_file_of<Elem>(path, config, dtype, [&](int i, std::vector<Elem>& values) {
    std::copy_n(params.begin() + static_cast<std::ptrdiff_t>(layout[i].offset), values.size(), values.begin());
  });
}

// Opens an llm.c model file and checks everything but the tensor values: header magic and
// version, a configuration the kernels support, and a file size of exactly header + body.
inline ModelFileInfo read_model_file_info(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) throw std::runtime_error(path + ": cannot open model file: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(::fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) {
    std::fclose(f);
    throw std::runtime_error(path + ": is a directory, expected an llm.c model file");
  }
  int32_t header[kHeaderInts] = {};
  const size_t got = std::fread(header, sizeof(int32_t), kHeaderInts, f);
  std::fseek(f, 0, SEEK_END);
  const long file_bytes = std::ftell(f);
  std::fclose(f);
  if (got != kHeaderInts)
    throw std::runtime_error(path + ": expected an llm.c model file with a " + std::to_string(kHeaderBytes) +
                             "-byte header, found a " + std::to_string(file_bytes) + "-byte file");
  if (header[0] != kModelMagic && header[0] != kLlamaModelMagic)
    throw std::runtime_error(path + ": expected model file magic " + std::to_string(kModelMagic) + " (GPT-2) or " +
                             std::to_string(kLlamaModelMagic) + " (Llama 3), found " + std::to_string(header[0]) +
                             " (not an llm.c model file)");
  if (header[1] != kModelVersionFp32 && header[1] != kModelVersionBf16)
    throw std::runtime_error(path + ": expected model file version 3 (fp32) or 5 (bf16), found " +
                             std::to_string(header[1]));
  ModelFileInfo info;
  info.version = header[1];
  info.config = header[0] == kModelMagic
                    ? ModelConfig{header[2], header[3], header[7], header[4], header[5], header[6]}
                    : llama_model_config(header, file_bytes > static_cast<long>(kHeaderBytes) ? file_bytes - kHeaderBytes : 0,
                                         info.element_bytes(), path);
  check_model_config(info.config, path);
  const size_t expected = kHeaderBytes + ParameterLayout(info.config).total * info.element_bytes();
  if (static_cast<size_t>(file_bytes) != expected)
    throw std::runtime_error(path + ": expected " + std::to_string(expected) + " bytes for a version " +
                             std::to_string(info.version) + " model with " + describe(info.config) + ", found " +
                             std::to_string(file_bytes) + " bytes");
  return info;
}

inline ModelConfig read_model_header(const std::string& path) { return read_model_file_info(path).config; }

// A NaN or infinite weight makes every loss and sample of the model NaN: a model file holding one
// (a run that diverged, a damaged file) is refused, naming the tensor and where in it.
inline void check_finite_tensor(const std::string& path, const ParameterLayout& layout, int i,
                                const std::vector<float>& values) {
  size_t bad = 0, first = 0;
  for (size_t k = values.size(); k-- > 0;)
    if (!std::isfinite(values[k])) ++bad, first = k;
  if (bad == 0) return;
  const std::string where = is_layer_tensor(i) ? " (layer " + std::to_string(first / layout.slice_count(i)) + ")" : "";
  throw std::runtime_error(path + ": tensor " + layout[i].name + " holds " + std::to_string(bad) +
                           " non-finite value(s) (NaN or infinity), the first at element " + std::to_string(first) +
                           where);
}

// Reads the body of a model file that read_model_file_info checked, one tensor at a time in
// llm.c order, as float values (bf16 values widen exactly): tensor(i, values) for each.
inline void read_model_tensors(const std::string& path, const ModelFileInfo& info,
                               const std::function<void(int, const std::vector<float>&)>& tensor) {
  const ParameterLayout layout(info.config);
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) throw std::runtime_error(path + ": cannot open model file: " + std::strerror(errno));
  try {
    std::fseek(f, static_cast<long>(kHeaderBytes), SEEK_SET);
    for (int i = 0; i < kNumParameterTensors; ++i) {
      const size_t n = layout[i].count;
      std::vector<float> values(n);
      bool complete;
      if (info.version == kModelVersionFp32) {
        complete = std::fread(values.data(), sizeof(float), n, f) == n;
      } else {
        std::vector<bf16> raw(n);
        complete = std::fread(raw.data(), sizeof(bf16), n, f) == n;
        for (size_t k = 0; k < n; ++k) values[k] = host_to_float(raw[k]);
      }
      if (!complete) throw std::runtime_error(path + ": file ended inside tensor " + layout[i].name);
      check_finite_tensor(path, layout, i, values);
      tensor(i, values);
    }
  } catch (...) {
    std::fclose(f);
    throw;
  }
  std::fclose(f);
}

// The parameters of a model file on the device as Elem (llm.c order, ParameterLayout of its
// configuration; bf16 values widen to fp32 exactly, fp32 values round to nearest for bf16), for
// inference: no gradients or optimizer state. *config receives the file's configuration.
template <typename Elem>
DeviceArray<Elem> load_model_parameters(const std::string& path, ModelConfig* config) {
  const ModelFileInfo info = read_model_file_info(path);
  const ParameterLayout layout(info.config);
  DeviceArray<Elem> params(layout.total, "the model's parameters");
  read_model_tensors(path, info, [&](int i, const std::vector<float>& values) {
    upload_floats(params.get() + layout[i].offset, values, path + ": tensor " + layout[i].name);
  });
  *config = info.config;
  return params;
}
