// gelu_forward / gelu_backward vs. the tanh-approximation GELU and its derivative written
// here in double (the derivative itself checked by finite differences), separate and
// in-place backward, bit-identical reruns, and the MLP's width of every preset (two rows of 4C:
// test/preset_shapes.h). The forward's FP8 copy of its output (Fp8Out) against
// test/fp8_copy_check.h's loops, at odd sizes, every preset's width and with a NaN input; the
// same for gelu_forward_fp8 (the output's cast alone, as stored and transposed).
#include "test/fp8_copy_check.h"
#include "test/preset_shapes.h"
#include "test/test_util.h"
#include "kernels/gelu.cuh"

#include <cstdint>
#include <type_traits>

namespace {

double gelu_reference(double x) {
  const double u = std::sqrt(2.0 / std::acos(-1.0)) * (x + 0.044715 * x * x * x);
  return 0.5 * x * (1.0 + std::tanh(u));
}

double gelu_derivative_reference(double x) {
  const double k = std::sqrt(2.0 / std::acos(-1.0));
  const double t = std::tanh(k * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * x * x);
}

// float: fp32 tanhf near |t| = 1 loses a few 1e-7 absolutely in (1 ± t), scaled by |x| <= ~8.
// bf16: fp32 math, then one rounding of the result: within one bf16 ulp (2^-7 relative).
template <typename T> constexpr double kRel = std::is_same<T, float>::value ? 1e-5 : 1.0 / 128;
constexpr double kAbs = 1e-5;

template <typename T>
void check_gelu(size_t n) {
  INFO("n " << n);
  std::vector<float> x = test::random_floats(n, 100 + n, 2.5f);
  x[0] = 0.0f;
  x[1] = -7.5f;  // far tail: 1 + tanh(u) cancels
  x[2] = 7.5f;
  x = test::round_to<T>(x);
  const std::vector<float> dy = test::round_to<T>(test::random_floats(n, 200 + n));
  test::DeviceBuffer<T> inp(test::from_floats<T>(x)), out(n);

  gelu_forward<T>(out, inp, n, nullptr);
  test::require_no_cuda_error();
  std::vector<double> want(n);
  for (size_t i = 0; i < n; ++i) want[i] = gelu_reference(x[i]);
  CHECK(test::all_close("gelu_forward", out.download(), want, kRel<T>, kAbs));

  test::DeviceBuffer<T> dout(test::from_floats<T>(dy)), dinp(n);
  gelu_backward<T>(dinp, inp, dout, n, nullptr);
  test::require_no_cuda_error();
  for (size_t i = 0; i < n; ++i) want[i] = dy[i] * gelu_derivative_reference(x[i]);
  const std::vector<T> dinp_first = dinp.download();
  CHECK(test::all_close("gelu_backward", dinp_first, want, kRel<T>, kAbs));

  // Rerun into a re-poisoned buffer: same bits.
  dinp.poison();
  gelu_backward<T>(dinp, inp, dout, n, nullptr);
  test::require_no_cuda_error();
  CHECK(test::bytes_of(dinp.download()) == test::bytes_of(dinp_first));

  // In place (dinp == dout), as the MLP backward uses it: same bits as the separate output.
  gelu_backward<T>(dout, inp, dout, n, nullptr);
  test::require_no_cuda_error();
  CHECK(test::bytes_of(dout.download()) == test::bytes_of(dinp_first));
}

// The forward with an FP8 copy of its output (test/fp8_copy_check.h), as `rows` rows of n / rows;
// nan_at >= 0: that input is a NaN.
template <typename T>
void check_fp8_copy(size_t n, int rows, long nan_at = -1) {
  INFO("n " << n << " NaN at " << nan_at);
  std::vector<float> x = test::round_to<T>(test::random_floats(n, 300 + n, 4.0f));
  if (nan_at >= 0) x[static_cast<size_t>(nan_at)] = std::numeric_limits<float>::quiet_NaN();
  test::DeviceBuffer<T> inp(test::from_floats<T>(x)), out(n);
  test::check_fp8_copy<T>("gelu_forward", out, rows, static_cast<int>(n / rows),
                          [&](const Fp8Out& fp8) { gelu_forward<T>(out, inp, n, nullptr, fp8); });
  if constexpr (std::is_same<T, bf16>::value) {
    if (rows % 8 != 0) return;  // gelu_forward_fp8 takes whole chunks of 8 rows
    gelu_forward<T>(out, inp, n, nullptr);
    test::check_fp8_cast_of("gelu_forward_fp8", out.download(), rows, static_cast<int>(n / rows),
                            [&](fp8e4m3* codes, fp8e4m3* codes_t, float* amax, const float* scale) {
                              gelu_forward_fp8(codes, codes_t, amax, scale, inp, rows, static_cast<int>(n / rows), nullptr);
                            });
  }
}

}  // namespace

TEST_CASE("gelu derivative reference agrees with finite differences", "[gelu]") {
  for (double x = -6.0; x <= 6.0; x += 0.37) {
    const double h = 1e-5;
    const double numeric = (gelu_reference(x + h) - gelu_reference(x - h)) / (2 * h);
    INFO("x " << x);
    CHECK(std::fabs(numeric - gelu_derivative_reference(x)) < 1e-8);
  }
}

TEMPLATE_TEST_CASE("gelu forward and backward match CPU loops", "[gelu]", float, bf16) {
  for (size_t n : {size_t{8}, size_t{24}, size_t{40}, size_t{200}, size_t{2056}}) check_gelu<TestType>(n);
}

// The MLP's activation at each preset's width: two rows of 4C.
TEMPLATE_TEST_CASE("gelu launches and matches at every preset's width", "[gelu]", float, bf16) {
  for (const test::PresetShape& p : test::preset_shapes()) {
    INFO("presets " << p.presets);
    check_gelu<TestType>(size_t{2} * p.H);
  }
}

TEMPLATE_TEST_CASE("gelu forward writes the FP8 copy of its output and its amax", "[gelu][fp8]", float, bf16) {
  for (size_t n : {size_t{8}, size_t{24}, size_t{40}, size_t{200}, size_t{2056}}) check_fp8_copy<TestType>(n, 1);
  check_fp8_copy<TestType>(37 * 40, 37);  // more than one block, a partial last one
  check_fp8_copy<TestType>(72 * 136, 72);  // partial 64-row and 64-column tiles of the wide cast
  check_fp8_copy<TestType>(8 * 264, 8, 1500);
  for (const test::PresetShape& p : test::preset_shapes()) {
    INFO("presets " << p.presets);
    check_fp8_copy<TestType>(size_t{8} * p.H, 8);
  }
}

TEST_CASE("gelu forward refuses an FP8 copy without its scale or aligned codes", "[gelu][fp8]") {
  test::DeviceBuffer<bf16> buf(64);
  test::DeviceBuffer<float> scale(4);
  test::DeviceBuffer<uint8_t> codes(72);
  fp8e4m3* aligned = reinterpret_cast<fp8e4m3*>(codes.ptr);
  CHECK_THROWS_WITH(gelu_forward<bf16>(buf, buf, 64, nullptr, {aligned, nullptr, nullptr}),
                    Catch::Contains("gelu_forward: the FP8 output has no scale"));
  CHECK_THROWS_WITH(gelu_forward<bf16>(buf, buf, 64, nullptr, {aligned + 4, scale, nullptr}),
                    Catch::Contains("gelu_forward: the FP8 output must be 8-byte aligned"));
}
