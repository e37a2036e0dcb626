// layernorm_forward / residual_layernorm_forward / layernorm_backward vs. double-precision
// CPU loops written here: statistics, outputs, the rounded residual (also in place), all
// three backward gradients accumulated into pre-filled buffers, odd shapes (N = 1, 3, 37; N =
// 16,411 at the parameter gradients' chunk cap; N = 1031 whose 17 partial rows and 2C = 80
// columns are not multiples of the column sum's 16 warps and 32 columns; C = 8 … 784), every
// preset's width (two rows at C = 64 … 4,096: test/preset_shapes.h) and bit-identical reruns.
// Both forwards' FP8 copy of their output (Fp8Out) against test/fp8_copy_check.h's loops, at odd
// shapes, every preset's width, and with a row of NaN inputs.
#include "test/fp8_copy_check.h"
#include "test/preset_shapes.h"
#include "test/test_util.h"
#include "kernels/layernorm.cuh"

#include <cstdint>
#include <limits>
#include <type_traits>

namespace {

struct LayerNormShape {
  int N, C;
};

// Values written to T: fp32 math on O(1) inputs (noise ~1e-6, absolute where terms cancel),
// then one rounding (bf16: within one ulp, 2^-7 relative). Statistics stay fp32 in both.
template <typename T> constexpr double kRel = std::is_same<T, float>::value ? 1e-5 : 1.0 / 128;
constexpr double kAbs = 1e-5;
constexpr double kStatRel = 1e-5;
// dweight/dbias sum up to 16,411 rows of O(1) terms in fp32: noise grows to ~1e-5 of Σ|terms|.
constexpr double kParamGradAbs = 2e-4;

struct Stats {
  std::vector<double> mean, rstd;
};

Stats reference_stats(const std::vector<float>& x, int N, int C) {
  Stats s{std::vector<double>(N), std::vector<double>(N)};
  for (int r = 0; r < N; ++r) {
    const float* row = &x[static_cast<size_t>(r) * C];
    double sum = 0, sq = 0;
    for (int c = 0; c < C; ++c) sum += row[c];
    const double m = sum / C;
    for (int c = 0; c < C; ++c) sq += (row[c] - m) * (row[c] - m);
    s.mean[r] = m;
    s.rstd[r] = 1.0 / std::sqrt(sq / C + 1e-5);
  }
  return s;
}

std::vector<double> reference_normalize(const std::vector<float>& x, const Stats& s, const std::vector<float>& w,
                                        const std::vector<float>& b, int N, int C) {
  std::vector<double> out(static_cast<size_t>(N) * C);
  for (int r = 0; r < N; ++r)
    for (int c = 0; c < C; ++c) {
      const size_t i = static_cast<size_t>(r) * C + c;
      out[i] = (x[i] - s.mean[r]) * s.rstd[r] * w[c] + b[c];
    }
  return out;
}

// Rows with a common offset, so the variance must be taken about the mean to stay accurate.
std::vector<float> layernorm_input(int N, int C, uint64_t seed) {
  std::vector<float> x = test::random_floats(static_cast<size_t>(N) * C, seed);
  for (int r = 0; r < N; ++r)
    for (int c = 0; c < C; ++c) x[static_cast<size_t>(r) * C + c] += 0.5f * (r % 7) - 1.0f;
  return x;
}

template <typename T>
struct Parameters {
  std::vector<float> weight, bias;  // values as T holds them
  Parameters(int C, uint64_t seed) {
    weight = test::random_floats(C, seed, 0.2f);
    for (float& w : weight) w += 1.0f;
    weight = test::round_to<T>(weight);
    bias = test::round_to<T>(test::random_floats(C, seed + 1, 0.2f));
  }
};

template <typename T>
void check_forward(const LayerNormShape& s, uint64_t seed) {
  INFO("N " << s.N << " C " << s.C);
  const int N = s.N, C = s.C;
  const size_t count = static_cast<size_t>(N) * C;
  const Parameters<T> p(C, seed);
  test::DeviceBuffer<T> d_weight(test::from_floats<T>(p.weight)), d_bias(test::from_floats<T>(p.bias));
  test::DeviceBuffer<T> d_out(count);
  test::DeviceBuffer<float> d_mean(N), d_rstd(N);

  // Plain LayerNorm.
  const std::vector<float> x = test::round_to<T>(layernorm_input(N, C, seed + 2));
  test::DeviceBuffer<T> d_inp(test::from_floats<T>(x));
  layernorm_forward<T>(d_out, d_mean, d_rstd, d_inp, d_weight, d_bias, N, C, nullptr);
  test::require_no_cuda_error();
  const Stats stats = reference_stats(x, N, C);
  CHECK(test::all_close("layernorm mean", d_mean.download(), stats.mean, kStatRel, kAbs));
  CHECK(test::all_close("layernorm rstd", d_rstd.download(), stats.rstd, kStatRel, kAbs));
  CHECK(test::all_close("layernorm out", d_out.download(), reference_normalize(x, stats, p.weight, p.bias, N, C),
                        kRel<T>, kAbs));

  // Residual add + LayerNorm: the residual is the fp32 sum rounded to T, and the
  // normalization sees exactly those rounded values.
  const std::vector<float> a = test::round_to<T>(layernorm_input(N, C, seed + 3));
  const std::vector<float> b = test::round_to<T>(test::random_floats(count, seed + 4));
  std::vector<T> want_residual(count);
  for (size_t i = 0; i < count; ++i) want_residual[i] = T(a[i] + b[i]);
  const std::vector<float> residual = test::to_floats(want_residual);
  const Stats rstats = reference_stats(residual, N, C);
  const std::vector<double> want_out = reference_normalize(residual, rstats, p.weight, p.bias, N, C);

  test::DeviceBuffer<T> d_a(test::from_floats<T>(a)), d_b(test::from_floats<T>(b)), d_residual(count);
  d_out.poison();
  d_mean.poison();
  d_rstd.poison();
  residual_layernorm_forward<T>(d_residual, d_out, d_mean, d_rstd, d_a, d_b, d_weight, d_bias, N, C, nullptr);
  test::require_no_cuda_error();
  CHECK(test::bytes_of(d_residual.download()) == test::bytes_of(want_residual));
  CHECK(test::all_close("residual_layernorm mean", d_mean.download(), rstats.mean, kStatRel, kAbs));
  CHECK(test::all_close("residual_layernorm rstd", d_rstd.download(), rstats.rstd, kStatRel, kAbs));
  const std::vector<T> out_first = d_out.download();
  CHECK(test::all_close("residual_layernorm out", out_first, want_out, kRel<T>, kAbs));

  // In place (residual == inp1): same bits.
  d_out.poison();
  residual_layernorm_forward<T>(d_a, d_out, d_mean, d_rstd, d_a, d_b, d_weight, d_bias, N, C, nullptr);
  test::require_no_cuda_error();
  CHECK(test::bytes_of(d_a.download()) == test::bytes_of(want_residual));
  CHECK(test::bytes_of(d_out.download()) == test::bytes_of(out_first));
}

// Both forwards with an FP8 copy of their output (test/fp8_copy_check.h). nan_row >= 0: one input of
// that row is a NaN (its outputs, codes and the amax turn NaN).
template <typename T>
void check_fp8_copy(const LayerNormShape& s, uint64_t seed, int nan_row = -1) {
  INFO("N " << s.N << " C " << s.C << " NaN row " << nan_row);
  const int N = s.N, C = s.C;
  const size_t count = static_cast<size_t>(N) * C;
  const Parameters<T> p(C, seed);
  std::vector<float> x = test::round_to<T>(layernorm_input(N, C, seed + 2));
  std::vector<float> a = test::round_to<T>(layernorm_input(N, C, seed + 3));
  const std::vector<float> b = test::round_to<T>(test::random_floats(count, seed + 4));
  if (nan_row >= 0) x[static_cast<size_t>(nan_row) * C + C / 2] = a[static_cast<size_t>(nan_row) * C] =
      std::numeric_limits<float>::quiet_NaN();
  test::DeviceBuffer<T> d_weight(test::from_floats<T>(p.weight)), d_bias(test::from_floats<T>(p.bias));
  test::DeviceBuffer<T> d_inp(test::from_floats<T>(x)), d_a(test::from_floats<T>(a)), d_b(test::from_floats<T>(b));
  test::DeviceBuffer<T> d_out(count), d_residual(count);
  test::DeviceBuffer<float> d_mean(N), d_rstd(N);
  test::check_fp8_copy<T>("layernorm_forward", d_out, N, C, [&](const Fp8Out& fp8) {
    layernorm_forward<T>(d_out, d_mean, d_rstd, d_inp, d_weight, d_bias, N, C, nullptr, fp8);
  });
  test::check_fp8_copy<T>("residual_layernorm_forward", d_out, N, C, [&](const Fp8Out& fp8) {
    residual_layernorm_forward<T>(d_residual, d_out, d_mean, d_rstd, d_a, d_b, d_weight, d_bias, N, C, nullptr, fp8);
  });
}

template <typename T>
void check_backward(const LayerNormShape& s, uint64_t seed) {
  INFO("N " << s.N << " C " << s.C);
  const int N = s.N, C = s.C;
  const size_t count = static_cast<size_t>(N) * C;
  const Parameters<T> p(C, seed);
  const std::vector<float> x = test::round_to<T>(layernorm_input(N, C, seed + 2));
  const std::vector<float> dy = test::round_to<T>(test::random_floats(count, seed + 3));
  // The saved statistics as the forward pass stores them: fp32.
  const Stats stats = reference_stats(x, N, C);
  std::vector<float> mean(N), rstd(N);
  for (int r = 0; r < N; ++r) {
    mean[r] = static_cast<float>(stats.mean[r]);
    rstd[r] = static_cast<float>(stats.rstd[r]);
  }
  // Pre-filled gradients: the kernel must add to them.
  const std::vector<T> dinp_before = test::from_floats<T>(test::random_floats(count, seed + 4));
  const std::vector<T> dweight_before = test::from_floats<T>(test::random_floats(C, seed + 5));
  const std::vector<T> dbias_before = test::from_floats<T>(test::random_floats(C, seed + 6));

  const std::vector<float> dinp_before_f = test::to_floats(dinp_before);
  const std::vector<float> dweight_before_f = test::to_floats(dweight_before);
  const std::vector<float> dbias_before_f = test::to_floats(dbias_before);
  std::vector<double> want_dinp(dinp_before_f.begin(), dinp_before_f.end());
  std::vector<double> want_dweight(dweight_before_f.begin(), dweight_before_f.end());
  std::vector<double> want_dbias(dbias_before_f.begin(), dbias_before_f.end());
  for (int r = 0; r < N; ++r) {
    const size_t row = static_cast<size_t>(r) * C;
    double sum_dnorm = 0, sum_dnorm_norm = 0;
    for (int c = 0; c < C; ++c) {
      const double norm = (x[row + c] - static_cast<double>(mean[r])) * rstd[r];
      const double dnorm = static_cast<double>(dy[row + c]) * p.weight[c];
      sum_dnorm += dnorm;
      sum_dnorm_norm += dnorm * norm;
      want_dweight[c] += dy[row + c] * norm;
      want_dbias[c] += dy[row + c];
    }
    for (int c = 0; c < C; ++c) {
      const double norm = (x[row + c] - static_cast<double>(mean[r])) * rstd[r];
      const double dnorm = static_cast<double>(dy[row + c]) * p.weight[c];
      want_dinp[row + c] += rstd[r] * (dnorm - sum_dnorm / C - norm * sum_dnorm_norm / C);
    }
  }

  test::DeviceBuffer<T> d_inp(test::from_floats<T>(x)), d_dout(test::from_floats<T>(dy));
  test::DeviceBuffer<T> d_weight(test::from_floats<T>(p.weight));
  test::DeviceBuffer<float> d_mean(mean), d_rstd(rstd);
  test::DeviceBuffer<float> d_scratch(layernorm_backward_scratch_bytes(N, C) / sizeof(float));
  test::DeviceBuffer<T> d_dinp(dinp_before), d_dweight(dweight_before), d_dbias(dbias_before);

  layernorm_backward<T>(d_dinp, d_dweight, d_dbias, d_scratch, d_dout, d_inp, d_weight, d_mean, d_rstd, N, C, nullptr);
  test::require_no_cuda_error();
  const std::vector<T> dinp_first = d_dinp.download();
  const std::vector<T> dweight_first = d_dweight.download(), dbias_first = d_dbias.download();
  CHECK(test::all_close("layernorm_backward dinp", dinp_first, want_dinp, kRel<T>, kAbs));
  CHECK(test::all_close("layernorm_backward dweight", dweight_first, want_dweight, kRel<T>, kParamGradAbs));
  CHECK(test::all_close("layernorm_backward dbias", dbias_first, want_dbias, kRel<T>, kParamGradAbs));

  // Same pre-filled gradients and a re-poisoned scratch: same bits.
  d_dinp.upload(dinp_before);
  d_dweight.upload(dweight_before);
  d_dbias.upload(dbias_before);
  d_scratch.poison();
  layernorm_backward<T>(d_dinp, d_dweight, d_dbias, d_scratch, d_dout, d_inp, d_weight, d_mean, d_rstd, N, C, nullptr);
  test::require_no_cuda_error();
  CHECK(test::bytes_of(d_dinp.download()) == test::bytes_of(dinp_first));
  CHECK(test::bytes_of(d_dweight.download()) == test::bytes_of(dweight_first));
  CHECK(test::bytes_of(d_dbias.download()) == test::bytes_of(dbias_first));
}

const LayerNormShape kShapes[] = {
    {1, 8},      // one row, one bf16 chunk
    {3, 24},     // float: 6 chunks, bf16: 3 chunks per row
    {37, 40},    // rows spread over 5 blocks, the last one partly idle
    {5, 200},    // 25 bf16 / 50 float chunks: lanes with 0, 1 and 2 chunks
    {3, 784},    // 3-7 chunks per lane; 4 (bf16) / 7 (float) column groups of the parameter
                 // gradients, the last partly idle
    {16411, 8},  // over 256 · 64 rows: the parameter gradients' 256-chunk cap, 253 chunks of 65
                 // rows, the last of 31
    {1031, 40},  // 17 chunks of 61 rows (not multiples of the 8 row-interleaved threads), the last
                 // of 55; 17 partial rows over the column sum's 16 warps, 2C = 80 columns
};

}  // namespace

