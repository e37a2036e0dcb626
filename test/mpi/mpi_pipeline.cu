// Pipeline parallelism under mpirun (test/checks/distributed_nccl.sh, 2 and 4 ranks: every rank a
// pipeline stage): for each schedule (gpipe, 1f1b, interleaved with 2 chunks per rank, zb-h1), GPT-2
// (tied embeddings: wte on the first and the last stage, whose copies stay the same bits) and
// Llama 3 (untied, GQA; tied once, with 1f1b, as Llama 3.2 is), m = p + 1 micro-batches (and
// m = p at 2 ranks), every --recompute setting: two
// optimizer steps' loss and gradient norm within 1e-6 relative of one process's on the same
// micro-batches, the parameters after them within 1e-5 (gathered from the stages), and the forward
// pass alone (validation) giving one process's losses, bit for bit, on every stage.
#include "test/test_util.h"
#include "src/dist/comm.h"
#include "src/dist/pipeline_schedule.h"
#include "src/model/pipeline_step.h"
#include "src/model/transformer.h"

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace {

Communicator& world() {
  static Communicator instance{CommOptions{}};
  return instance;
}

const int kB = 2, kT = 7, kSteps = 2;

std::vector<int> tokens(int step, int micro, int salt, int vocab) {
  return test::random_tokens(kB * kT, vocab, 1000 * salt + 100 * step + micro);
}

double relative(double got, double want) { return std::fabs(got - want) / std::max(1e-12, std::fabs(want)); }

// Layers per chunk for S chunks of L layers: uneven on purpose (the first chunks one layer more).
std::vector<int> chunk_layers(int L, int S) {
  std::vector<int> layers(S, L / S);
  for (int s = 0; s < L % S; ++s) ++layers[s];
  return layers;
}

struct Figures {
  std::vector<double> loss, norm;
  std::vector<float> parameters, val_losses;
};

// The first and the last stage's copies of a tied wte are the same bits after training.
void check_tied_copies(const Transformer<float>& stage, Communicator& tied) {
  std::vector<float> wte;
  for (const OptimizerSegment& s : stage.gradient_sync().segments()) {
    if (s.tensor != kWte) continue;
    const std::vector<float> part = copy_floats_to_host(stage.owned_parameters(s), s.count, stage.stream());
    wte.insert(wte.end(), part.begin(), part.end());
  }
  REQUIRE(!wte.empty());
  DeviceArray<float> both(2 * wte.size(), "both copies of wte");
  float* mine = both.get() + tied.rank() * wte.size();
  cuda_check(cudaMemcpyAsync(mine, wte.data(), wte.size() * sizeof(float), cudaMemcpyHostToDevice, tied.stream()),
             "wte");
  tied.all_gather(mine, both.get(), wte.size());
  cuda_check(cudaStreamSynchronize(tied.stream()), "wte");
  const std::vector<float> copies = copy_floats_to_host(both.get(), both.count(), tied.stream());
  CHECK(std::memcmp(copies.data(), copies.data() + wte.size(), wte.size() * sizeof(float)) == 0);
}

template <typename Run>
Figures train(Transformer<float>& model, Run&& run_step, int micro_steps, const std::vector<int>& val_inputs,
              const std::function<std::vector<float>(const int*, const int*)>& forward) {
  OptimizerSettings opt;
  opt.grad_clip = 1.0f;
  opt.eps = 1e-2f;  // keeps Adam's first step a smooth function of the gradients (mpi_grad_sync.cu)
  Figures f;
  const int V = model.config().vocab_size;
  f.val_losses = forward(val_inputs.data(), tokens(0, 0, 9, V).data());  // the same parameters: the same bits
  for (int step = 1; step <= kSteps; ++step) {
    model.zero_grad();
    run_step(step, micro_steps, V);
    const StepFigures figures = model.step_figures();
    f.loss.push_back(figures.loss);
    f.norm.push_back(figures.grad_norm);
    model.apply_update(opt, 1e-2f, step, figures.grad_norm);
  }
  f.parameters = model.parameters();
  return f;
}

void check_pipeline(const ModelConfig& config, PipelineKind kind, int virtual_stages, int micro_steps, int recompute,
                    Communicator* tied) {
  const int p = world().world_size(), rank = world().rank();
  INFO(pipeline_kind_name(kind) << ", v " << virtual_stages << ", m " << micro_steps << ", --recompute " << recompute
                                << ", " << (config.tied_embeddings ? "tied" : "untied") << ", L " << config.num_layers);
  const std::vector<int> val_inputs = tokens(0, 0, 8, config.vocab_size);
  auto whole_step = [&](Transformer<float>& m) {
    return [&](int step, int micro, int V) {
      for (int k = 0; k < micro; ++k)
        m.forward_backward(tokens(step, k, 1, V).data(), tokens(step, k, 2, V).data(), micro, k + 1 == micro);
    };
  };
  Transformer<float> single(config, kB, kT, recompute);
  single.init_random(5);
  const Figures want = train(single, whole_step(single), micro_steps, val_inputs, [&](const int* in, const int* tg) {
    single.forward(in, tg);
    return single.position_losses();
  });

  PipelineShape shape;
  shape.stages = p;
  shape.microbatches = micro_steps;
  shape.virtual_stages = virtual_stages;
  shape.kind = kind;
  const std::vector<int> layers = chunk_layers(config.num_layers, shape.chunks());
  PipelineParts parts;
  for (int r = 0; r < p; ++r) parts.stages.push_back(StagePart::of_rank(layers, p, r));
  parts.rank = rank;
  parts.comm = &world();
  parts.tied = config.tied_embeddings ? tied : nullptr;
  parts.in_flight = pipeline_activation_sets(build_pipeline_schedule(shape)[rank]);
  parts.split_backward = kind == PipelineKind::zb_h1;
  Transformer<float> stage(config, kB, kT, recompute, nullptr, 0, "auto", kDefaultBucketMiB, kLogitsChunkRows,
                           kDefaultZero3Prefetch, nullptr, false, parts);
  stage.init_random(5);
  MicroBatchRunner<float> runner(stage, shape);
  const Figures got = train(
      stage,
      [&](int step, int micro, int V) {
        int k = 0;
        runner.run_step(micro, [&](TokenBatch& b) {
          b = TokenBatch{};
          b.inputs = tokens(step, k, 1, V);
          b.targets = tokens(step, k, 2, V);
          ++k;
        });
      },
      micro_steps, val_inputs, [&](const int* in, const int* tg) { return runner.position_losses(in, tg); });

  for (int step = 0; step < kSteps; ++step) {
    INFO("step " << step + 1 << ": loss " << got.loss[step] << " vs " << want.loss[step] << ", norm "
                 << got.norm[step] << " vs " << want.norm[step]);
    CHECK(relative(got.loss[step], want.loss[step]) < 1e-6);
    CHECK(relative(got.norm[step], want.norm[step]) < 1e-6);
  }
  CHECK(test::all_close("parameters after the steps", got.parameters, want.parameters, 1e-5, 1e-7));
  CHECK(test::bytes_of(got.val_losses) == test::bytes_of(want.val_losses));
  if (parts.tied != nullptr) check_tied_copies(stage, *parts.tied);
}

}  // namespace

