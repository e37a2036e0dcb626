// The memory planner (src/run/memory_plan.h) against figures computed here by hand from the shapes:
// GPT-2 124M's terms at ZeRO stages 0 to 3, a Llama 3's (llama-micro; 70B's TP part), the table's
// text, and the largest batch that fits. (That the plan equals what the model allocates is checked on the CPU build
// by simt_counters.cpp, where simt counts cudaMalloc.) And --plan's traffic words (format_traffic), which
// the trainer's measured communication also uses, over one step and as a mean over several.
#include "test/test_util.h"
#include "src/run/memory_plan.h"
#include "src/run/plan_report.h"

namespace {

size_t term(const MemoryPlan& plan, const std::string& name) {  // fails the test if absent
  for (const MemoryTerm& t : plan.terms)
    if (t.name == name) return t.bytes;
  FAIL("no term " << name);
  return 0;
}

}  // namespace

TEST_CASE("memory plan of GPT-2 124M by hand", "[memory_plan]") {
  const ModelConfig d12{1024, 50257, 50304, 12, 12, 768};
  const size_t C = 768, L = 12, Vp = 50304, maxT = 1024;
  const size_t per_layer = 2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C + 4 * C * C + 4 * C + 4 * C * C + C;
  const size_t model_tensors = Vp * C + maxT * C + 2 * C;
  const size_t P = L * per_layer + model_tensors;
  REQUIRE(P == 124475904);  // FORMATS.md's figure for GPT-2 124M with Vp = 50304

  const MemoryPlan one = plan_memory(d12, 64, 1024, 1, DType::bf16, 0, 1);
  CHECK(term(one, "parameters") == 2 * P);
  CHECK(term(one, "gradients") == 2 * P);
  CHECK(term(one, "lm head weight gradient (fp32)") == 4 * Vp * C);
  CHECK(term(one, "RoPE table (fp32)") == 0);  // learned positions
  CHECK(term(one, "master weights (fp32)") == 4 * P);
  CHECK(term(one, "AdamW moments (fp32)") == 8 * P);
  CHECK(term(one, "cuBLASLt workspace") == (32u << 20) + (16u << 20));
  CHECK(term(one, "activations: logits chunk") == 2 * 8192 * Vp);  // 8,192 rows of the padded vocab, bf16
  // Every block activation at --recompute 1 (kept per layer: residual3, ln1, ln2, atty, residual2,
  // qkv, fch; one slice of fch_gelu) plus the embeddings, bf16; LayerNorm statistics and the
  // attention log-sum-exp in fp32.
  const size_t N = 64 * 1024;
  const size_t block_elems = N * C * (1 + L * (1 + 1 + 1 + 1 + 1 + 3 + 4) + 4);
  const size_t NH = 12;
  CHECK(term(one, "activations: blocks") == 2 * block_elems + 4 * (4 * L * N + L * N * NH));

  // ZeRO-1 over 8 ranks: each bucket's chunk is an eighth of it (rounded up to 8), S their sum.
  const size_t per_rank = (P + 7) / 8, S = (per_rank + 7) / 8 * 8;
  const MemoryPlan zero1 = plan_memory(d12, 64, 1024, 1, DType::bf16, 1, 8);
  CHECK(term(zero1, "parameters") == 2 * 8 * S);
  CHECK(term(zero1, "gradients") == 2 * 8 * S);
  CHECK(term(zero1, "master weights (fp32)") == 4 * S);
  CHECK(term(zero1, "AdamW moments (fp32)") == 8 * S);
  // ZeRO-2: two working windows of one 32 MiB bucket each (two bf16 layers: 27 MiB; three would be
  // 40.6 MiB), the wte/wpe/lnf window and the shard (every count here divides by 8·8: no padding).
  const MemoryPlan zero2 = plan_memory(d12, 64, 1024, 1, DType::bf16, 2, 8);
  CHECK(term(zero2, "gradients") == 2 * (2 * 2 * per_layer + model_tensors + S));
  // Buckets of one layer: the windows shrink to a layer each.
  CHECK(term(plan_memory(d12, 64, 1024, 1, DType::bf16, 2, 8, 14.0), "gradients") ==
        2 * (2 * per_layer + model_tensors + S));
  // ZeRO-3: the parameters' shard (as the gradients'), two gather windows of one bucket each and
  // the wte/wpe/lnf window; gradients and optimizer state as ZeRO-2. With --sample-every, rank 0
  // gathers every parameter for the decoder. --zero3-prefetch 3: four layer windows.
  const MemoryPlan zero3 = plan_memory(d12, 64, 1024, 1, DType::bf16, 3, 8);
  CHECK(term(zero3, "parameters") == 2 * S);
  CHECK(term(zero3, "parameter gather windows") == 2 * (2 * 2 * per_layer + model_tensors));
  CHECK(term(zero3, "gradients") == term(zero2, "gradients"));
  CHECK(term(zero3, "AdamW moments (fp32)") == term(zero2, "AdamW moments (fp32)"));
  CHECK(term(zero3, "parameters gathered for sampling") == 0);
  const MemoryPlan sampling = plan_memory(d12, 64, 1024, 1, DType::bf16, 3, 8, kDefaultBucketMiB, 64);
  CHECK(term(sampling, "parameters gathered for sampling") == 2 * P);
  CHECK(term(plan_memory(d12, 64, 1024, 1, DType::bf16, 3, 8, kDefaultBucketMiB, 0, kLogitsChunkRows, 3),
             "parameter gather windows") == 2 * (4 * 2 * per_layer + model_tensors));
  CHECK(term(zero2, "parameter gather windows") == 0);
  // One rank runs stage 0 whatever was asked; fp32 has no master weights.
  CHECK(plan_memory(d12, 64, 1024, 1, DType::bf16, 2, 1).total() == one.total());
  CHECK(plan_memory(d12, 64, 1024, 1, DType::bf16, 3, 1).total() == one.total());
  CHECK(term(plan_memory(d12, 64, 1024, 1, DType::fp32, 0, 1), "master weights (fp32)") == 0);

  const std::string table = format_memory_plan(one, size_t{80} << 30);
  CHECK_THAT(table, Catch::Contains("AdamW moments (fp32)") && Catch::Contains("949.7 MiB") &&
                        Catch::Contains("of 80.00 GiB: fits"));
  CHECK_THAT(format_memory_plan(one, size_t{8} << 30), Catch::Contains("does NOT fit"));
}

