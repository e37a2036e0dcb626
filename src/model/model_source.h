// model_source.h — where --init-from's weights come from: an llm.c model file (model_file.h) or a
// Hugging Face Llama directory (hf_llama.h), chosen by whether the path is a directory; and
// --export-hf, a model file written out as a Hugging Face directory.
#pragma once
#include "src/base/device.h"
#include "src/config/model_config.h"
#include "src/model/hf_llama.h"
#include "src/model/model_file.h"

#include <functional>
#include <string>
#include <vector>

// The architecture of PATH: a directory's config.json, else the model file's header.
inline ModelConfig model_source_config(const std::string& path) {
  return is_directory(path) ? read_hf_llama_config(path) : read_model_header(path);
}

// PATH's tensors in llm.c order as float, tensor(i, values) for each (non-finite values refused by name).
inline void read_model_source_tensors(const std::string& path, const ModelConfig& config,
                                      const std::function<void(int, const std::vector<float>&)>& tensor) {
  if (!is_directory(path)) {
    read_model_tensors(path, read_model_file_info(path), tensor);
    return;
  }
  const ParameterLayout layout(config);
  read_hf_llama_tensors(path, config, [&](int i, const std::vector<float>& values) {
    check_finite_tensor(path, layout, i, values);
    tensor(i, values);
  });
}

// The parameters of PATH on the device as Elem, for inference (model_file.h's load_model_parameters
// for either kind of source); *config receives its configuration.
template <typename Elem>
DeviceArray<Elem> load_model_source_parameters(const std::string& path, ModelConfig* config) {
  if (!is_directory(path)) return load_model_parameters<Elem>(path, config);
  *config = read_hf_llama_config(path);
  const ParameterLayout layout(*config);
  DeviceArray<Elem> params(layout.total, "the model's parameters");
  read_model_source_tensors(path, *config, [&](int i, const std::vector<float>& values) {
    upload_floats(params.get() + layout[i].offset, values, path + ": tensor " + layout[i].name);
  });
  return params;
}

// The model file MODEL (a Llama's) as the Hugging Face directory DIR, values in the file's dtype.
// The model is held in host memory as float meanwhile (4 bytes a parameter).
inline void export_hf_llama(const std::string& model, const std::string& dir) {
  const ModelFileInfo info = read_model_file_info(model);
  std::vector<std::vector<float>> tensors(kNumParameterTensors);
  read_model_tensors(model, info, [&](int i, const std::vector<float>& values) { tensors[i] = values; });
  write_hf_llama(dir, info.config, info.version == kModelVersionFp32 ? DType::fp32 : DType::bf16,
                 [&](int i) { return std::move(tensors[i]); });
}
