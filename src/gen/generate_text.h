// generate_text.h — --generate: a model file's parameters alone (no gradients or optimizer state)
// continuing --prompt; the text on stdout token by token as it comes, a summary on stderr.
#pragma once
#include "src/base/device.h"
#include "src/base/error_context.h"
#include "src/config/config.h"
#include "src/gen/generate.h"
#include "src/gen/sample_text.h"
#include "src/model/attention.h"
#include "src/model/model_source.h"

#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

// `model_path`: --init-from's file or --resume's checkpoint's (`flag` names which); nothing is written.
template <typename Elem>
void generate_text(const TrainConfig& cfg, const char* flag, const std::string& model_path,
                   const std::string& model_source, const TextSampler& sampler) {
  ModelConfig model;
  const DeviceArray<Elem> params = with_context(flag, [&] { return load_model_source_parameters<Elem>(model_path, &model); });
  const CudaStream stream("creating the generation's CUDA stream");
  const DType dtype = std::is_same<Elem, float>::value ? DType::fp32 : DType::bf16;
  KvCacheDecoder<Elem> decoder(model, params.get(), sampler.cache_positions(), choose_attention(cfg.attention, dtype, model),
                               stream.get());
  std::printf("%s", cfg.prompt.c_str());
  std::fflush(stdout);
  const auto start = std::chrono::steady_clock::now();
  std::optional<std::chrono::steady_clock::time_point> first;  // the first token's: the prefill's end
  const std::vector<int> tokens = generate_tokens(decoder, sampler.prompt(), sampler.max_new_tokens(),
                                                  sampler.settings(), [&](int token, const std::vector<float>&) {
    if (!first) first = std::chrono::steady_clock::now();
    std::printf("%s", sampler.decode({token}).c_str());
    std::fflush(stdout);
  });
  const auto end = std::chrono::steady_clock::now();
  std::printf("\n");
  std::fflush(stdout);
  const double prefill_ms = std::chrono::duration<double, std::milli>(*first - start).count();
  const double decode_ms = std::chrono::duration<double, std::milli>(end - *first).count();
  std::fprintf(stderr, "generated %zu token(s) after a %zu-token prompt (%s; %s, %s): prefill %.1f ms, %.2f ms/token\n",
               tokens.size(), sampler.prompt().size(), sampler.describe_settings().c_str(), model_source.c_str(),
               dtype_name(dtype), prefill_ms, tokens.size() > 1 ? decode_ms / static_cast<double>(tokens.size() - 1) : 0.0);
}
