// --fp8's delayed scaling under mpirun (test/checks/distributed_nccl.sh, 2 and 4 ranks: TP 2 x DP 1
// and TP 2 x DP 2): every amax is max-reduced over the tensor-parallel and the data-parallel groups
// before the scales are updated (src/model/fp8_state.h), so after a step every rank holds the same
// scales, inverse scales and histories, although each TP rank holds other weight columns and
// other heads' activations, and each DP rank other data. The MLP down-projection's weight columns
// of TP rank 1 alone are made 8x larger: its scale on every rank is E4M3's max over that rank's
// amax (the whole tensor's, computed here on the host), which rank 0 never sees.
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

}  // namespace

TEST_CASE("--fp8 delayed scaling: amaxes reduced over TP and DP, the same scales on every rank", "[fp8]") {
  if (world().world_size() % kTp != 0) return;  // one rank (a one-GPU machine): nothing to split
  ParallelGroups groups(world(), kTp);
  const bool sequence_parallel = GENERATE(true, false);
  INFO("sequence parallel " << sequence_parallel << ", " << groups.dp().world_size() << " data-parallel rank(s)");
  Transformer<bf16> model(kModel, kB, kT, 0, &groups.dp(), 0, "auto", kDefaultBucketMiB, kLogitsChunkRows, 1,
                          groups.tp(), sequence_parallel, {}, nullptr, Fp8Settings{});
  model.init_random(11);
  // Layer 0's fcproj weight (C x H, row-parallel: TP rank r holds input columns [r·H/2, (r+1)·H/2)):
  // rank 1's columns times 8.
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
  // Every value of the FP8 state the same on every rank: max(x) = x = -max(-x) over the world.
  const std::vector<float> mine = model.fp8_state()->saved_state();
  std::vector<float> negated(mine.size());
  std::transform(mine.begin(), mine.end(), negated.begin(), [](float x) { return -x; });
  test::DeviceBuffer<float> high(mine), low(negated);
  world().ordered_with(model.stream(), [&] {
    world().all_reduce(high.ptr, mine.size(), ncclMax);
    world().all_reduce(low.ptr, mine.size(), ncclMax);
  });
  const std::vector<float> hi = copy_floats_to_host(high.ptr, mine.size(), model.stream());
  const std::vector<float> lo = copy_floats_to_host(low.ptr, mine.size(), model.stream());
  size_t differing = 0;
  for (size_t k = 0; k < mine.size(); ++k) differing += hi[k] != mine[k] || -lo[k] != mine[k];
  CHECK(differing == 0);
}
