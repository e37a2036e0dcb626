// moe_dispatch.cuh vs. CPU loops written here: the plan against a stable sort of the (token, k)
// pairs by expert (exactly: offsets, slots, tokens), the permutation's exact copies, the gated
// combination and its backward (dy bit for bit, the sums in double), the unpermuting sum written
// and accumulated. Routings: random distinct experts per token, a zero-token expert, all tokens on
// one expert, K = E, E = 1, N = 0, 1, 37 and 1000 (the plan's 256-pair tiles several times over);
// C = 40 and 200 (multiples of 8, not of 32), every preset's width and Llama 3.1 405B's C = 16384;
// bf16 and float; outputs poisoned first and every op rerun for bit-identical results.
#include "test/test_util.h"
#include "test/preset_shapes.h"
#include "kernels/moe_dispatch.cuh"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <type_traits>

namespace {

template <typename T> constexpr double kRel = std::is_same<T, float>::value ? 1e-5 : 1.0 / 64;

size_t at(int row, int col, int cols) { return static_cast<size_t>(row) * cols + col; }

enum class Routing { random, zero_token_expert, one_expert, all_experts };

struct DispatchCase {
  int N, E, K;
  Routing routing;
  const char* what;
};
const DispatchCase kCases[] = {
    {0, 8, 2, Routing::random, "no tokens"},
    {1, 1, 1, Routing::random, "E = 1, one token"},
    {37, 1, 1, Routing::random, "E = 1"},
    {37, 8, 2, Routing::random, "E = 8, K = 2"},
    {37, 64, 8, Routing::zero_token_expert, "E = 64, K = 8, expert 13 unused"},
    {37, 8, 8, Routing::all_experts, "K = E"},
    {37, 8, 1, Routing::one_expert, "every token on expert 3"},
    {1000, 8, 2, Routing::random, "2000 pairs: several tiles"},
    {1000, 8, 3, Routing::one_expert, "every token on expert 3, K = 3: several tiles"},
    {300, 256, 8, Routing::zero_token_expert, "E = 256"},
};

// Each token's K distinct experts, in a random order (the router's k order is by gate, not index).
std::vector<int> routed_experts(const DispatchCase& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int> expert(static_cast<size_t>(c.N) * c.K);
  for (int n = 0; n < c.N; ++n) {
    std::vector<int> perm(c.E);
    std::iota(perm.begin(), perm.end(), 0);
    if (c.routing == Routing::zero_token_expert) perm.erase(perm.begin() + 13);
    std::shuffle(perm.begin(), perm.end(), rng);
    if (c.routing == Routing::one_expert) {
      std::iter_swap(perm.begin(), std::find(perm.begin(), perm.end(), 3));
      std::shuffle(perm.begin(), perm.begin() + c.K, rng);  // expert 3 somewhere among the K
    }
    for (int k = 0; k < c.K; ++k) expert[at(n, k, c.K)] = perm[k];
  }
  return expert;
}

struct Plan {
  std::vector<int> offsets, slot, token_of_slot;
};

// The stable counting sort written out: expert by expert, the pairs in (n, k) order.
Plan reference_plan(const std::vector<int>& expert, int N, int E, int K) {
  Plan p;
  p.offsets.assign(E + 1, 0);
  p.slot.assign(expert.size(), -1);
  p.token_of_slot.assign(expert.size(), -1);
  int next = 0;
  for (int e = 0; e < E; ++e) {
    p.offsets[e] = next;
    for (int n = 0; n < N; ++n)
      for (int k = 0; k < K; ++k)
        if (expert[at(n, k, K)] == e) {
          p.slot[at(n, k, K)] = next;
          p.token_of_slot[next++] = n;
        }
  }
  p.offsets[E] = next;
  return p;
}

Plan run_plan(const std::vector<int>& expert, int N, int E, int K) {
  test::DeviceBuffer<int> d_expert(expert), offsets(E + 1), slot(expert.size()), token_of_slot(expert.size());
  moe_dispatch_plan(offsets, slot, token_of_slot, d_expert, N, E, K, nullptr);
  test::require_no_cuda_error();
  return {offsets.download(), slot.download(), token_of_slot.download()};
}

std::vector<int> kernel_widths() {
  std::vector<int> widths = {8, 40, 200, 16384};
  for (const test::PresetShape& p : test::preset_shapes()) widths.push_back(p.C);
  return widths;
}

template <typename T>
void check_data_movement(const DispatchCase& c, int C, uint64_t seed) {
  INFO(c.what << ": N " << c.N << " E " << c.E << " K " << c.K << " C " << C);
  const int N = c.N, K = c.K, S = N * K;
  const std::vector<int> expert = routed_experts(c, seed);
  const Plan plan = reference_plan(expert, N, c.E, K);
  test::DeviceBuffer<int> d_slot(plan.slot), d_token(plan.token_of_slot);

  // Permute: exact copies.
  const std::vector<T> x = test::from_floats<T>(test::random_floats(static_cast<size_t>(N) * C, seed + 1));
  std::vector<T> want_xp(static_cast<size_t>(S) * C);
  for (int s = 0; s < S; ++s)
    for (int ch = 0; ch < C; ++ch) want_xp[at(s, ch, C)] = x[at(plan.token_of_slot[s], ch, C)];
  test::DeviceBuffer<T> d_x(x), d_xp(want_xp.size());
  moe_permute<T>(d_xp, d_x, d_token, S, C, nullptr);
  test::require_no_cuda_error();
  CHECK(test::same_bits(d_xp.download(), want_xp));

  // Combine: out[n] = Σ_k gate·y[slot].
  const std::vector<float> yf = test::round_to<T>(test::random_floats(static_cast<size_t>(S) * C, seed + 2));
  std::vector<float> gate = test::random_floats(static_cast<size_t>(N) * K, seed + 3);
  for (float& g : gate) g = std::fabs(g);
  std::vector<double> want_out(static_cast<size_t>(N) * C, 0.0);
  for (int n = 0; n < N; ++n)
    for (int k = 0; k < K; ++k)
      for (int ch = 0; ch < C; ++ch)
        want_out[at(n, ch, C)] += static_cast<double>(gate[at(n, k, K)]) * yf[at(plan.slot[at(n, k, K)], ch, C)];
  test::DeviceBuffer<T> d_y(test::from_floats<T>(yf)), d_out(want_out.size());
  test::DeviceBuffer<float> d_gate(gate);
  moe_combine<T>(d_out, d_y, d_gate, d_slot, N, K, C, nullptr);
  test::require_no_cuda_error();
  const std::vector<T> out_first = d_out.download();
  CHECK(test::all_close("combine", out_first, want_out, kRel<T>, 1e-5));
  d_out.poison();
  moe_combine<T>(d_out, d_y, d_gate, d_slot, N, K, C, nullptr);
  test::require_no_cuda_error();
  CHECK(test::same_bits(d_out.download(), out_first));

  // Combine backward: dy[slot] = round(gate·dout) (one fp32 product: bit for bit), dgate = dout·y.
  const std::vector<float> dout = test::round_to<T>(test::random_floats(static_cast<size_t>(N) * C, seed + 4));
  std::vector<T> want_dy(static_cast<size_t>(S) * C);
  std::vector<double> want_dgate(static_cast<size_t>(N) * K, 0.0);
  for (int n = 0; n < N; ++n)
    for (int k = 0; k < K; ++k) {
      const int s = plan.slot[at(n, k, K)];
      for (int ch = 0; ch < C; ++ch) {
        want_dy[at(s, ch, C)] = T(gate[at(n, k, K)] * dout[at(n, ch, C)]);
        want_dgate[at(n, k, K)] += static_cast<double>(dout[at(n, ch, C)]) * yf[at(s, ch, C)];
      }
    }
  test::DeviceBuffer<T> d_dout(test::from_floats<T>(dout)), d_dy(want_dy.size());
  test::DeviceBuffer<float> d_dgate(want_dgate.size());
  moe_combine_backward<T>(d_dy, d_dgate, d_dout, d_y, d_gate, d_slot, N, K, C, nullptr);
  test::require_no_cuda_error();
  CHECK(test::same_bits(d_dy.download(), want_dy));
  const std::vector<float> dgate_first = d_dgate.download();
  // fp32 dots of C O(1) terms: ~1e-6·√C absolute noise.
  CHECK(test::all_close("dgate", dgate_first, want_dgate, 1e-5, 1e-5 * std::sqrt(static_cast<double>(C))));
  d_dy.poison();
  d_dgate.poison();
  moe_combine_backward<T>(d_dy, d_dgate, d_dout, d_y, d_gate, d_slot, N, K, C, nullptr);
  test::require_no_cuda_error();
  CHECK(test::same_bits(d_dy.download(), want_dy));
  CHECK(test::same_bits(d_dgate.download(), dgate_first));

  // Unpermute: dx[n] = Σ_k dxp[slot], written, then accumulated onto a pre-filled dx.
  const std::vector<float> dxp = test::round_to<T>(test::random_floats(static_cast<size_t>(S) * C, seed + 5));
  const std::vector<float> dx0 = test::round_to<T>(test::random_floats(static_cast<size_t>(N) * C, seed + 6));
  std::vector<double> want_sum(static_cast<size_t>(N) * C, 0.0);
  for (int n = 0; n < N; ++n)
    for (int k = 0; k < K; ++k)
      for (int ch = 0; ch < C; ++ch) want_sum[at(n, ch, C)] += dxp[at(plan.slot[at(n, k, K)], ch, C)];
  std::vector<double> want_acc = want_sum;
  for (size_t i = 0; i < want_acc.size(); ++i) want_acc[i] += dx0[i];
  test::DeviceBuffer<T> d_dxp(test::from_floats<T>(dxp)), d_dx(want_sum.size());
  moe_unpermute_sum<T>(d_dx, d_dxp, d_slot, N, K, C, false, nullptr);
  test::require_no_cuda_error();
  const std::vector<T> sum_first = d_dx.download();
  CHECK(test::all_close("unpermute_sum", sum_first, want_sum, kRel<T>, 1e-5));
  d_dx.upload(test::from_floats<T>(dx0));
  moe_unpermute_sum<T>(d_dx, d_dxp, d_slot, N, K, C, true, nullptr);
  test::require_no_cuda_error();
  const std::vector<T> acc_first = d_dx.download();
  CHECK(test::all_close("unpermute_sum accumulated", acc_first, want_acc, kRel<T>, 1e-5));
  d_dx.poison();
  moe_unpermute_sum<T>(d_dx, d_dxp, d_slot, N, K, C, false, nullptr);
  test::require_no_cuda_error();
  CHECK(test::same_bits(d_dx.download(), sum_first));
  if (K == 1) {  // one term: the copy back, exactly
    std::vector<float> gathered(want_sum.begin(), want_sum.end());
    CHECK(test::same_bits(sum_first, test::from_floats<T>(gathered)));
  }
}

}  // namespace