TEST_CASE("pipeline parallelism: every schedule trains as one process", "[pp]") {
  const int p = world().world_size(), rank = world().rank();
  if (p == 1) return;  // one rank: nothing to pipeline
  // The first and the last stage sum a tied wte's gradient: their own two-rank group.
  const bool end = rank == 0 || rank == p - 1;
  Communicator tied(world(), end ? 0 : rank, rank, "tied-embedding");
  const ModelConfig gpt2{16, 37, 48, 2 * p, 2, 16};  // maxT, V, Vp, L, NH, C
  const ModelConfig llama = llama3_config(16, 40, 2 * p + 1, 4, 2, 32, 48, llama32_rope(), false);
  const ModelConfig llama_tied = llama3_config(16, 40, p, 4, 2, 32, 48, llama32_rope(), true);
  const PipelineKind kinds[] = {PipelineKind::gpipe, PipelineKind::one_f_one_b, PipelineKind::interleaved,
                                 PipelineKind::zb_h1};
  int recompute = 0;  // cycled through the settings; zb-h1 needs 0
  for (const ModelConfig& config : {gpt2, llama})
    for (PipelineKind kind : kinds)
      for (int micro_steps : p == 2 ? std::vector<int>{p, p + 1} : std::vector<int>{p + 1}) {  // m = p at 2 ranks
        const int v = kind == PipelineKind::interleaved ? 2 : 1;
        check_pipeline(config, kind, v, micro_steps, kind == PipelineKind::zb_h1 ? 0 : recompute, end ? &tied : nullptr);
        recompute = (recompute + 1) % (kRecomputeMax + 1);
      }
  check_pipeline(llama_tied, PipelineKind::one_f_one_b, 1, p + 1, 1, end ? &tied : nullptr);
}
