// Tensor parallelism under mpirun (test/checks/distributed_nccl.sh, 2 and 4 ranks: TP 2 x DP 1 and
// TP 2 x DP 2): the collectives each group's communicator makes in an optimizer step are the ones
// comm_plan.h's tp_step_traffic and step_traffic count (--plan's figures), with and without
// sequence parallelism, at every --recompute setting, ZeRO 1 and 2, the lm head in several chunks;
// and the update equals one process's on the whole global batch; for Llama 3 (GQA split by K/V heads) too.
#include "test/test_util.h"
#include "src/dist/comm.h"
#include "src/dist/comm_plan.h"
#include "src/dist/parallel_groups.h"
#include "src/model/transformer.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace {

Communicator& world() {
  static Communicator instance{CommOptions{}};
  return instance;
}

const ModelConfig kModel{16, 37, 48, 3, 2, 16};  // maxT, V, Vp, L, NH, C: Vp/2 = 24 rows per TP rank
const int kB = 2, kT = 7, kMicroSteps = 2, kTp = 2, kHeadRows = 5;
const double kLayerBucketMiB = 1e-6;  // below one layer: a bucket per layer

std::vector<int> tokens(int data_rank, int micro, int salt) {
  return test::random_tokens(kB * kT, kModel.vocab_size, 1000 * salt + 10 * micro + data_rank);
}
std::vector<int> global_tokens(int data_ranks, int micro, int salt) {
  std::vector<int> all;
  for (int r = 0; r < data_ranks; ++r) {
    const std::vector<int> mine = tokens(r, micro, salt);
    all.insert(all.end(), mine.begin(), mine.end());
  }
  return all;
}

}  // namespace

TEST_CASE("tensor parallelism: each group's collectives are the plan's, the update one process's", "[tp]") {
  if (world().world_size() % kTp != 0) return;  // one rank (a one-GPU machine): nothing to split
  ParallelGroups groups(world(), kTp);
  const int data_ranks = groups.dp().world_size(), data_rank = groups.dp().rank();
  OptimizerSettings opt;
  opt.grad_clip = 0.0f;
  opt.eps = 1e-2f;  // keeps Adam's first step a smooth function of the gradients (mpi_grad_sync.cu)
  Transformer<float> single(kModel, kB * data_ranks, kT);
  single.init_random(5);
  single.zero_grad();
  for (int m = 0; m < kMicroSteps; ++m)
    single.forward_backward(global_tokens(data_ranks, m, 1).data(), global_tokens(data_ranks, m, 2).data(),
                            kMicroSteps, m == kMicroSteps - 1);
  test::optimizer_step(single, opt, 1e-2f, 1);
  const std::vector<float> expected = single.parameters();

  for (const bool sequence_parallel : {true, false})
    for (const int zero : {1, 2})
      for (int recompute = 0; recompute <= kRecomputeMax; ++recompute) {
        INFO("sequence parallel " << sequence_parallel << ", ZeRO " << zero << ", --recompute " << recompute << ", "
                                  << data_ranks << " data-parallel rank(s)");
        Transformer<float> model(kModel, kB, kT, recompute, &groups.dp(), zero, "auto", kLayerBucketMiB, kLogitsChunkRows, 1,
                          groups.tp(), sequence_parallel);
        model.set_logits_chunk_rows(kHeadRows);
        model.init_random(5);
        groups.tp()->counts() = CollectiveCounts{};
        groups.dp().counts() = CollectiveCounts{};
        model.zero_grad();
        for (int m = 0; m < kMicroSteps; ++m)
          model.forward_backward(tokens(data_rank, m, 1).data(), tokens(data_rank, m, 2).data(), kMicroSteps,
                                 m == kMicroSteps - 1);
        model.gradient_sync().wait_idle();
        const CollectiveCounts tp = groups.tp()->counts(), dp = groups.dp().counts();
        const StepTraffic planned =
            tp_step_traffic(kModel, kB, kT, model.tensor_parallelism(), recompute, model.lm_head_chunks(),
                            kMicroSteps, model.gradient_sync().buckets(), model.zero_stage() >= 2, sizeof(float));
        CHECK(model.lm_head_chunks() == 3);
        CHECK(tp.all_gather == planned.all_gather.calls);
        CHECK(tp.reduce_scatter == planned.reduce_scatter.calls);
        CHECK(tp.all_reduce == planned.all_reduce.calls);
        CHECK(tp.all_gather == (sequence_parallel ? kMicroSteps * (4 * 3 + 2 + (recompute >= 2 ? 2 * 3 : 0)) : 0));
        // The data-parallel group carries the gradients as without tensor parallelism.
        const StepTraffic gradients = step_traffic(model.gradient_sync().buckets(), data_ranks, model.zero_stage(),
                                                   kMicroSteps, 1, sizeof(float));
        CHECK(dp.reduce_scatter == gradients.reduce_scatter.calls);
        test::optimizer_step(model, opt, 1e-2f, 1);
        const std::vector<float> got = model.parameters();
        REQUIRE(got.size() == expected.size());
        // Relative to the parameter or to the update's scale (lr): the row-parallel biases start at
        // zero and their small gradients are sums of rows the TP ranks reduced in another order.
        double worst = 0.0;
        size_t at = 0;
        for (size_t i = 0; i < got.size(); ++i) {
          const double d = std::abs(static_cast<double>(got[i]) - expected[i]) / (std::abs(expected[i]) + 1e-2);
          if (d > worst) { worst = d; at = i; }
        }
        INFO("worst at parameter " << at << " of " << got.size() << ": " << got[at] << " vs " << expected[at]);
        CHECK(worst < 1e-5);
      }
}