TEST_CASE("memory plan of a Llama 3 by hand: GQA, SwiGLU, RMSNorm, untied head, RoPE table", "[memory_plan]") {
  // llama-micro: L=4 NH=4 NKV=1 C=128 (HS 32), H = 384 (int(2·4·128/3) = 341 rounded up to 64),
  // V = Vp = 128,256, untied. No wpe, no biases, RMSNorm weights only.
  const ModelConfig micro = model_preset("llama-micro");
  const size_t L = 4, NH = 4, C = 128, HS = 32, QKV = (4 + 2 * 1) * HS, H = 384, Vp = 128256;
  const size_t per_layer = C + QKV * C + C * C + C + 3 * H * C;
  const size_t P = Vp * C + L * per_layer + C + Vp * C;  // wte, the layers, lnf, lm_head
  const int B = 4, T = 256;
  const MemoryPlan plan = plan_memory(micro, B, T, 1, DType::bf16, 0, 1);
  CHECK(term(plan, "parameters") == 2 * P);
  CHECK(term(plan, "gradients") == 2 * P);
  CHECK(term(plan, "lm head weight gradient (fp32)") == 4 * Vp * C);  // lm_head's, not wte's
  CHECK(term(plan, "master weights (fp32)") == 4 * P);
  CHECK(term(plan, "AdamW moments (fp32)") == 8 * P);
  CHECK(term(plan, "RoPE table (fp32)") == 4 * T * HS);
  CHECK(term(plan, "activations: logits chunk") == 2 * 1024 * Vp);  // N = 1,024 rows < 8,192
  // --recompute 1 keeps per layer: residual3, ln1, ln2, atty, residual2 (C each), qkv (QKV), the
  // two SwiGLU products (2H); one slice of silu(a)·b (H); plus the embeddings. fp32: the two
  // RMSNorms' rstd (no means) and the attention log-sum-exp over the NH query heads.
  const size_t N = static_cast<size_t>(B) * T;
  const size_t block_elems = N * C * (1 + 5 * L) + L * N * QKV + L * N * 2 * H + N * H;
  CHECK(term(plan, "activations: blocks") == 2 * block_elems + 4 * (2 * L * N + L * N * NH));
  CHECK(term(plan_memory(micro, B, 17, 1, DType::bf16, 0, 1), "RoPE table (fp32)") == 4 * 17 * HS);

  // Llama 3.1 70B under TP 8 (ZeRO 0, one data-parallel rank): each rank holds 64/8 query and
  // 8/8 K/V heads of q|k|v, an eighth of wo's, w1's, w3's and w2's and of the vocabulary rows of
  // wte and lm_head; the RMSNorm weights whole.
  const ModelConfig b70 = model_preset("llama3.1-70b");
  const size_t C70 = 8192, HS70 = 128, H70 = 28672, L70 = 80;
  const size_t local_layer = C70 + (64 / 8 + 2 * 8 / 8) * HS70 * C70 + C70 * C70 / 8 + C70 + 3 * H70 / 8 * C70;
  const size_t local = 2 * (Vp / 8) * C70 + L70 * local_layer + C70;
  const MemoryPlan tp8 = plan_memory(b70, 1, 8192, 1, DType::bf16, 0, 8, kDefaultBucketMiB, 0, kLogitsChunkRows, 1,
                                     TensorParallelism{8, 0, true, 1});
  CHECK(term(tp8, "parameters") == 2 * local);
  CHECK(term(tp8, "AdamW moments (fp32)") == 8 * local);
  CHECK(term(tp8, "lm head weight gradient (fp32)") == 4 * (Vp / 8) * C70);
}

