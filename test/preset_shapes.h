// preset_shapes.h — the widest shape each model preset gives the kernels, read from model_presets(),
// so that every kernel test launches at every preset's full width (C, all NH heads, the head size,
// the padded vocabulary) and a new preset is covered without editing a test. The launch rules
// (threads, grid, shared memory; registers too when SIMT_KERNEL_RESOURCES names the GPU build's
// ptxas table) then judge each kernel at the shapes the trainer will use: a kernel whose resources
// grow with a width fails here rather than at a recipe's first step on a GPU.
#pragma once
#include "src/config/model_config.h"

#include <string>
#include <vector>

namespace test {

struct PresetShape {
  std::string presets;  // the presets with this shape, e.g. "d12, gpt3-125m"
  int C = 0, NH = 0, head_size = 0;
  int NKV = 0, QKV = 0, H = 0;  // K/V heads, the fused qkv's width, the MLP's hidden units
  int V = 0, Vp = 0;    // real and padded vocabulary
  int max_seq_len = 0;  // the largest maxT of these presets
};

// One entry per distinct (C, NH, NKV, H, V, Vp), in model_presets()' order. Tensor parallelism only narrows
// these (heads and vocabulary are split, C never is), so a single rank's shape is the widest.
inline std::vector<PresetShape> preset_shapes() {
  std::vector<PresetShape> shapes;
  for (const ModelPreset& p : model_presets()) {
    const ModelConfig& c = p.config;
    PresetShape* same = nullptr;
    for (PresetShape& s : shapes)
      if (s.C == c.channels && s.NH == c.num_heads && s.NKV == c.kv_heads() && s.H == c.hidden() &&
          s.V == c.vocab_size && s.Vp == c.padded_vocab_size)
        same = &s;
    if (same == nullptr) {
      shapes.push_back({p.name, c.channels, c.num_heads, c.head_size(), c.kv_heads(), c.qkv_channels(), c.hidden(),
                        c.vocab_size, c.padded_vocab_size, c.max_seq_len});
    } else {
      same->presets += std::string(", ") + p.name;
      if (c.max_seq_len > same->max_seq_len) same->max_seq_len = c.max_seq_len;
    }
  }
  return shapes;
}

}  // namespace test
