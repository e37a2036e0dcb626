// rmsnorm_forward / residual_rmsnorm_forward / rmsnorm_backward vs. double-precision CPU loops
// written here from Meta's RMSNorm (x·rsqrt(mean(x²) + eps) in fp32, cast to T, times the weight):
// rstd, outputs (also bit for bit against PyTorch's arithmetic given the kernel's rstd), the
// rounded residual (also in place), both backward gradients accumulated into
// pre-filled buffers, rows of small values where eps dominates the statistic, odd shapes (N = 1,
// 3, 37; C = 8 … 200; N = 1031 and 9001, whose weight-gradient row groups end part-full), every
// preset's model width up to Llama 3.1 405B's C = 16384, and bit-identical reruns. The backward
// formula itself is checked by finite differences. Both forwards' FP8 copy of their output
// (Fp8Out) against test/fp8_copy_check.h's loops, at odd shapes, Llama's widths, and with a row of
// NaN inputs.
#include "test/fp8_copy_check.h"
#include "test/test_util.h"
#include "kernels/rmsnorm.cuh"

#include <cstdint>
#include <limits>
#include <type_traits>

namespace {

constexpr float kEps = 1e-5f;  // Llama 3's norm_eps

struct RmsNormShape {
  int N, C;
};

// Values written to T: fp32 math on O(1) inputs, then the roundings (bf16: the normalized value
// and the product each within one ulp, 2^-7 relative together up to 2^-6).
template <typename T> constexpr double kRel = std::is_same<T, float>::value ? 1e-5 : 1.0 / 64;
constexpr double kAbs = 1e-5;
constexpr double kStatRel = 1e-5;
// dweight sums up to 9001 rows of O(1) terms in fp32: noise grows to ~1e-5 of Σ|terms|.
constexpr double kParamGradAbs = 5e-4;

std::vector<double> reference_rstd(const std::vector<float>& x, int N, int C) {
  std::vector<double> rstd(N);
  for (int r = 0; r < N; ++r) {
    double sq = 0;
    for (int c = 0; c < C; ++c) {
      const double v = x[static_cast<size_t>(r) * C + c];
      sq += v * v;
    }
    rstd[r] = 1.0 / std::sqrt(sq / C + kEps);
  }
  return rstd;
}

// Meta's order: the normalized value rounded to T, then times the weight.
template <typename T>
std::vector<double> reference_normalize(const std::vector<float>& x, const std::vector<double>& rstd,
                                        const std::vector<float>& w, int N, int C) {
  std::vector<double> out(static_cast<size_t>(N) * C);
  for (int r = 0; r < N; ++r)
    for (int c = 0; c < C; ++c) {
      const size_t i = static_cast<size_t>(r) * C + c;
      out[i] = static_cast<double>(static_cast<float>(T(static_cast<float>(x[i] * rstd[r])))) * w[c];
    }
  return out;
}

// Every third row scaled to ~1e-3, so mean(x²) ~ 1e-6 is below eps and eps's place matters.
std::vector<float> rmsnorm_input(int N, int C, uint64_t seed) {
  std::vector<float> x = test::random_floats(static_cast<size_t>(N) * C, seed);
  for (int r = 0; r < N; ++r)
    if (r % 3 == 1)
      for (int c = 0; c < C; ++c) x[static_cast<size_t>(r) * C + c] *= 1e-3f;
  return x;
}

// PyTorch's arithmetic for Meta's `self._norm(x.float()).type_as(x) * self.weight`, given the
// kernel's own fp32 rstd: one fp32 product rounded to T, then T times T (exact in fp32) rounded
// to T. Bit-exact, so it pins the order (cast, then weight) that tolerances cannot see.
template <typename T>
std::vector<T> meta_normalize(const std::vector<float>& x, const std::vector<float>& rstd, const std::vector<float>& w,
                              int N, int C) {
  std::vector<T> out(static_cast<size_t>(N) * C);
  for (int r = 0; r < N; ++r)
    for (int c = 0; c < C; ++c) {
      const size_t i = static_cast<size_t>(r) * C + c;
      const float normalized = static_cast<float>(T(x[i] * rstd[r]));
      out[i] = T(normalized * w[c]);
    }
  return out;
}

template <typename T>
std::vector<float> rmsnorm_weight(int C, uint64_t seed) {
  std::vector<float> w = test::random_floats(C, seed, 0.2f);
  for (float& v : w) v += 1.0f;
  return test::round_to<T>(w);
}

// Adds the gradients of y = n·w, n = x·r, r = (mean(x²) + eps)^(-1/2), given dy, to dinp and
// dweight: dn = dy·w and dr/dx_c = −r³·x_c/C, so dx_c = r·dn_c − r³·x_c·Σ(dn·x)/C; dw_c = Σ_rows
// dy·stored(n), stored() being what the forward pass keeps of n (rounded to T).
template <typename Stored>
void reference_backward(const std::vector<float>& x, const std::vector<float>& dy, const std::vector<float>& w,
                        const std::vector<double>& rstd, int N, int C, Stored stored, std::vector<double>& dinp,
                        std::vector<double>& dweight) {
  for (int r = 0; r < N; ++r) {
    const size_t row = static_cast<size_t>(r) * C;
    const double rs = rstd[r];
    double dot = 0;
    for (int c = 0; c < C; ++c) dot += static_cast<double>(dy[row + c]) * w[c] * x[row + c];
    for (int c = 0; c < C; ++c) {
      dinp[row + c] += rs * dy[row + c] * w[c] - rs * rs * rs * x[row + c] * dot / C;
      dweight[c] += dy[row + c] * stored(x[row + c] * rs);
    }
  }
}

template <typename T>
void check_forward(const RmsNormShape& s, uint64_t seed) {
  INFO("N " << s.N << " C " << s.C);
  const int N = s.N, C = s.C;
  const size_t count = static_cast<size_t>(N) * C;
  const std::vector<float> w = rmsnorm_weight<T>(C, seed);
  test::DeviceBuffer<T> d_weight(test::from_floats<T>(w)), d_out(count);
  test::DeviceBuffer<float> d_rstd(N);

  // Plain RMSNorm.
  const std::vector<float> x = test::round_to<T>(rmsnorm_input(N, C, seed + 1));
  test::DeviceBuffer<T> d_inp(test::from_floats<T>(x));
  rmsnorm_forward<T>(d_out, d_rstd, d_inp, d_weight, N, C, kEps, nullptr);
  test::require_no_cuda_error();
  const std::vector<double> rstd = reference_rstd(x, N, C);
  CHECK(test::all_close("rmsnorm rstd", d_rstd.download(), rstd, kStatRel, kAbs));
  CHECK(test::all_close("rmsnorm out", d_out.download(), reference_normalize<T>(x, rstd, w, N, C), kRel<T>, kAbs));
  CHECK(test::bytes_of(d_out.download()) == test::bytes_of(meta_normalize<T>(x, d_rstd.download(), w, N, C)));

  // Residual add + RMSNorm: the residual is the fp32 sum rounded to T, and the normalization sees
  // exactly those rounded values.
  const std::vector<float> a = test::round_to<T>(rmsnorm_input(N, C, seed + 2));
  std::vector<float> b = test::round_to<T>(test::random_floats(count, seed + 3));
  for (int r = 1; r < N; r += 3)  // keep the small rows small
    for (int c = 0; c < C; ++c) b[static_cast<size_t>(r) * C + c] = a[static_cast<size_t>(r) * C + c];
  std::vector<T> want_residual(count);
  for (size_t i = 0; i < count; ++i) want_residual[i] = T(a[i] + b[i]);
  const std::vector<float> residual = test::to_floats(want_residual);
  const std::vector<double> rrstd = reference_rstd(residual, N, C);

  test::DeviceBuffer<T> d_a(test::from_floats<T>(a)), d_b(test::from_floats<T>(b)), d_residual(count);
  d_out.poison();
  d_rstd.poison();
  residual_rmsnorm_forward<T>(d_residual, d_out, d_rstd, d_a, d_b, d_weight, N, C, kEps, nullptr);
  test::require_no_cuda_error();
  CHECK(test::bytes_of(d_residual.download()) == test::bytes_of(want_residual));
  CHECK(test::all_close("residual_rmsnorm rstd", d_rstd.download(), rrstd, kStatRel, kAbs));
  const std::vector<T> out_first = d_out.download();
  CHECK(test::all_close("residual_rmsnorm out", out_first, reference_normalize<T>(residual, rrstd, w, N, C), kRel<T>,
                        kAbs));
  CHECK(test::bytes_of(out_first) == test::bytes_of(meta_normalize<T>(residual, d_rstd.download(), w, N, C)));

  // In place (residual == inp1): same bits.
  d_out.poison();
  residual_rmsnorm_forward<T>(d_a, d_out, d_rstd, d_a, d_b, d_weight, N, C, kEps, nullptr);
  test::require_no_cuda_error();
  CHECK(test::bytes_of(d_a.download()) == test::bytes_of(want_residual));
  CHECK(test::bytes_of(d_out.download()) == test::bytes_of(out_first));
}

// Both forwards with an FP8 copy of their output (test/fp8_copy_check.h). nan_row >= 0: one input of
// that row is a NaN (its outputs, codes and the amax turn NaN).
template <typename T>
void check_fp8_copy(const RmsNormShape& s, uint64_t seed, int nan_row = -1) {
  INFO("N " << s.N << " C " << s.C << " NaN row " << nan_row);
  const int N = s.N, C = s.C;
  const size_t count = static_cast<size_t>(N) * C;
  const std::vector<float> w = rmsnorm_weight<T>(C, seed);
  std::vector<float> x = test::round_to<T>(rmsnorm_input(N, C, seed + 1));
  std::vector<float> a = test::round_to<T>(rmsnorm_input(N, C, seed + 2));
  const std::vector<float> b = test::round_to<T>(test::random_floats(count, seed + 3));
  if (nan_row >= 0) x[static_cast<size_t>(nan_row) * C + C - 1] = a[static_cast<size_t>(nan_row) * C + 1] =
      std::numeric_limits<float>::quiet_NaN();
  test::DeviceBuffer<T> d_weight(test::from_floats<T>(w)), d_inp(test::from_floats<T>(x));
  test::DeviceBuffer<T> d_a(test::from_floats<T>(a)), d_b(test::from_floats<T>(b)), d_out(count), d_residual(count);
  test::DeviceBuffer<float> d_rstd(N);
  test::check_fp8_copy<T>("rmsnorm_forward", d_out, N, C, [&](const Fp8Out& fp8) {
    rmsnorm_forward<T>(d_out, d_rstd, d_inp, d_weight, N, C, kEps, nullptr, fp8);
  });
  test::check_fp8_copy<T>("residual_rmsnorm_forward", d_out, N, C, [&](const Fp8Out& fp8) {
    residual_rmsnorm_forward<T>(d_residual, d_out, d_rstd, d_a, d_b, d_weight, N, C, kEps, nullptr, fp8);
  });
}

template <typename T>
void check_backward(const RmsNormShape& s, uint64_t seed) {
  INFO("N " << s.N << " C " << s.C);
  const int N = s.N, C = s.C;
  const size_t count = static_cast<size_t>(N) * C;
  const std::vector<float> w = rmsnorm_weight<T>(C, seed);
  const std::vector<float> x = test::round_to<T>(rmsnorm_input(N, C, seed + 1));
  const std::vector<float> dy = test::round_to<T>(test::random_floats(count, seed + 2));
  // The saved statistic as the forward pass stores it: fp32.
  const std::vector<double> rstd_exact = reference_rstd(x, N, C);
  std::vector<float> rstd(N);
  for (int r = 0; r < N; ++r) rstd[r] = static_cast<float>(rstd_exact[r]);
  // Pre-filled gradients: the kernel must add to them.
  const std::vector<T> dinp_before = test::from_floats<T>(test::random_floats(count, seed + 3));
  const std::vector<T> dweight_before = test::from_floats<T>(test::random_floats(C, seed + 4));

  const std::vector<float> dinp_before_f = test::to_floats(dinp_before);
  const std::vector<float> dweight_before_f = test::to_floats(dweight_before);
  std::vector<double> want_dinp(dinp_before_f.begin(), dinp_before_f.end());
  std::vector<double> want_dweight(dweight_before_f.begin(), dweight_before_f.end());
  const std::vector<double> stored_rstd(rstd.begin(), rstd.end());
  reference_backward(x, dy, w, stored_rstd, N, C, [](double n) { return static_cast<float>(T(static_cast<float>(n))); },
                     want_dinp, want_dweight);

  test::DeviceBuffer<T> d_inp(test::from_floats<T>(x)), d_dout(test::from_floats<T>(dy));
  test::DeviceBuffer<T> d_weight(test::from_floats<T>(w));
  test::DeviceBuffer<float> d_rstd(rstd);
  test::DeviceBuffer<float> d_scratch(rmsnorm_backward_scratch_bytes(N, C) / sizeof(float));
  test::DeviceBuffer<T> d_dinp(dinp_before), d_dweight(dweight_before);

  rmsnorm_backward<T>(d_dinp, d_dweight, d_scratch, d_dout, d_inp, d_weight, d_rstd, N, C, nullptr);
  test::require_no_cuda_error();
  const std::vector<T> dinp_first = d_dinp.download(), dweight_first = d_dweight.download();
  CHECK(test::all_close("rmsnorm_backward dinp", dinp_first, want_dinp, kRel<T>, kAbs));
  CHECK(test::all_close("rmsnorm_backward dweight", dweight_first, want_dweight, kRel<T>, kParamGradAbs));

  // Same pre-filled gradients and a re-poisoned scratch: same bits.
  d_dinp.upload(dinp_before);
  d_dweight.upload(dweight_before);
  d_scratch.poison();
  rmsnorm_backward<T>(d_dinp, d_dweight, d_scratch, d_dout, d_inp, d_weight, d_rstd, N, C, nullptr);
  test::require_no_cuda_error();
  CHECK(test::bytes_of(d_dinp.download()) == test::bytes_of(dinp_first));
  CHECK(test::bytes_of(d_dweight.download()) == test::bytes_of(dweight_first));
}

const RmsNormShape kShapes[] = {
    {1, 8},      // one row, one bf16 chunk
    {3, 24},     // float: 6 chunks, bf16: 3 chunks per row
    {37, 40},    // rows spread over 5 blocks, the last one partly idle
    {5, 200},    // 25 bf16 / 50 float chunks: lanes with 0, 1 and 2 chunks
    {1031, 40},  // 33 weight-gradient row groups of 32 rows, the last with 7
    {9001, 8},   // past 256 groups: 36 rows each, the last with 1
    {2, 2048},   // Llama 3.2 1B
    {2, 3072},   // Llama 3.2 3B
    {2, 4096},   // Llama 3.1 8B
    {1, 8192},   // Llama 3.1 70B
    {2, 16384},  // Llama 3.1 405B
};

}  // namespace

