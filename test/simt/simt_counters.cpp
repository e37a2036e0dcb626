// What host code would make a GPU wait for, counted on the CPU build (simt/counters.h): blocking
// host synchronisations and cuBLASLt heuristic queries. The counters exist only in the CPU build,
// so this test does too.
#include "test/test_util.h"
#include "src/model/transformer.h"
#include "src/dist/pipeline_schedule.h"
#include "src/run/memory_plan.h"

#include <vector>

namespace {

const ModelConfig kTiny{32, 500, 512, 2, 4, 64};
constexpr int kBatch = 2, kSeqLen = 16, kMicroSteps = 4;

// One optimizer step of kMicroSteps micro-steps on fresh random tokens, as the trainer runs it
// (train_gpt.cu, Trainer::train_step): micro-steps, the step's figures, the update.
template <typename Elem>
StepFigures train_step(Transformer<Elem>& model, int step) {
  const size_t rows = static_cast<size_t>(kBatch) * kSeqLen;
  model.zero_grad();
  for (int micro = 0; micro < kMicroSteps; ++micro) {
    const std::vector<int> tokens = test::random_tokens(rows + 1, kTiny.vocab_size, 100 * step + micro);
    const std::vector<int> inputs(tokens.begin(), tokens.end() - 1), targets(tokens.begin() + 1, tokens.end());
    model.forward_backward(inputs.data(), targets.data(), kMicroSteps, micro + 1 == kMicroSteps);
  }
  const auto figures = model.step_figures();
  model.apply_update(OptimizerSettings{}, 1e-3f, step, figures.grad_norm);
  return figures;
}

}  // namespace

