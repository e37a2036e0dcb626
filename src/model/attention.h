// attention.h — which attention kernel the model runs (--attention) and running it: flash
// attention on tensor cores (kernels/flash_attention.cuh) for bf16 at the head sizes it supports,
// the simple kernel (kernels/attention.cuh) for fp32 — the exact parity mode — and other head
// sizes. Both read q, k, v from the fused (B, T, (NH + 2·NKV)·HS) qkv (NKV K/V heads, each serving
// NH/NKV query heads; NKV = NH is multi-head attention) and keep the same lse (B, NH, T), so the
// rest of the model does not depend on the choice (docs/ATTENTION.md).
#pragma once
#include "kernels/attention.cuh"
#include "kernels/flash_attention.cuh"
#include "src/config/model_config.h"

#include <stdexcept>
#include <string>
#include <type_traits>

enum class AttentionKernel { simple, flash };

inline const char* attention_name(AttentionKernel k) { return k == AttentionKernel::flash ? "flash" : "simple"; }

// The kernel for --attention `requested`: "auto" picks flash wherever it can run, "flash" is an
// error where it cannot, "simple" is always possible.
inline AttentionKernel choose_attention(const std::string& requested, DType dtype, const ModelConfig& cfg) {
  const int head_size = cfg.channels / cfg.num_heads;
  const bool flash_runs = dtype == DType::bf16 && flash_attention_supports(head_size);
  if (requested == "simple") return AttentionKernel::simple;
  if (requested == "auto") return flash_runs ? AttentionKernel::flash : AttentionKernel::simple;
  if (requested != "flash")
    throw std::runtime_error("--attention: expected auto, flash or simple, found '" + requested + "'");
  if (!flash_runs)
    throw std::runtime_error("--attention flash: needs --dtype bf16 and a head size C/NH of 16, 32, 64 or 128; this "
                             "run has --dtype " + std::string(dtype_name(dtype)) + " and head size " +
                             std::to_string(head_size) + " (use --attention simple or auto)");
  return AttentionKernel::flash;
}

// out (B, T, C) and lse (B, NH, T) from qkv (B, T, (NH + 2·NKV)·C/NH).
template <typename Elem>
void model_attention_forward(AttentionKernel kernel, Elem* out, float* lse, const Elem* qkv, int B, int seq_len, int C,
                             int NH, int NKV, cudaStream_t stream) {
  if constexpr (std::is_same<Elem, bf16>::value) {
    if (kernel == AttentionKernel::flash) return flash_attention_forward(out, lse, qkv, B, seq_len, C, NH, NKV, stream);
  }
  attention_forward(out, lse, qkv, B, seq_len, C, NH, NKV, stream);
}

// dqkv (B, T, (NH + 2·NKV)·C/NH) from dout (B, T, C); scratch: (attention|flash_attention)_backward_scratch_bytes,
// which are the same.
template <typename Elem>
void model_attention_backward(AttentionKernel kernel, Elem* dqkv, float* scratch, const Elem* dout, const Elem* qkv,
                              const Elem* out, const float* lse, int B, int seq_len, int C, int NH, int NKV,
                              cudaStream_t stream) {
  if constexpr (std::is_same<Elem, bf16>::value) {
    if (kernel == AttentionKernel::flash)
      return flash_attention_backward(dqkv, scratch, dout, qkv, out, lse, B, seq_len, C, NH, NKV, stream);
  }
  attention_backward(dqkv, scratch, dout, qkv, out, lse, B, seq_len, C, NH, NKV, stream);
}