TEST_CASE("moe_dispatch_plan is a stable counting sort by expert", "[moe_dispatch]") {
  uint64_t seed = 700;
  for (const DispatchCase& c : kCases) {
    INFO(c.what << ": N " << c.N << " E " << c.E << " K " << c.K);
    const std::vector<int> expert = routed_experts(c, ++seed);
    const Plan want = reference_plan(expert, c.N, c.E, c.K);
    const Plan got = run_plan(expert, c.N, c.E, c.K);
    CHECK(got.offsets == want.offsets);
    CHECK(got.slot == want.slot);
    CHECK(got.token_of_slot == want.token_of_slot);
    if (c.routing == Routing::zero_token_expert) CHECK(got.offsets[13] == got.offsets[14]);
    if (c.routing == Routing::one_expert) CHECK(got.offsets[4] - got.offsets[3] == c.N);
    if (c.routing == Routing::all_experts)
      for (int e = 0; e < c.E; ++e) CHECK(got.offsets[e + 1] - got.offsets[e] == c.N);
    const Plan again = run_plan(expert, c.N, c.E, c.K);
    CHECK(again.offsets == got.offsets);
    CHECK(again.slot == got.slot);
    CHECK(again.token_of_slot == got.token_of_slot);
  }
}

TEMPLATE_TEST_CASE("moe permute, combine and unpermute match CPU loops", "[moe_dispatch]", float, bf16) {
  uint64_t seed = 800;
  for (const DispatchCase& c : kCases) check_data_movement<TestType>(c, c.N > 100 ? 40 : 200, seed += 10);
  // Every width, on a few tokens.
  const DispatchCase wide = {3, 8, 2, Routing::random, "wide"};
  for (int C : kernel_widths()) check_data_movement<TestType>(wide, C, seed += 10);
}

TEST_CASE("moe dispatch launchers refuse bad shapes", "[moe_dispatch]") {
  test::DeviceBuffer<int> i(64);
  test::DeviceBuffer<float> f(64);
  test::DeviceBuffer<bf16> b(64);
  CHECK_THROWS_WITH(moe_dispatch_plan(i, i, i, i, 4, 2, 3, nullptr),
                    Catch::Contains("moe_dispatch_plan: need 1<=K<=E; got E=2 K=3"));
  CHECK_THROWS_WITH(moe_dispatch_plan(i, i, i, i, -1, 2, 1, nullptr), Catch::Contains("need N>=0"));
  CHECK_THROWS_WITH(moe_permute<bf16>(b, b, i, 4, 12, nullptr),
                    Catch::Contains("moe_permute: need C a positive multiple of 8"));
  CHECK_THROWS_WITH(moe_combine<float>(f, f, f, i, 4, 0, 8, nullptr), Catch::Contains("K=0"));
  CHECK_THROWS_WITH(moe_unpermute_sum<float>(f, f, i, 4, 2, 6, false, nullptr), Catch::Contains("got C=6"));
}
