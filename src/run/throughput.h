// throughput.h — model FLOPs per token, the dense bf16 peak of known GPUs, and MFU: what the step
// lines' "MFU" and the end-of-training throughput summary are computed from.
//
// FLOPs per trained token, llm.c's convention (so our MFU compares directly with its published
// figures and with make gpu-acceptance's report), one rule for GPT-2 and Llama 3:
//   6·N + 6·L·C·T
// N: every parameter, wte at its padded Vp rows included (6 per parameter: forward and backward
// are 3 x the forward's multiply-add, 2 FLOPs each); embedding lookups count as products, as in
// llm.c: GPT-2's wpe, and Llama's wte beside its untied lm_head (both in N). 6·L·C·T: attention's
// two T-long products per token and layer over the NH query heads (C = NH·HS, the query width:
// GQA shares K/V heads but not this work) with the causal mask's halving (2·2·C·T forward over
// the full square, halved, times 3). The model's FLOP count: recomputation (--recompute) does
// more work but does not count.
#pragma once
#include "src/base/units.h"
#include "src/config/model_config.h"

#include <algorithm>
#include <cctype>
#include <optional>
#include <string>
#include <vector>

// The parameters a token's products read: all of them, less, with experts, the E − K experts
// (w1, w3, w2: 3·H·C each) of each layer it is not routed to.
inline size_t active_parameters(const ModelConfig& c) {
  const size_t unrouted = c.moe() ? static_cast<size_t>(c.num_experts - c.experts_per_token) : 0;
  return ParameterLayout(c).total - c.num_layers * unrouted * 3 * static_cast<size_t>(c.hidden()) * c.channels;
}

// 6·N + 6·L·C·T for a sequence length T (N: active_parameters).
inline double flops_per_token(const ModelConfig& c, int seq_len) {
  const double parameters = static_cast<double>(active_parameters(c));
  return 6.0 * parameters + 6.0 * c.num_layers * static_cast<double>(c.channels) * seq_len;
}

// "6N + 6LCT, llm.c's: N = 124,475,904 parameters, C = 768 (NH·HS)": the formula with this model's
// terms (with experts, N counts the K experts a token is routed to).
inline std::string flops_formula_text(const ModelConfig& c) {
  return "6N + 6LCT, llm.c's: N = " + thousands(active_parameters(c)) +
         (c.moe() ? " active parameters (K of E experts)" : " parameters") + ", C = " +
         std::to_string(c.num_heads * c.head_size()) + " (NH·HS)";
}

// One row of the peak table: a GPU whose device name holds every word of `words` (and none of
// `not_words`), compared without case, words split at spaces and dashes.
struct PeakEntry {
  const char* gpu;
  std::vector<std::string> words, not_words;
  double tflops;  // dense bf16 tensor-core TFLOP/s with fp32 accumulation, without sparsity
  double memory_gbs;  // device memory bandwidth, GB/s (--profile's bandwidth peak)
};

// Datasheet figures; the first matching row wins, so the more specific rows come first.
inline const std::vector<PeakEntry>& peak_table() {
  static const std::vector<PeakEntry> table = {
      {"H100 NVL", {"H100", "NVL"}, {}, 835.5, 3900},
      {"H100 PCIe", {"H100", "PCIE"}, {}, 756.5, 2000},
      {"H100 SXM", {"H100"}, {}, 989.5, 3350},
      {"H200 NVL", {"H200", "NVL"}, {}, 835.5, 4800},
      {"H200", {"H200"}, {}, 989.5, 4800},
      {"A100", {"A100"}, {}, 312.0, 2039},
      {"A10", {"A10"}, {}, 125.0, 600},
      {"L40S", {"L40S"}, {}, 362.05, 864},
      {"L4", {"L4"}, {}, 121.0, 300},
      {"RTX 4090", {"RTX", "4090"}, {"D"}, 165.2, 1008},
      {"B200", {"B200"}, {}, 2250.0, 8000},
  };
  return table;
}

// "NVIDIA A100-SXM4-80GB" -> {"NVIDIA", "A100", "SXM4", "80GB"}
inline std::vector<std::string> device_name_words(const std::string& name) {
  std::vector<std::string> words;
  std::string word;
  for (char ch : name + " ") {
    if (ch == ' ' || ch == '-') {
      if (!word.empty()) words.push_back(word);
      word.clear();
    } else {
      word += static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    }
  }
  return words;
}

struct Peak {
  std::string gpu;  // the table's name, or "--peak-tflops"
  double tflops = 0;
  double memory_gbs = 0;  // 0: not known (--peak-tflops)
};

// The peak of the GPU named `device_name` (cudaDeviceProp::name); `override_tflops` > 0
// (--peak-tflops) takes precedence. Nothing for a device the table does not know.
inline std::optional<Peak> device_peak(const std::string& device_name, double override_tflops = 0) {
  if (override_tflops > 0) return Peak{"--peak-tflops", override_tflops, 0};
  const std::vector<std::string> words = device_name_words(device_name);
  const auto has = [&](const std::string& w) {
    for (const std::string& x : words)
      if (x == w) return true;
    return false;
  };
  for (const PeakEntry& e : peak_table()) {
    bool match = true;
    for (const std::string& w : e.words) match = match && has(w);
    for (const std::string& w : e.not_words) match = match && !has(w);
    if (match) return Peak{e.gpu, e.tflops, e.memory_gbs};
  }
  return std::nullopt;
}

// Model FLOPs utilization in [0, ...): the FLOP/s that tokens_per_s (over all ranks) implies, per
// GPU, over the peak of one.
inline double mfu(double tokens_per_s, double flops_per_token, int world_size, const Peak& peak) {
  return tokens_per_s * flops_per_token / world_size / (peak.tflops * 1e12);
}

// The run's mean throughput for its end-of-training summary: the steps after a warm-up of
// max(3, ⌈10% of --max-steps⌉) steps of this process, which pay one-time costs (allocation,
// cuBLASLt heuristics, page faults); a run with no step beyond it is measured over all its steps.
class ThroughputMeter {
 public:
  explicit ThroughputMeter(long long max_steps) : warmup_(std::max(3LL, (max_steps + 9) / 10)) {}
  void add(double ms, double tokens) {
    ++steps_;
    all_.add(ms, tokens);
    if (steps_ > warmup_) measured_.add(ms, tokens);
  }
  long long steps() const { return steps_; }
  // The steps the mean is over (those after the warm-up, or all of them).
  long long measured_steps() const { return measured_.steps > 0 ? measured_.steps : all_.steps; }
  long long warmup_steps() const { return measured_.steps > 0 ? warmup_ : 0; }
  double tokens_per_s() const { return span().tokens / (span().ms / 1000.0); }
  double ms_per_step() const { return span().ms / static_cast<double>(span().steps); }

 private:
  struct Span {
    long long steps = 0;
    double ms = 0, tokens = 0;
    void add(double m, double t) { ++steps, ms += m, tokens += t; }
  };
  const Span& span() const { return measured_.steps > 0 ? measured_ : all_; }
  long long warmup_, steps_ = 0;
  Span all_, measured_;
};
