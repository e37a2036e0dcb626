// How gradients and parameters travel between ranks (src/dist/grad_sync.h, param_shards.h) under
// mpirun (test/checks/distributed_nccl.sh): one collective per bucket per step — all-reduce at ZeRO
// 0, reduce-scatter at 1, 2 and 3 (every micro-step at 2 and 3), parameters all-gathered per
// bucket after the update at 1 and 2, and at 3 per bucket and pass where the gather windows do not
// still hold it — and the update each stage makes equals the single-rank update on the whole
// global batch (a plain host computation of the same model on every rank's tokens is not needed:
// one process with B·R rows is the reference). A Llama 3 configuration too, at ZeRO 1 and 3.
#include "test/test_util.h"
#include "src/dist/comm.h"
#include "src/dist/comm_plan.h"
#include "src/model/transformer.h"
#include "src/run/memory_plan.h"

#include <vector>

namespace {

Communicator& comm() {
  static Communicator instance{CommOptions{}};
  return instance;
}

const ModelConfig kModel{16, 37, 40, 3, 2, 16};  // maxT, V, Vp, L, NH, C: three one-layer buckets + model
const int kB = 2, kT = 7, kMicroSteps = 2;
const double kLayerBucketMiB = 1e-6;  // below one layer: a bucket per layer

// Rank r's micro-step m tokens, and all ranks' as one batch (rank-major rows), as the data loader
// hands them out.
std::vector<int> tokens(int rank, int micro, int salt) {
  return test::random_tokens(kB * kT, kModel.vocab_size, 1000 * salt + 10 * micro + rank);
}
std::vector<int> global_tokens(int micro, int salt) {
  std::vector<int> all;
  for (int r = 0; r < comm().world_size(); ++r) {
    const std::vector<int> mine = tokens(r, micro, salt);
    all.insert(all.end(), mine.begin(), mine.end());
  }
  return all;
}

}  // namespace

// ZeRO 3's parameter all-gathers in an optimizer step of `micro_steps` micro-steps right after an
// update, with `layer_buckets` layer buckets and `windows` gather windows: the wte/wpe/lnf bucket
// once; every layer bucket in the first forward; in each later pass (the backward, then the next
// micro-step's forward, walking the buckets the other way) all but the `windows` buckets the
// previous pass left in the windows.
long long zero3_gathers(long long layer_buckets, long long windows, long long micro_steps) {
  return 1 + layer_buckets + (2 * micro_steps - 1) * std::max(0LL, layer_buckets - windows);
}