TEST_CASE("tensor parallelism, Llama 3 (GQA split by K/V heads, SwiGLU, RoPE, untied): one process's update", "[tp]") {
  if (world().world_size() % kTp != 0) return;
  // maxT 16, V 37 (Vp 48: 24 rows per TP rank), L 2, NH 4, NKV 2 (one K/V head per TP rank), C 32, H 48.
  ModelConfig llama = llama3_config(16, 37, 2, 4, 2, 32, 48, llama32_rope(), false);
  llama.padded_vocab_size = 48;
  ParallelGroups groups(world(), kTp);
  const int data_ranks = groups.dp().world_size(), data_rank = groups.dp().rank();
  OptimizerSettings opt;
  opt.grad_clip = 0.0f;
  opt.eps = 1e-2f;
  auto step = [&](Transformer<float>& model, bool global) {
    model.init_random(7);
    model.zero_grad();
    for (int m = 0; m < kMicroSteps; ++m) {
      const std::vector<int> in = global ? global_tokens(data_ranks, m, 3) : tokens(data_rank, m, 3);
      const std::vector<int> out = global ? global_tokens(data_ranks, m, 4) : tokens(data_rank, m, 4);
      model.forward_backward(in.data(), out.data(), kMicroSteps, m == kMicroSteps - 1);
    }
    test::optimizer_step(model, opt, 1e-2f, 1);
    return model.parameters();
  };
  Transformer<float> single(llama, kB * data_ranks, kT);
  const std::vector<float> expected = step(single, true);
  for (const bool sequence_parallel : {true, false})
    for (const int recompute : {0, kRecomputeMax}) {
      INFO("sequence parallel " << sequence_parallel << ", --recompute " << recompute << ", " << data_ranks
                                << " data-parallel rank(s)");
      Transformer<float> model(llama, kB, kT, recompute, &groups.dp(), 1, "auto", kLayerBucketMiB, kLogitsChunkRows, 1,
                               groups.tp(), sequence_parallel);
      model.set_logits_chunk_rows(kHeadRows);
      const std::vector<float> got = step(model, false);
      REQUIRE(got.size() == expected.size());
      double worst = 0.0;
      for (size_t i = 0; i < got.size(); ++i)
        worst = std::max(worst, std::abs(static_cast<double>(got[i]) - expected[i]) / (std::abs(expected[i]) + 1e-2));
      CHECK(worst < 1e-5);
    }
}
