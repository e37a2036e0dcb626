// --fp8's scaling under mpirun (test/checks/distributed_nccl.sh, 2 and 4 ranks: TP 2 x DP 1 and
// TP 2 x DP 2): every amax is max-reduced over the tensor-parallel group before a scale comes from
// it (src/model/fp8_state.h), although each TP rank holds other weight columns and other heads'
// activations. The MLP down-projection's weight columns of TP rank 1 alone are made 8x larger: its
// scale on every rank is E4M3's max over that rank's amax (the whole tensor's, computed here on the
// host), which rank 0 never sees. Delayed scaling reduces the step's amaxes over the data-parallel
// group too, so after a step every rank holds the same scales, inverse scales and histories;
// current scaling reduces each cast's amax over the TP group alone (DP ranks cast other data), so
// every TP rank holds the same state as its group's other rank.
#include "test/test_util.h"
#include "src/dist/comm.h"
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

// maxT, V, Vp, L, NH, C: per TP rank qkv 48, attention 16, hidden 64 columns; 16 rows.
const ModelConfig kModel{16, 60, 64, 2, 2, 32};
const int kB = 2, kT = 8, kTp = 2;

// `model` initialized, its layer 0's fcproj weight (C x H, row-parallel: TP rank r holds input
// columns [r·H/2, (r+1)·H/2)) with rank 1's columns times 8. Returns that weight's amax as bf16
// holds it.
float init_with_large_fcproj_on_tp_rank1(Transformer<bf16>& model) {
  model.init_random(11);
  std::vector<float> params = model.parameters();
  const ParameterLayout whole(kModel);
  const int C = kModel.channels, H = kModel.hidden();
  float* fcproj = params.data() + whole[kFcprojw].offset;
  float amax = 0.0f;
  for (int o = 0; o < C; ++o)
    for (int i = 0; i < H; ++i) {
      float& w = fcproj[static_cast<size_t>(o) * H + i];
      if (i >= H / 2) w *= 8.0f;
      amax = std::max(amax, std::fabs(host_to_float(host_from_float<bf16>(w))));
    }
  model.set_parameters(params);
  return amax;
}

// How many values of `model`'s FP8 state are not the same on every rank of `group` (a value is
// when max(x) = x = -max(-x) over the group).
size_t values_differing_over(Communicator& group, const Transformer<bf16>& model) {
  const std::vector<float> mine = model.fp8_state()->saved_state();
  std::vector<float> negated(mine.size());
  std::transform(mine.begin(), mine.end(), negated.begin(), [](float x) { return -x; });
  test::DeviceBuffer<float> high(mine), low(negated);
  group.ordered_with(model.stream(), [&] {
    group.all_reduce(high.ptr, mine.size(), ncclMax);
    group.all_reduce(low.ptr, mine.size(), ncclMax);
  });
  const std::vector<float> hi = copy_floats_to_host(high.ptr, mine.size(), model.stream());
  const std::vector<float> lo = copy_floats_to_host(low.ptr, mine.size(), model.stream());
  size_t differing = 0;
  for (size_t k = 0; k < mine.size(); ++k) differing += hi[k] != mine[k] || -lo[k] != mine[k];
  return differing;
}

}  // namespace

TEST_CASE("--fp8 delayed scaling: amaxes reduced over TP and DP, the same scales on every rank", "[fp8]") {
  if (world().world_size() % kTp != 0) return;  // one rank (a one-GPU machine): nothing to split
  ParallelGroups groups(world(), kTp);
  const bool sequence_parallel = GENERATE(true, false);
  INFO("sequence parallel " << sequence_parallel << ", " << groups.dp().world_size() << " data-parallel rank(s)");
  Transformer<bf16> model(kModel, kB, kT, 0, &groups.dp(), 0, "auto", kDefaultBucketMiB, kLogitsChunkRows, 1,
                          groups.tp(), sequence_parallel, {}, nullptr, Fp8Settings{});
  const float amax = init_with_large_fcproj_on_tp_rank1(model);
  const std::vector<int> inputs = test::random_tokens(kB * kT, kModel.vocab_size, 10 + groups.dp().rank());
  const std::vector<int> targets = test::random_tokens(kB * kT, kModel.vocab_size, 20 + groups.dp().rank());
  OptimizerSettings opt;
  for (int step = 1; step <= 2; ++step) {
    model.zero_grad();
    model.forward_backward(inputs.data(), targets.data(), 1);
    test::optimizer_step(model, opt, 1e-3f, step);
    if (step == 1)  // the first step's weight amax was the set parameters': the scale is 448 / it
      CHECK(model.fp8_state()->scale(0, Fp8Product::fcproj, Fp8Operand::weight) == kFp8E4M3Max / amax);
  }
  CHECK(values_differing_over(world(), model) == 0);
}

TEST_CASE("--fp8 current scaling: each cast's amax reduced over TP, the same scales on every TP rank", "[fp8]") {
  if (world().world_size() % kTp != 0) return;
  ParallelGroups groups(world(), kTp);
  const bool sequence_parallel = GENERATE(true, false);
  INFO("sequence parallel " << sequence_parallel << ", " << groups.dp().world_size() << " data-parallel rank(s)");
  Fp8Settings current;
  current.delayed = false;
  Transformer<bf16> model(kModel, kB, kT, 0, &groups.dp(), 0, "auto", kDefaultBucketMiB, kLogitsChunkRows, 1,
                          groups.tp(), sequence_parallel, {}, nullptr, current);
  const float amax = init_with_large_fcproj_on_tp_rank1(model);
  // Each DP rank its own tokens: their activations' scales differ, the TP group's do not.
  const std::vector<int> inputs = test::random_tokens(kB * kT, kModel.vocab_size, 10 + groups.dp().rank());
  const std::vector<int> targets = test::random_tokens(kB * kT, kModel.vocab_size, 20 + groups.dp().rank());
  model.zero_grad();
  model.forward_backward(inputs.data(), targets.data(), 1);
  // The weight was cast in the forward, with the scale of the whole tensor's amax.
  CHECK(model.fp8_state()->scale(0, Fp8Product::fcproj, Fp8Operand::weight) == kFp8E4M3Max / amax);
  // Every activation's, gradient's and weight's scale, inverse scale and recorded amax.
  CHECK(values_differing_over(*groups.tp(), model) == 0);
}
