// residual_forward vs. a CPU loop (the fp32 sum rounded once to T), in place on either input,
// bit-equal to the residual the fused residual LayerNorm and RMSNorm write, at odd sizes (one row
// of C = 8, T = 1) and two rows of every preset's width (test/preset_shapes.h).
#include "test/preset_shapes.h"
#include "test/test_util.h"
#include "kernels/layernorm.cuh"
#include "kernels/residual.cuh"
#include "kernels/rmsnorm.cuh"

namespace {

template <typename T>
void check_residual(int N, int C, uint64_t seed) {
  INFO("N " << N << " C " << C);
  const size_t n = static_cast<size_t>(N) * C;
  const std::vector<float> a = test::round_to<T>(test::random_floats(n, seed, 3.0f));
  const std::vector<float> b = test::round_to<T>(test::random_floats(n, seed + 1, 0.5f));
  std::vector<T> want(n);
  for (size_t i = 0; i < n; ++i) want[i] = T(a[i] + b[i]);

  test::DeviceBuffer<T> d_a(test::from_floats<T>(a)), d_b(test::from_floats<T>(b)), d_out(n);
  d_out.poison();
  residual_forward<T>(d_out, d_a, d_b, n, nullptr);
  test::require_no_cuda_error();
  CHECK(test::bytes_of(d_out.download()) == test::bytes_of(want));

  // The fused kernels' residual: the same bits (a pipeline stage's boundary equals one process).
  test::DeviceBuffer<T> fused(n), normed(n), weight(test::from_floats<T>(std::vector<float>(C, 1.0f)));
  test::DeviceBuffer<T> bias(test::from_floats<T>(std::vector<float>(C, 0.0f)));
  test::DeviceBuffer<float> mean(N), rstd(N);
  fused.poison();
  residual_layernorm_forward<T>(fused, normed, mean, rstd, d_a, d_b, weight, bias, N, C, nullptr);
  test::require_no_cuda_error();
  CHECK(test::bytes_of(fused.download()) == test::bytes_of(want));
  fused.poison();
  residual_rmsnorm_forward<T>(fused, normed, rstd, d_a, d_b, weight, N, C, 1e-5f, nullptr);
  test::require_no_cuda_error();
  CHECK(test::bytes_of(fused.download()) == test::bytes_of(want));

  // In place on either input.
  test::DeviceBuffer<T> in_place(test::from_floats<T>(a));
  residual_forward<T>(in_place, in_place, d_b, n, nullptr);
  test::require_no_cuda_error();
  CHECK(test::bytes_of(in_place.download()) == test::bytes_of(want));
  test::DeviceBuffer<T> in_place_b(test::from_floats<T>(b));
  residual_forward<T>(in_place_b, d_a, in_place_b, n, nullptr);
  test::require_no_cuda_error();
  CHECK(test::bytes_of(in_place_b.download()) == test::bytes_of(want));
}

}  // namespace

TEMPLATE_TEST_CASE("residual_forward adds in fp32 and rounds once, like the fused residual norms", "[residual]", float,
                   bf16) {
  check_residual<TestType>(1, 8, 11);
  check_residual<TestType>(3, 24, 12);
  check_residual<TestType>(7, 40, 13);
  for (const test::PresetShape& s : test::preset_shapes()) {
    INFO("presets " << s.presets);
    check_residual<TestType>(2, s.C, 14);
  }
}

TEST_CASE("residual_forward refuses a size that is not whole 128-bit vectors", "[residual]") {
  test::DeviceBuffer<float> x(8);
  CHECK_THROWS_WITH(residual_forward<float>(x, x, x, 6, nullptr), Catch::Contains("multiple of 4"));
}