TEST_CASE("each bucket travels in one collective: all-reduce at ZeRO 0, reduce-scatter and all-gather at 1 to 3",
          "[grad_sync]") {
  const int R = comm().world_size(), rank = comm().rank();
  OptimizerSettings opt;
  opt.grad_clip = 0.0f;
  // Adam's first step is about lr·sign(g): a large eps keeps it a smooth function of the
  // gradients, so summation-order differences between the runs stay as small as they are.
  opt.eps = 1e-2f;
  // The reference: one process, the whole global batch in each micro-step.
  Transformer<float> single(kModel, kB * R, kT);
  single.init_random(11);
  single.zero_grad();
  for (int m = 0; m < kMicroSteps; ++m)
    single.forward_backward(global_tokens(m, 1).data(), global_tokens(m, 2).data(), kMicroSteps,
                            m == kMicroSteps - 1);
  test::optimizer_step(single, opt, 1e-2f, 1);
  const std::vector<float> expected = single.parameters();

  for (const auto& [zero, prefetch] : {std::pair{0, 1}, {1, 1}, {2, 1}, {3, 1}, {3, 2}}) {
    INFO("ZeRO " << zero << ", " << R << " ranks, --zero3-prefetch " << prefetch);
    Transformer<float> model(kModel, kB, kT, kRecomputeDefault, &comm(), zero, "auto", kLayerBucketMiB, kLogitsChunkRows,
                      prefetch);
    const size_t buckets = model.gradient_sync().buckets().buckets().size();
    REQUIRE(buckets == 4);
    model.init_random(11);
    comm().counts() = CollectiveCounts{};
    model.zero_grad();
    for (int m = 0; m < kMicroSteps; ++m)
      model.forward_backward(tokens(rank, m, 1).data(), tokens(rank, m, 2).data(), kMicroSteps, m == kMicroSteps - 1);
    const long long gradient_all_reduces = comm().counts().all_reduce;
    test::optimizer_step(model, opt, 1e-2f, 1);
    const CollectiveCounts c = comm().counts();
    // --plan's traffic (comm_plan.h) counts the calls the communicator made for the gradients
    // and parameters (all but the step figures' two all-reduces).
    const StepTraffic planned = step_traffic(model.gradient_sync().buckets(), R, model.zero_stage(), kMicroSteps,
                                             prefetch, sizeof(float));
    CHECK(planned.all_gather.calls == c.all_gather);
    CHECK(planned.reduce_scatter.calls == c.reduce_scatter);
    CHECK(planned.all_reduce.calls == gradient_all_reduces);
    if (R == 1) {
      CHECK(c.reduce_scatter + c.all_gather + c.all_reduce == 0);
    } else if (zero == 0) {
      CHECK(gradient_all_reduces == static_cast<long long>(buckets));
      CHECK(c.reduce_scatter == 0);
      CHECK(c.all_gather == 0);
    } else {
      CHECK(gradient_all_reduces == 0);
      CHECK(c.reduce_scatter == static_cast<long long>(buckets) * (zero >= 2 ? kMicroSteps : 1));
      CHECK(c.all_gather == (zero == 3 ? zero3_gathers(buckets - 1, prefetch + 1, kMicroSteps)
                                       : static_cast<long long>(buckets)));
      CHECK(c.all_reduce == 2);  // the step's figures: the gradient norm's sum over the ranks' chunks, the loss's
    }
    if (zero == 3 && R > 1) {
      // The plan's parameter terms are the buffers the model holds: its shard, the gather windows
      // (prefetch + 1 layer buckets and wte/wpe/lnf) and no master weights (fp32).
      const MemoryPlan plan = plan_memory(kModel, kB, kT, kRecomputeDefault, DType::fp32, 3, R, kLayerBucketMiB, 0,
                                          kLogitsChunkRows, prefetch);
      const GradientBuckets& b = model.gradient_sync().buckets();
      CHECK(term_bytes(plan, "parameters") == 4 * b.shard_elements());
      CHECK(term_bytes(plan, "parameter gather windows") ==
            4 * ((prefetch + 1) * b.largest_layer_bucket() + R * b.model_bucket().chunk));
      CHECK(term_bytes(plan, "parameters") + term_bytes(plan, "parameter gather windows") == model.parameter_bytes());
      CHECK(term_bytes(plan, "gradients") == model.gradient_sync().bytes());
    }
    const std::vector<float> got = model.parameters();
    REQUIRE(got.size() == expected.size());
    // Relative to the parameter or to the update's scale (lr 1e-2): the biases start at zero and
    // their small gradients are sums the ranks add in another order (4 ranks: ~1e-5 of 1e-3).
    double worst = 0.0;
    for (size_t i = 0; i < got.size(); ++i)
      worst = std::max(worst, std::abs(static_cast<double>(got[i]) - expected[i]) / (std::abs(expected[i]) + 1e-2));
    CHECK(worst < 1e-5);
  }
}

TEST_CASE("Llama 3 (GQA, SwiGLU, RoPE, untied): ZeRO 1 and 3 across the ranks give one process's updates",
          "[grad_sync]") {
  // maxT 16, V 37 (Vp 40), L 2, NH 4, NKV 2, C 32 (HS 8), H 48; two steps, so that ZeRO 3 gathers updated shards.
  ModelConfig llama = llama3_config(16, 37, 2, 4, 2, 32, 48, llama31_rope(), false);
  llama.padded_vocab_size = 40;
  const int R = comm().world_size(), rank = comm().rank(), kSteps = 2;
  OptimizerSettings opt;
  opt.grad_clip = 0.0f;
  opt.eps = 1e-2f;  // as above
  auto train = [&](Transformer<float>& model, bool global) {
    model.init_random(13);
    for (int step = 1; step <= kSteps; ++step) {
      model.zero_grad();
      for (int m = 0; m < kMicroSteps; ++m) {
        const int salt = 10 * step;
        const std::vector<int> in = global ? global_tokens(m, salt + 1) : tokens(rank, m, salt + 1);
        const std::vector<int> out = global ? global_tokens(m, salt + 2) : tokens(rank, m, salt + 2);
        model.forward_backward(in.data(), out.data(), kMicroSteps, m == kMicroSteps - 1);
      }
      test::optimizer_step(model, opt, 1e-2f, step);
    }
    return model.parameters();
  };
  Transformer<float> single(llama, kB * R, kT);
  const std::vector<float> expected = train(single, true);
  for (const int zero : {1, 3}) {
    INFO("ZeRO " << zero << ", " << R << " ranks");
    Transformer<float> model(llama, kB, kT, kRecomputeDefault, &comm(), zero, "auto", kLayerBucketMiB);
    const std::vector<float> got = train(model, false);
    REQUIRE(got.size() == expected.size());
    double worst = 0.0;
    for (size_t i = 0; i < got.size(); ++i)
      worst = std::max(worst, std::abs(static_cast<double>(got[i]) - expected[i]) / (std::abs(expected[i]) + 1e-2));
    CHECK(worst < 1e-5);
  }
}