TEST_CASE("simt counts blocking copies and synchronisations, not copies into pinned memory", "[simt]") {
  test::DeviceBuffer<float> device(16);
  std::vector<float> pageable(16);
  float* pinned = nullptr;
  REQUIRE(cudaMallocHost(reinterpret_cast<void**>(&pinned), 16 * sizeof(float)) == cudaSuccess);
  cudaStream_t stream;
  REQUIRE(cudaStreamCreate(&stream) == cudaSuccess);
  simt::counters() = simt::Counters{};
  CHECK(cudaMemcpyAsync(pinned + 4, device.ptr, 4 * sizeof(float), cudaMemcpyDeviceToHost, stream) == cudaSuccess);
  CHECK(cudaMemcpyAsync(device.ptr, pinned, 4 * sizeof(float), cudaMemcpyHostToDevice, stream) == cudaSuccess);
  CHECK(simt::counters().host_syncs == 0);
  CHECK(cudaMemcpyAsync(device.ptr, pageable.data(), 4 * sizeof(float), cudaMemcpyHostToDevice, stream) ==
        cudaSuccess);
  CHECK(simt::counters().host_syncs == 1);
  CHECK(cudaMemcpyAsync(pageable.data(), device.ptr, 4 * sizeof(float), cudaMemcpyDeviceToHost, stream) ==
        cudaSuccess);
  CHECK(simt::counters().host_syncs == 2);
  CHECK(cudaStreamSynchronize(stream) == cudaSuccess);
  CHECK(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(cudaMemcpy(pageable.data(), device.ptr, sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(simt::counters().host_syncs == 5);
  CHECK(cudaFreeHost(pinned) == cudaSuccess);
  CHECK(cudaStreamDestroy(stream) == cudaSuccess);
}

TEST_CASE("matmul makes one cuBLASLt plan per shape", "[simt][matmul]") {
  matmul_init();
  test::DeviceBuffer<bf16> inp(24 * 40), weight(72 * 40), bias(72), out(24 * 72);
  simt::counters() = simt::Counters{};
  matmul_forward<bf16>(out, inp, weight, bias, 24, 40, 72, nullptr);
  matmul_forward<bf16>(out, inp, weight, bias, 24, 40, 72, nullptr);
  CHECK(simt::counters().heuristic_queries == 1);
  matmul_forward<bf16>(out, inp, weight, nullptr, 24, 40, 72, nullptr);  // no bias: another plan
  matmul_forward<bf16>(out, inp, weight, bias, 16, 40, 72, nullptr);     // other rows: another plan
  CHECK(simt::counters().heuristic_queries == 3);
}

TEMPLATE_TEST_CASE("a training step of 4 micro-steps waits for the device once and queries no cuBLASLt heuristic "
                   "after the first step", "[simt][gpt2]", float, bf16) {
  Transformer<TestType> model(kTiny, kBatch, kSeqLen);
  model.init_random(7);
  train_step(model, 1);
  simt::counters() = simt::Counters{};
  train_step(model, 2);
  train_step(model, 3);
  CHECK(simt::counters().heuristic_queries == 0);
  CHECK(simt::counters().host_syncs == 2);
}

TEMPLATE_TEST_CASE("the step's figures: the mean of the micro-steps' losses and the gradient norm", "[gpt2]", float,
                   bf16) {
  // The same step twice from the same weights: once through step_figures(), once with every
  // micro-step's loss read back as it comes (mean_loss()), and the norm of the gradients copied to
  // the host (summed there in double).
  Transformer<TestType> model(kTiny, kBatch, kSeqLen);
  model.init_random(11);
  const auto figures = train_step(model, 1);
  model.init_random(11);
  const size_t rows = static_cast<size_t>(kBatch) * kSeqLen;
  model.zero_grad();
  double loss_sum = 0.0;
  for (int micro = 0; micro < kMicroSteps; ++micro) {
    const std::vector<int> tokens = test::random_tokens(rows + 1, kTiny.vocab_size, 100 + micro);
    const std::vector<int> inputs(tokens.begin(), tokens.end() - 1), targets(tokens.begin() + 1, tokens.end());
    model.forward_backward(inputs.data(), targets.data(), kMicroSteps, micro + 1 == kMicroSteps);
    loss_sum += model.mean_loss();
  }
  CHECK(std::fabs(figures.loss - loss_sum / kMicroSteps) <= 1e-6 * std::fabs(figures.loss));
  double norm_squared = 0.0;
  for (const float g : model.gradients()) norm_squared += static_cast<double>(g) * g;
  CHECK(std::fabs(figures.grad_norm - std::sqrt(norm_squared)) <= 1e-5 * std::sqrt(norm_squared));
  CHECK(figures.loss > 0.0);
}

TEST_CASE("simt counts device bytes held, not pinned host memory", "[simt]") {
  const long long before = simt::counters().device_bytes;
  void* device = nullptr;
  void* pinned = nullptr;
  REQUIRE(cudaMalloc(&device, 1000) == cudaSuccess);
  REQUIRE(cudaMallocHost(&pinned, 4000) == cudaSuccess);
  CHECK(simt::counters().device_bytes - before == 1000);
  CHECK(simt::counters().peak_device_bytes >= simt::counters().device_bytes);
  CHECK(cudaFree(device) == cudaSuccess);
  CHECK(cudaFreeHost(pinned) == cudaSuccess);
  CHECK(simt::counters().device_bytes == before);
}

TEMPLATE_TEST_CASE("the memory plan is what the model allocates", "[simt][memory_plan]", float, bf16) {
  // Single process (ZeRO stage 0); odd B and T. The plan counts the communicator's scalar, which
  // a model without a communicator does not allocate: 8 bytes apart at most.
  // GPT-2 and a Llama 3 (GQA, SwiGLU, the RoPE table), its lm head untied and tied.
  const DType dtype = Transformer<TestType>::dtype;
  ModelConfig llama = llama3_config(32, 500, 2, 4, 2, 64, 96, llama31_rope(), false);
  llama.padded_vocab_size = 512;
  ModelConfig tied_llama = llama;
  tied_llama.tied_embeddings = true;
  for (const ModelConfig& cfg : {kTiny, llama, tied_llama})
    for (int recompute = 0; recompute <= kRecomputeMax; ++recompute)
      for (const auto& [B, T] : {std::pair{2, 16}, std::pair{3, 7}}) {
        matmul_destroy();  // the model's constructor allocates the cuBLASLt workspace again
        const long long before = simt::counters().device_bytes;
        Transformer<TestType> model(cfg, B, T, recompute);
        const long long allocated = simt::counters().device_bytes - before;
        const long long planned = static_cast<long long>(plan_memory(cfg, B, T, recompute, dtype, 0, 1).total());
        INFO(describe(cfg) << " recompute " << recompute << " B=" << B << " T=" << T << ": allocated " << allocated
                           << ", planned " << planned);
        CHECK(planned - allocated >= 0);
        CHECK(planned - allocated <= 8);
      }
}

TEMPLATE_TEST_CASE("the memory plan is what a pipeline stage allocates", "[simt][memory_plan]", float, bf16) {
  // Every stage of 3 (its layers, the embedding on the first, the head on the last) under each
  // schedule: its activation sets in flight (zb-h1's kept output gradients too), on a one-rank
  // communicator standing in for the pipeline's (nothing travels while the model is built).
  const DType dtype = Transformer<TestType>::dtype;
  Communicator pipeline_comm{CommOptions{}};
  ModelConfig gpt2 = kTiny;
  gpt2.num_layers = 7;
  ModelConfig llama = llama3_config(32, 512, 7, 4, 2, 64, 96, llama31_rope(), false);
  const int p = 3, B = 3, T = 7;
  for (const ModelConfig& cfg : {gpt2, llama})
    for (PipelineKind kind : {PipelineKind::one_f_one_b, PipelineKind::interleaved, PipelineKind::zb_h1}) {
      PipelineShape shape;
      shape.stages = p;
      shape.microbatches = 5;
      shape.virtual_stages = kind == PipelineKind::interleaved ? 2 : 1;
      shape.kind = kind;
      const std::vector<PipelineTable> tables = build_pipeline_schedule(shape);
      std::vector<int> chunk_layers(shape.chunks(), 1);
      for (int extra = 0; extra < cfg.num_layers - shape.chunks(); ++extra) ++chunk_layers[extra % shape.chunks()];
      for (int r = 0; r < p; ++r) {
        PipelineMemory planned_stage;
        planned_stage.stage = StagePart::of_rank(chunk_layers, p, r);
        planned_stage.stages = p;
        planned_stage.in_flight = pipeline_activation_sets(tables[r]);
        planned_stage.split_backward = kind == PipelineKind::zb_h1;
        PipelineParts parts;
        for (int q = 0; q < p; ++q) parts.stages.push_back(StagePart::of_rank(chunk_layers, p, q));
        parts.rank = r;
        parts.comm = &pipeline_comm;
        parts.in_flight = planned_stage.in_flight;
        parts.split_backward = planned_stage.split_backward;
        const int recompute = planned_stage.split_backward ? 0 : 1;
        matmul_destroy();  // the model's constructor allocates the cuBLASLt workspace again
        const long long before = simt::counters().device_bytes;
        Transformer<TestType> model(cfg, B, T, recompute, nullptr, 0, "auto", kDefaultBucketMiB, kLogitsChunkRows,
                                    kDefaultZero3Prefetch, nullptr, false, parts);
        const long long allocated = simt::counters().device_bytes - before;
        const long long planned = static_cast<long long>(
            plan_memory(cfg, B, T, recompute, dtype, 0, p, kDefaultBucketMiB, 0, kLogitsChunkRows,
                        kDefaultZero3Prefetch, {}, planned_stage)
                .total());
        INFO(describe(cfg) << ", " << pipeline_kind_name(kind) << ", stage " << r << " of " << p << " ("
                           << planned_stage.in_flight << " sets): allocated " << allocated << ", planned " << planned);
        CHECK(planned - allocated >= 0);
        CHECK(planned - allocated <= 8);
      }
    }
}

TEMPLATE_TEST_CASE("the plan's sampling term is what the --sample-every decoder allocates", "[simt][memory_plan]",
                   float, bf16) {
  const DType dtype = Transformer<TestType>::dtype;
  // GPT-2 and a Llama 3 (its cache NKV heads wide, SwiGLU's two products, the RoPE table).
  const ModelConfig llama = llama3_config(32, 512, 2, 4, 2, 64, 96, llama31_rope(), false);
  for (const ModelConfig& cfg : {kTiny, llama}) {
    Transformer<TestType> model(cfg, 1, 8);  // the decoder reads its parameters
    for (int positions : {1, 13, cfg.max_seq_len}) {
      matmul_destroy();  // the decoder's constructor allocates the cuBLASLt workspace again
      const long long before = simt::counters().device_bytes;
      const MemoryPlan with = plan_memory(cfg, 1, 8, 1, dtype, 0, 1, kDefaultBucketMiB, positions);
      const long long workspace = static_cast<long long>(term_bytes(with, "cuBLASLt workspace"));
      {
        KvCacheDecoder<TestType> decoder(cfg, model.params_device(), positions, model.attention(), model.stream());
        const long long allocated = simt::counters().device_bytes - before;
        const long long planned = static_cast<long long>(term_bytes(with, "text sampling (--sample-every)")) + workspace;
        INFO(describe(cfg) << ", " << positions << " positions: allocated " << allocated << ", planned " << planned);
        CHECK(allocated == planned);
      }
      CHECK(simt::counters().device_bytes - before == workspace);  // the decoder frees all of its own
    }
  }
}