// Two rows at each preset's C: the launch rules judge every kernel at the widest shape the trainer
// uses (LayerNorm is never split by tensor parallelism: full C on every rank).
TEMPLATE_TEST_CASE("layernorm forward and backward launch and match at every preset's width", "[layernorm]", float,
                   bf16) {
  uint64_t seed = 3000;
  for (const test::PresetShape& p : test::preset_shapes()) {
    INFO("presets " << p.presets);
    check_forward<TestType>({2, p.C}, seed += 10);
    check_backward<TestType>({2, p.C}, seed += 10);
    check_fp8_copy<TestType>({2, p.C}, seed += 10);
  }
}

TEMPLATE_TEST_CASE("layernorm forwards write the FP8 copy of their output and its amax", "[layernorm][fp8]", float,
                   bf16) {
  uint64_t seed = 6000;
  for (const LayerNormShape& s : kShapes)
    if (s.N < 1000) check_fp8_copy<TestType>(s, seed += 10);  // the row counts of the backward's chunks add nothing
  check_fp8_copy<TestType>({1, 8}, seed += 10, 0);
  check_fp8_copy<TestType>({37, 40}, seed += 10, 20);
}

TEST_CASE("layernorm forwards refuse an FP8 copy without its scale or aligned codes", "[layernorm][fp8]") {
  test::DeviceBuffer<bf16> buf(64);
  test::DeviceBuffer<float> stat(4);
  test::DeviceBuffer<uint8_t> codes(72);
  fp8e4m3* aligned = reinterpret_cast<fp8e4m3*>(codes.ptr);
  CHECK_THROWS_WITH(layernorm_forward<bf16>(buf, stat, stat, buf, buf, buf, 2, 16, nullptr, {aligned, nullptr, nullptr}),
                    Catch::Contains("layernorm_forward: the FP8 output has no scale"));
  CHECK_THROWS_WITH(residual_layernorm_forward<bf16>(buf, buf, stat, stat, buf, buf, buf, buf, 2, 16, nullptr,
                                                     {aligned + 4, stat, nullptr}),
                    Catch::Contains("residual_layernorm_forward: the FP8 output must be 8-byte aligned"));
  CHECK_THROWS_WITH(layernorm_forward<bf16>(buf, stat, stat, buf, buf, buf, 2, 16, nullptr, {nullptr, stat, stat}),
                    Catch::Contains("an FP8 scale or amax without the FP8 output"));
}

TEMPLATE_TEST_CASE("layernorm forward and residual forward match CPU loops", "[layernorm]", float, bf16) {
  uint64_t seed = 1000;
  for (const LayerNormShape& s : kShapes) check_forward<TestType>(s, seed += 10);
}

TEMPLATE_TEST_CASE("layernorm backward accumulates gradients matching CPU loops", "[layernorm]", float, bf16) {
  uint64_t seed = 2000;
  for (const LayerNormShape& s : kShapes) check_backward<TestType>(s, seed += 10);
}