TEST_CASE("memory plan under context parallelism: T/N tokens' activations, the ring's buffers, the losses", "[memory_plan][cp]") {
  // Llama 3.1 8B at T = 128K over CP 8 (ZeRO 1 over the 8 ranks, which are data-parallel to it):
  // each rank's activations are those of 16K tokens, the RoPE table covers all 128K positions.
  const ModelConfig b8 = model_preset("llama3.1-8b");
  const int T = 131072, N = 8, B = 1;
  const MemoryPlan cp8 = plan_memory(b8, B, T, 3, DType::bf16, 1, N, kDefaultBucketMiB, 0, kLogitsChunkRows, 1, {}, {}, N);
  const MemoryPlan local = plan_memory(b8, B, T / N, 3, DType::bf16, 1, N, kDefaultBucketMiB, 0, kLogitsChunkRows);
  CHECK(term(cp8, "activations: blocks") == term(local, "activations: blocks"));
  CHECK(term(cp8, "activations: other buffers") == term(local, "activations: other buffers"));
  CHECK(term(cp8, "RoPE table (fp32)") == 4 * static_cast<size_t>(T) * 128);
  CHECK(term(cp8, "context parallelism: ring, losses") ==
        ContextAttention<float>::workspace_bytes(B, T / (2 * N), 4096, 32, 8, 2) + 4 * static_cast<size_t>(B) * T);
  CHECK(term(local, "context parallelism: ring, losses") == 0);
}

TEST_CASE("largest_fitting_batch: the largest B whose plan fits", "[memory_plan]") {
  const ModelConfig tiny{64, 500, 512, 3, 4, 64};
  const size_t budget = plan_memory(tiny, 37, 64, 2, DType::bf16, 0, 1).total() + 100;
  const int B = largest_fitting_batch(tiny, 64, 2, DType::bf16, 0, 1, budget);
  CHECK(B == 37);
  CHECK(largest_fitting_batch(tiny, 64, 2, DType::bf16, 0, 1, 1000) == 0);  // not even B = 1
  // More recomputation, less memory per sequence: at least as many fit.
  CHECK(largest_fitting_batch(tiny, 64, 3, DType::bf16, 0, 1, budget) >= B);
}

TEST_CASE("the lm head's chunk is the largest of the plan's ladder that fits the device", "[memory_plan]") {
  // d12 at B = 64, T = 1024 (N = 65,536 rows): 8,192 rows where memory allows, fewer (halving, at
  // least 1,024) where the plan with 8,192 would not fit; never more rows than the micro-batch.
  const ModelConfig d12{1024, 50257, 50304, 12, 12, 768};
  auto rows = [&](int B, size_t budget) {
    return lm_head_chunk_rows(d12, B, 1024, 1, DType::bf16, 0, 1, kDefaultBucketMiB, 0, budget);
  };
  CHECK(rows(64, 0) == 8192);
  const size_t at_8192 = plan_memory(d12, 64, 1024, 1, DType::bf16, 0, 1).total();
  CHECK(rows(64, at_8192) == 8192);
  const size_t at_2048 = plan_memory(d12, 64, 1024, 1, DType::bf16, 0, 1, kDefaultBucketMiB, 0, 2048).total();
  CHECK(rows(64, at_2048) == 2048);
  CHECK(rows(64, at_2048 - 1) == 1024);
  CHECK(rows(64, 1) == 1024);  // the floor: the fit check then reports what does not fit
  CHECK(rows(2, 0) == 2048);   // B·T = 2,048 rows: one chunk
}

TEST_CASE("format_traffic: --plan's words, per step of several steps' traffic", "[memory_plan]") {
  StepTraffic t;
  t.all_reduce = {12, 3.0 * 1024};
  t.reduce_scatter = {0, 0};
  t.all_gather = {9, 6.0 * 1048576};
  CHECK(format_traffic(t) == " all-reduce 3072 B in 12 call(s), reduce-scatter 0 B in 0 call(s), all-gather 6.0 MiB in "
                             "9 call(s)");
  // Over 2 steps: a whole mean as an integer, the others with two decimals.
  CHECK(format_traffic(t, 2) == " all-reduce 1536 B in 6 call(s), reduce-scatter 0 B in 0 call(s), all-gather 3.0 MiB in "
                                "4.50 call(s)");
}
