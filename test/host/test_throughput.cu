// Tests for src/run/throughput.h: FLOPs per token against a count of every product by hand, the peak
// table's matching of device names (unknown names, the --peak-tflops override), MFU, and the
// warm-up of the end-of-training mean.
#include "src/run/throughput.h"

#include <catch2/catch.hpp>

#include <string>

namespace {

ModelConfig config(int maxT, int V, int Vp, int L, int NH, int C) {
  ModelConfig c;
  c.max_seq_len = maxT;
  c.vocab_size = V;
  c.padded_vocab_size = Vp;
  c.num_layers = L;
  c.num_heads = NH;
  c.channels = C;
  return c;
}

// Training FLOPs per token of every matrix product, written out: forward 2 FLOPs per
// multiply-add, backward twice the forward (the input's and the weight's gradient); attention's
// two products over the causal triangle (half the T x T square).
double matmul_flops_by_hand(const ModelConfig& c, int T) {
  const double C = c.channels, Vp = c.padded_vocab_size;
  double layer = 0;
  layer += 2 * C * (3 * C);  // qkv projection
  layer += T * C;            // attention scores: each of NH heads, T/2 keys on average, C/NH dims
  layer += T * C;            // scores x values
  layer += 2 * C * C;        // attention output projection
  layer += 2 * C * (4 * C);  // MLP up
  layer += 2 * (4 * C) * C;  // MLP down
  const double forward = c.num_layers * layer + 2 * C * Vp;  // + the tied lm head over all Vp columns
  return 3 * forward;
}

}  // namespace

TEST_CASE("FLOPs per token: every matrix product plus 6 per other parameter (llm.c's 6N + 6LCT)") {
  for (const ModelConfig& c : {config(1024, 50257, 50304, 12, 12, 768), config(64, 300, 384, 3, 2, 48),
                              config(32, 97, 128, 1, 1, 8)}) {
    for (int T : {1, 17, c.max_seq_len}) {
      const double C = c.channels;
      // per layer: qkvb 3C, attprojb C, fcb 4C, fcprojb C, ln1 and ln2 weights and biases 4C; lnf 2C;
      // wpe maxT x C (a lookup, counted as llm.c counts it)
      const double other_params = c.num_layers * (3 * C + C + 4 * C + C + 4 * C) + 2 * C + c.max_seq_len * C;
      CHECK(flops_per_token(c, T) == matmul_flops_by_hand(c, T) + 6 * other_params);
    }
  }
}

// Llama 3's products, written out the same way: q|k|v (NH + 2·NKV heads of HS), attention over
// the NH query heads (the query width NH·HS = C), the output projection, SwiGLU's w1, w3 and w2
// (H wide), the lm head: wte when tied, else lm_head. The RMSNorm weights are the other
// parameters, and untied the embedding table wte too (a lookup, counted as llm.c counts every
// parameter, the rule GPT-2's wpe follows).
double llama_flops_by_hand(int L, int NH, int NKV, int C, int H, int Vp, bool tied, int T) {
  const double HS = static_cast<double>(C) / NH, qkv = (NH + 2.0 * NKV) * HS;
  double layer = 0;
  layer += 2.0 * C * qkv;    // q, k, v
  layer += 2.0 * T * C;      // scores and scores x values over the causal half, NH query heads
  layer += 2.0 * C * C;      // wo
  layer += 2 * 2.0 * C * H;  // w1, w3
  layer += 2.0 * H * C;      // w2
  const double forward = L * layer + 2.0 * C * Vp;
  const double other = L * 2.0 * C + C + (tied ? 0.0 : static_cast<double>(Vp) * C);
  return 3 * forward + 6 * other;
}

TEST_CASE("FLOPs per token of Llama 3: every product by hand plus 6 per other parameter, tied and untied") {
  for (int T : {1, 17, 128}) {
    CHECK(flops_per_token(model_preset("llama-nano"), T) ==
          llama_flops_by_hand(2, 4, 2, 64, 192, 128256, true, T));
    CHECK(flops_per_token(model_preset("llama-micro"), T) ==
          llama_flops_by_hand(4, 4, 1, 128, 384, 128256, false, T));
  }
  // Llama 3.1 8B at T = 8192: N = 8,030,261,248 (Meta's count, lm_head included).
  CHECK(flops_per_token(model_preset("llama3.1-8b"), 8192) == 6.0 * 8030261248.0 + 6.0 * 32 * 4096 * 8192);
  CHECK(flops_per_token(model_preset("llama3.1-8b"), 8192) == llama_flops_by_hand(32, 32, 8, 4096, 14336, 128256, false, 8192));
}

