// global_norm_squared vs. a double sum of squares written here: odd sizes, starts at
// misaligned element offsets (scalar head + vector body + scalar tail), sizes large enough
// that the grid is capped and threads loop, exact integer data that exposes any element
// skipped or counted twice, accumulation (+=) into *out, and bit-identical reruns.
#include "test/test_util.h"
#include "kernels/global_norm.cuh"

#include <cstdint>

namespace {

double sum_of_squares(const std::vector<float>& v, size_t offset, size_t n) {
  double s = 0;
  for (size_t i = offset; i < offset + n; ++i) s += static_cast<double>(v[i]) * v[i];
  return s;
}

template <typename T>
float run_norm(const test::DeviceBuffer<T>& values, size_t offset, size_t n, float initial) {
  test::DeviceBuffer<float> out(std::vector<float>{initial});
  test::DeviceBuffer<float> scratch(global_norm_scratch_bytes() / sizeof(float));  // poisoned
  global_norm_squared(out.ptr, scratch.ptr, values.ptr + offset, n, nullptr);
  test::require_no_cuda_error();
  return out.download()[0];
}

bool bits_equal(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }

const size_t kSizes[] = {1, 7, 1000, 100003, 1100007};  // the last needs more than the capped grid
const size_t kOffsets[] = {0, 1, 3};                     // element offsets: 16-byte aligned and not

}  // namespace

TEMPLATE_TEST_CASE("global_norm_squared matches a double sum of squares", "[global_norm]", float, bf16) {
  for (size_t n : kSizes) {
    const std::vector<float> host = test::round_to<TestType>(test::random_floats(n + 3, n, 1.5f));
    test::DeviceBuffer<TestType> values(test::from_floats<TestType>(host));
    for (size_t offset : kOffsets) {
      INFO("n " << n << " offset " << offset);
      const float initial = 0.75f;  // *out accumulates
      const double want = initial + sum_of_squares(host, offset, n);
      const float got = run_norm(values, offset, n, initial);
      // fp32 accumulation of positive terms: relative error a small multiple of 2^-24 · depth.
      CHECK(std::fabs(got - want) <= 1e-5 * want);
      CHECK(bits_equal(run_norm(values, offset, n, initial), got));
    }
  }
}

TEMPLATE_TEST_CASE("global_norm_squared counts every element exactly once", "[global_norm]", float, bf16) {
  // Small integers whose sum of squares stays below 2^24 is exact in fp32, so a skipped or
  // doubled element (at the misaligned head, the tail, or a block boundary) changes the result.
  for (size_t n : kSizes) {
    std::vector<float> host(n + 3, 0.0f);
    for (size_t i = 0; i < host.size(); ++i)
      if (i < 40 || i + 40 >= host.size() || i % 4099 == 0) host[i] = static_cast<float>(1 + i % 7);
    test::DeviceBuffer<TestType> values(test::from_floats<TestType>(host));
    for (size_t offset : kOffsets) {
      INFO("n " << n << " offset " << offset);
      CHECK(run_norm(values, offset, n, 0.0f) == sum_of_squares(host, offset, n));
    }
  }
}

TEMPLATE_TEST_CASE("global_norm_squared adds ranges into one total", "[global_norm]", float, bf16) {
  const size_t n = 5003, split = 1237;
  const std::vector<float> host = test::round_to<TestType>(test::random_floats(n, 7, 1.0f));
  test::DeviceBuffer<TestType> values(test::from_floats<TestType>(host));
  test::DeviceBuffer<float> out(std::vector<float>{0.0f});
  test::DeviceBuffer<float> scratch(global_norm_scratch_bytes() / sizeof(float));
  global_norm_squared(out.ptr, scratch.ptr, values.ptr, split, nullptr);
  global_norm_squared(out.ptr, scratch.ptr, values.ptr + split, n - split, nullptr);
  global_norm_squared(out.ptr, scratch.ptr, values.ptr, 0, nullptr);  // an empty range adds 0
  test::require_no_cuda_error();
  const double want = sum_of_squares(host, 0, n);
  CHECK(std::fabs(out.download()[0] - want) <= 1e-5 * want);
}
