// Context parallelism under mpirun (test/checks/distributed_nccl.sh, 2 and 4 ranks): the ranks'
// grid from ParallelGroups with --cp (every rank of a CP group reading the same micro-batches,
// each its zigzag part of every sequence, K/V passed around the group), against one process
// training the same micro-batches: two optimizer steps' loss and gradient norm within 1e-6
// relative, the parameters after them within 1e-5, and the forward pass alone (validation) giving
// one process's per-position losses in [B][T] order within 1e-6. GPT-2 (learned positions: each
// rank's wpe rows) and Llama 3 (GQA, RoPE at the zigzag positions), one chunk per rank-half of
// 1 token and of several, every --recompute setting, ZeRO 1; at 4 ranks also CP 2 × DP 2 (the
// gradient sum over both) and TP 2 × CP 2 (with sequence parallelism). A bad token id is named by
// its [B][T] place on every rank.
#include "test/test_util.h"
#include "src/dist/comm.h"
#include "src/dist/parallel_groups.h"
#include "src/model/transformer.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace {

Communicator& world() {
  static Communicator instance{CommOptions{}};
  return instance;
}

const int kB = 2, kSteps = 2, kMicroSteps = 2;

// Micro-batch `micro` of step `step` of data-parallel replica d (tokens of B sequences of T).
std::vector<int> tokens(int step, int micro, int salt, int d, int T, int vocab) {
  return test::random_tokens(static_cast<size_t>(kB) * T, vocab, 1000 * salt + 100 * step + 10 * micro + d);
}

double relative(double got, double want) { return std::fabs(got - want) / std::max(1e-12, std::fabs(want)); }

struct Figures {
  std::vector<double> loss, norm;
  std::vector<float> parameters, val_losses;
};

// Two steps of kMicroSteps micro-batches each; `batch(step, micro, salt)` gives the model's tokens.
template <typename Batch>
Figures train(Transformer<float>& model, Batch&& batch) {
  OptimizerSettings opt;
  opt.grad_clip = 1.0f;
  opt.eps = 1e-2f;  // keeps Adam's first step a smooth function of the gradients (mpi_grad_sync.cu)
  Figures f;
  model.forward(batch(0, 0, 8).data(), batch(0, 0, 9).data());
  f.val_losses = model.position_losses();
  for (int step = 1; step <= kSteps; ++step) {
    model.zero_grad();
    for (int k = 0; k < kMicroSteps; ++k)
      model.forward_backward(batch(step, k, 1).data(), batch(step, k, 2).data(), kMicroSteps, k + 1 == kMicroSteps);
    const StepFigures figures = model.step_figures();
    f.loss.push_back(figures.loss);
    f.norm.push_back(figures.grad_norm);
    model.apply_update(opt, 1e-2f, step, figures.grad_norm);
  }
  f.parameters = model.parameters();
  return f;
}

// A run on the grid of --tp tp and --cp cp (the rest of the ranks data-parallel) against one process
// over the same micro-batches (the data-parallel replicas' sequences side by side in one batch).
void check_context_parallel(const ModelConfig& config, int T, int tp, int cp, int recompute, int zero) {
  const int ranks = world().world_size();
  INFO((config.positions == Positions::rope ? "Llama" : "GPT-2") << ", T " << T << ", --tp " << tp << ", --cp " << cp
                                                                 << ", --recompute " << recompute << ", ZeRO " << zero);
  ParallelGroups groups(world(), tp, 1, cp);
  REQUIRE(groups.cp_size() == cp);
  const int D = groups.data_ranks(), d = groups.data_rank();
  REQUIRE(D * cp * tp == ranks);
  const int V = config.vocab_size;
  auto whole = [&](int step, int micro, int salt) {  // every replica's sequences: the single process's batch
    std::vector<int> all;
    for (int r = 0; r < D; ++r) {
      const std::vector<int> part = tokens(step, micro, salt, salt >= 8 ? 0 : r, T, V);
      all.insert(all.end(), part.begin(), part.end());
    }
    return all;
  };
  Transformer<float> single(config, kB * D, T, recompute);
  single.init_random(5);
  Figures want = train(single, whole);
  want.val_losses.resize(static_cast<size_t>(kB) * T);  // replica 0's sequences (every replica validates those)

  Transformer<float> model(config, kB, T, recompute, &groups.dp(), zero, "auto", kDefaultBucketMiB, kLogitsChunkRows,
                           kDefaultZero3Prefetch, groups.tp(), tp > 1, {}, groups.cp());
  model.init_random(5);
  const Figures got = train(model, [&](int step, int micro, int salt) {
    return tokens(step, micro, salt, salt >= 8 ? 0 : d, T, V);
  });
  for (int step = 0; step < kSteps; ++step) {
    INFO("step " << step + 1 << ": loss " << got.loss[step] << " vs " << want.loss[step] << ", norm "
                 << got.norm[step] << " vs " << want.norm[step]);
    CHECK(relative(got.loss[step], want.loss[step]) < 1e-6);
    CHECK(relative(got.norm[step], want.norm[step]) < 1e-6);
  }
  CHECK(test::all_close("parameters after the steps", got.parameters, want.parameters, 1e-5, 1e-7));
  CHECK(test::all_close("validation losses", got.val_losses, want.val_losses, 1e-6, 1e-7));
  // A bad id is named by its place in [B][T] on every rank, whichever rank holds it.
  std::vector<int> bad = tokens(0, 0, 7, 0, T, V);
  bad[static_cast<size_t>(kB) * T - 1] = V;
  std::string error;
  try {
    model.forward(bad.data(), nullptr);
  } catch (const std::exception& e) {
    error = e.what();
  }
  CHECK_THAT(error, Catch::Contains("input token " + std::to_string(V) + " at batch row " + std::to_string(kB - 1) +
                                    ", position " + std::to_string(T - 1)));
}

}  // namespace

TEST_CASE("context parallelism: the CP group trains as one process", "[cp]") {
  const int ranks = world().world_size();
  if (ranks == 1) return;  // one rank: nothing to split
  const ModelConfig gpt2{64, 37, 48, 2, 2, 16};  // maxT, V, Vp, L, NH, C
  ModelConfig llama = llama3_config(64, 37, 2, 4, 2, 32, 48, llama32_rope(), false);  // NKV 2 of NH 4, H 48
  llama.padded_vocab_size = 48;  // 24 rows per TP rank
  int recompute = 0;  // cycled through the settings
  for (const ModelConfig& config : {gpt2, llama})
    for (const int chunk : {1, 3}) {  // tokens per chunk: T = 2·N·chunk
      check_context_parallel(config, 2 * ranks * chunk, 1, ranks, recompute, recompute % 2);
      recompute = (recompute + 1) % (kRecomputeMax + 1);
    }
  if (ranks == 4) {
    check_context_parallel(gpt2, 12, 1, 2, 2, 1);   // CP 2 x DP 2
    check_context_parallel(llama, 12, 2, 2, 1, 0);  // TP 2 x CP 2
    check_context_parallel(gpt2, 4, 2, 2, 3, 1);    // TP 2 x CP 2, one token per chunk
  }
}