TEST_CASE("FLOPs per token of GPT-2 124M at T = 1024: llm.c's figure") {
  // 124,475,904 parameters: 6 x 124,475,904 + 6 x 12 x 768 x 1024
  CHECK(flops_per_token(config(1024, 50257, 50304, 12, 12, 768), 1024) == 803478528.0);
}

TEST_CASE("the start-up line's formula names N and the query width C") {
  CHECK(flops_formula_text(config(1024, 50257, 50304, 12, 12, 768)) ==
        "6N + 6LCT, llm.c's: N = 124,475,904 parameters, C = 768 (NH·HS)");
  CHECK(flops_formula_text(model_preset("llama3.1-8b")) ==
        "6N + 6LCT, llm.c's: N = 8,030,261,248 parameters, C = 4096 (NH·HS)");
}

TEST_CASE("peak bf16 TFLOP/s from the device name") {
  const struct {
    const char* name;
    double tflops;  // 0: unknown
  } cases[] = {
      {"NVIDIA A100-SXM4-40GB", 312},   {"NVIDIA A100-SXM4-80GB", 312},   {"NVIDIA A100-PCIE-40GB", 312},
      {"NVIDIA A100 80GB PCIe", 312},   {"NVIDIA H100 80GB HBM3", 989.5}, {"NVIDIA H100 PCIe", 756.5},
      {"NVIDIA H100 NVL", 835.5},       {"NVIDIA H200", 989.5},           {"NVIDIA H200 NVL", 835.5},
      {"NVIDIA L40S", 362.05},          {"NVIDIA L4", 121},               {"NVIDIA A10", 125},
      {"NVIDIA GeForce RTX 4090", 165.2}, {"NVIDIA B200", 2250},
      // not in the table: neighbours of known names must not borrow their figures
      {"NVIDIA L40", 0},                {"NVIDIA A10G", 0},               {"NVIDIA GeForce RTX 4090 D", 0},
      {"NVIDIA GH200 480GB", 0},        {"Tesla V100-SXM2-16GB", 0},      {"", 0},
      {"simt (CUDA emulated on 2 CPU threads)", 0},
  };
  for (const auto& c : cases) {
    INFO(c.name);
    const std::optional<Peak> peak = device_peak(c.name);
    if (c.tflops == 0) {
      CHECK_FALSE(peak.has_value());
    } else {
      REQUIRE(peak.has_value());
      CHECK(peak->tflops == c.tflops);
    }
  }
  CHECK(device_peak("nvidia h100 pcie")->gpu == "H100 PCIe");  // case does not matter
}

TEST_CASE("--peak-tflops overrides the table, known device or not") {
  CHECK(device_peak("simt (CUDA emulated on 2 CPU threads)", 123)->tflops == 123);
  CHECK(device_peak("NVIDIA H100 80GB HBM3", 500)->tflops == 500);
  CHECK(device_peak("NVIDIA H100 80GB HBM3", 500)->gpu == "--peak-tflops");
  CHECK(device_peak("NVIDIA H100 80GB HBM3", 0)->tflops == 989.5);
}

TEST_CASE("MFU: the FLOP/s of all ranks shared out per GPU, over one GPU's peak") {
  const Peak peak{"test", 1.0};  // 1e12 FLOP/s
  CHECK(mfu(1000.0, 1e9, 1, peak) == Approx(1.0));
  CHECK(mfu(1000.0, 1e9, 2, peak) == Approx(0.5));
  CHECK(mfu(0.0, 1e9, 1, peak) == 0.0);
}

TEST_CASE("mean throughput after max(3, 10% of --max-steps) warm-up steps") {
  ThroughputMeter meter(20);  // warm-up 3
  for (double ms : {1000.0, 500.0, 10.0, 20.0, 20.0}) meter.add(ms, 100.0);
  CHECK(meter.warmup_steps() == 3);
  CHECK(meter.measured_steps() == 2);
  CHECK(meter.tokens_per_s() == Approx(200.0 / 0.040));
  CHECK(meter.ms_per_step() == Approx(20.0));

  ThroughputMeter long_run(100);  // warm-up 10
  for (int s = 0; s < 12; ++s) long_run.add(s < 10 ? 100.0 : 50.0, 10.0);
  CHECK(long_run.warmup_steps() == 10);
  CHECK(long_run.ms_per_step() == Approx(50.0));

  ThroughputMeter short_run(2);  // no step beyond the warm-up: all of them
  short_run.add(30.0, 10.0);
  short_run.add(10.0, 10.0);
  CHECK(short_run.warmup_steps() == 0);
  CHECK(short_run.measured_steps() == 2);
  CHECK(short_run.tokens_per_s() == Approx(20.0 / 0.040));
}