TEST_CASE("rmsnorm backward reference agrees with finite differences", "[rmsnorm]") {
  // loss = Σ dy·y over 2 rows of 8, one of them small enough for eps to matter; central differences.
  const int N = 2, C = 8;
  const std::vector<float> x = rmsnorm_input(N, C, 7), dy = test::random_floats(N * C, 8);
  const std::vector<float> w = rmsnorm_weight<float>(C, 9);
  auto loss = [&](const std::vector<float>& xs, const std::vector<float>& ws) {
    const std::vector<double> rstd = reference_rstd(xs, N, C);
    double sum = 0;
    for (int r = 0; r < N; ++r)
      for (int c = 0; c < C; ++c) sum += dy[r * C + c] * xs[r * C + c] * rstd[r] * ws[c];
    return sum;
  };
  std::vector<double> dinp(N * C, 0.0), dweight(C, 0.0);
  reference_backward(x, dy, w, reference_rstd(x, N, C), N, C, [](double n) { return n; }, dinp, dweight);
  for (int i = 0; i < N * C; ++i) {
    const float h = 1e-3f * std::max(std::fabs(x[i]), 1e-3f);
    std::vector<float> up = x, down = x;
    up[i] += h;
    down[i] -= h;
    const double numeric = (loss(up, w) - loss(down, w)) / (static_cast<double>(up[i]) - down[i]);
    INFO("x[" << i << "]");
    CHECK(std::fabs(numeric - dinp[i]) <= 1e-4 * std::max(1.0, std::fabs(dinp[i])));
  }
  for (int c = 0; c < C; ++c) {
    std::vector<float> up = w, down = w;
    up[c] += 1e-3f;
    down[c] -= 1e-3f;
    const double numeric = (loss(x, up) - loss(x, down)) / (static_cast<double>(up[c]) - down[c]);
    INFO("w[" << c << "]");
    CHECK(std::fabs(numeric - dweight[c]) <= 1e-6 * std::max(1.0, std::fabs(dweight[c])));
  }
}

