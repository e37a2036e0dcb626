// rope_config.h — the settings of rotary position embeddings (RoPE): the base θ and Llama 3.1's
// frequency scaling. A plain struct, so the model's configuration (host code) and the RoPE kernel
// (kernels/rope.cuh) share it.
#pragma once

// Llama 3: θ 500,000 unscaled; 3.1: factor 8, low 1, high 4, original context 8,192; 3.2: factor 32,
// the rest alike.
struct RopeConfig {
  float theta = 0.0f;
  bool scaled = false;  // false: Llama 3's unscaled frequencies; the four fields below are then unused
  float factor = 0.0f;
  float low_freq_factor = 0.0f;
  float high_freq_factor = 0.0f;
  int original_context = 0;
};

inline bool operator==(const RopeConfig& a, const RopeConfig& b) {
  return a.theta == b.theta && a.scaled == b.scaled &&
         (!a.scaled || (a.factor == b.factor && a.low_freq_factor == b.low_freq_factor &&
                        a.high_freq_factor == b.high_freq_factor && a.original_context == b.original_context));
}