TEMPLATE_TEST_CASE("rmsnorm forward and residual forward match CPU loops", "[rmsnorm]", float, bf16) {
  uint64_t seed = 4000;
  for (const RmsNormShape& s : kShapes) check_forward<TestType>(s, seed += 10);
}

TEMPLATE_TEST_CASE("rmsnorm backward accumulates gradients matching CPU loops", "[rmsnorm]", float, bf16) {
  uint64_t seed = 5000;
  for (const RmsNormShape& s : kShapes) check_backward<TestType>(s, seed += 10);
}

TEMPLATE_TEST_CASE("rmsnorm forwards write the FP8 copy of their output and its amax", "[rmsnorm][fp8]", float, bf16) {
  uint64_t seed = 6000;
  for (const RmsNormShape& s : kShapes)
    if (s.N < 1000) check_fp8_copy<TestType>(s, seed += 10);  // the row counts of the backward's groups add nothing
  check_fp8_copy<TestType>({1, 8}, seed += 10, 0);
  check_fp8_copy<TestType>({37, 40}, seed += 10, 36);
}

TEST_CASE("rmsnorm forwards refuse an FP8 copy without its scale or aligned codes", "[rmsnorm][fp8]") {
  test::DeviceBuffer<bf16> buf(64);
  test::DeviceBuffer<float> stat(4);
  test::DeviceBuffer<uint8_t> codes(72);
  fp8e4m3* aligned = reinterpret_cast<fp8e4m3*>(codes.ptr);
  CHECK_THROWS_WITH(rmsnorm_forward<bf16>(buf, stat, buf, buf, 2, 16, kEps, nullptr, {aligned, nullptr, nullptr}),
                    Catch::Contains("rmsnorm_forward: the FP8 output has no scale"));
  CHECK_THROWS_WITH(residual_rmsnorm_forward<bf16>(buf, buf, stat, buf, buf, buf, 2, 16, kEps, nullptr,
                                                   {aligned + 2, stat, nullptr}),
                    Catch::Contains("residual_rmsnorm_forward: the FP8 output must be 8-byte aligned"));
  CHECK_THROWS_WITH(rmsnorm_forward<bf16>(buf, stat, buf, buf, 2, 16, kEps, nullptr, {nullptr, nullptr, stat}),
                    Catch::Contains("an FP8 scale or amax without the FP8 output"));
}

TEST_CASE("rmsnorm launchers refuse widths without whole 128-bit chunks", "[rmsnorm]") {
  test::DeviceBuffer<bf16> buf(64);
  test::DeviceBuffer<float> stat(4);
  CHECK_THROWS_WITH(rmsnorm_forward<bf16>(buf, stat, buf, buf, 2, 12, kEps, nullptr),
                    Catch::Contains("rmsnorm_forward: need N>=1 and C a positive multiple of 8"));
  CHECK_THROWS_WITH(rmsnorm_backward<bf16>(buf, buf, stat, buf, buf, buf, stat, 0, 8, nullptr),
                    Catch::Contains("got N=0 C=8"));
}
