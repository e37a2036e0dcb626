// swiglu_forward / swiglu_backward vs. silu(a)·b and its derivative written here in double (the
// derivative itself checked by finite differences): separate buffers and the fused [a | b] layout
// (ld = 2H) with the gradient written in place over a and b, odd sizes (N = 1, 37, H = 40), every
// preset's FFN hidden size up to Llama 3.1 405B's 53,248, and bit-identical reruns.
#include "test/test_util.h"
#include "kernels/swiglu.cuh"

#include <cstdint>
#include <type_traits>

namespace {

double silu_reference(double a) { return a / (1.0 + std::exp(-a)); }

double silu_derivative_reference(double a) {
  const double sig = 1.0 / (1.0 + std::exp(-a));
  return sig + a * sig * (1.0 - sig);
}

// fp32 math, then one rounding of the result (bf16: within one ulp, 2^-7 relative; plus one ulp of
// the rounded silu(a) it multiplies).
template <typename T> constexpr double kRel = std::is_same<T, float>::value ? 1e-5 : 1.0 / 64;
constexpr double kAbs = 1e-5;

struct SwigluShape {
  int N, H, ld;
};

const SwigluShape kShapes[] = {
    {1, 8, 8},            // one bf16 chunk
    {3, 24, 48},          // fused [a | b] rows
    {37, 40, 40},         // rows and width off every power of two above 8
    {5, 200, 400},        // fused, 25 bf16 chunks per row
    {2, 8192, 16384},     // Llama 3.2 1B and 3B hidden, fused
    {2, 14336, 14336},    // Llama 3.1 8B
    {1, 28672, 57344},    // Llama 3.1 70B, fused
    {1, 53248, 106496},   // Llama 3.1 405B, fused
};

template <typename T>
void check_swiglu(const SwigluShape& s, uint64_t seed) {
  INFO("N " << s.N << " H " << s.H << " ld " << s.ld);
  const int N = s.N, H = s.H, ld = s.ld;
  const size_t dense = static_cast<size_t>(N) * H, strided = static_cast<size_t>(N) * ld;
  const bool fused = ld == 2 * H;
  // a spans silu's regions (far tails where σ saturates included); b and dout are O(1).
  std::vector<float> a = test::random_floats(strided, seed, 3.0f);
  a[0] = 0.0f;
  if (strided > 2) {
    a[1] = -20.0f;
    a[2] = 20.0f;
  }
  a = test::round_to<T>(a);
  const std::vector<float> b = test::round_to<T>(test::random_floats(strided, seed + 1));
  const std::vector<float> dy = test::round_to<T>(test::random_floats(dense, seed + 2));
  // In the fused layout one buffer holds both operands: a in columns [0, H), b in [H, 2H).
  std::vector<float> ab(strided);
  for (int r = 0; r < N; ++r)
    for (int c = 0; c < H; ++c) {
      const size_t i = static_cast<size_t>(r) * ld + c;
      ab[i] = a[i];
      if (fused) ab[i + H] = b[i];
    }

  std::vector<double> want_out(dense), want_da(dense), want_db(dense);
  for (int r = 0; r < N; ++r)
    for (int c = 0; c < H; ++c) {
      const size_t d = static_cast<size_t>(r) * H + c, i = static_cast<size_t>(r) * ld + c;
      const double silu = static_cast<float>(T(static_cast<float>(silu_reference(a[i]))));  // Meta: silu in T
      want_out[d] = silu * b[i];
      want_da[d] = dy[d] * b[i] * silu_derivative_reference(a[i]);
      want_db[d] = dy[d] * silu;
    }

  test::DeviceBuffer<T> d_ab(test::from_floats<T>(fused ? ab : a)), d_b(test::from_floats<T>(b));
  const T* pa = d_ab.ptr;
  const T* pb = fused ? d_ab.ptr + H : d_b.ptr;
  test::DeviceBuffer<T> d_out(dense), d_dout(test::from_floats<T>(dy));
  swiglu_forward<T>(d_out, pa, pb, N, H, ld, nullptr);
  test::require_no_cuda_error();
  CHECK(test::all_close("swiglu_forward", d_out.download(), want_out, kRel<T>, kAbs));

  // Gradients into separate (N, ld) buffers; only the H columns of each row are compared.
  test::DeviceBuffer<T> d_da(strided), d_db(strided);
  swiglu_backward<T>(d_da, d_db, d_dout, pa, pb, N, H, ld, nullptr);
  test::require_no_cuda_error();
  auto columns = [&](const std::vector<T>& m) {
    std::vector<T> r(dense);
    for (int row = 0; row < N; ++row)
      for (int c = 0; c < H; ++c) r[static_cast<size_t>(row) * H + c] = m[static_cast<size_t>(row) * ld + c];
    return r;
  };
  const std::vector<T> da_first = columns(d_da.download()), db_first = columns(d_db.download());
  CHECK(test::all_close("swiglu_backward da", da_first, want_da, kRel<T>, kAbs));
  CHECK(test::all_close("swiglu_backward db", db_first, want_db, kRel<T>, kAbs));

  // Rerun into re-poisoned buffers: same bits.
  d_da.poison();
  d_db.poison();
  swiglu_backward<T>(d_da, d_db, d_dout, pa, pb, N, H, ld, nullptr);
  test::require_no_cuda_error();
  CHECK(test::bytes_of(columns(d_da.download())) == test::bytes_of(da_first));
  CHECK(test::bytes_of(columns(d_db.download())) == test::bytes_of(db_first));

  // In place over the operands (the fused product's gradient overwrites it): same bits.
  T* wa = d_ab.ptr;
  T* wb = fused ? d_ab.ptr + H : d_b.ptr;
  swiglu_backward<T>(wa, wb, d_dout, wa, wb, N, H, ld, nullptr);
  test::require_no_cuda_error();
  if (fused) {
    const std::vector<T> both = d_ab.download();
    std::vector<T> got_da(dense), got_db(dense);
    for (int row = 0; row < N; ++row)
      for (int c = 0; c < H; ++c) {
        got_da[static_cast<size_t>(row) * H + c] = both[static_cast<size_t>(row) * ld + c];
        got_db[static_cast<size_t>(row) * H + c] = both[static_cast<size_t>(row) * ld + H + c];
      }
    CHECK(test::bytes_of(got_da) == test::bytes_of(da_first));
    CHECK(test::bytes_of(got_db) == test::bytes_of(db_first));
  } else {
    CHECK(test::bytes_of(columns(d_ab.download())) == test::bytes_of(da_first));
    CHECK(test::bytes_of(columns(d_b.download())) == test::bytes_of(db_first));
  }
}

}  // namespace

TEST_CASE("silu derivative reference agrees with finite differences", "[swiglu]") {
  for (double a = -12.0; a <= 12.0; a += 0.37) {
    const double h = 1e-5;
    const double numeric = (silu_reference(a + h) - silu_reference(a - h)) / (2 * h);
    INFO("a " << a);
    CHECK(std::fabs(numeric - silu_derivative_reference(a)) < 1e-8);
  }
}

TEMPLATE_TEST_CASE("swiglu forward and backward match CPU loops", "[swiglu]", float, bf16) {
  uint64_t seed = 3000;
  for (const SwigluShape& s : kShapes) check_swiglu<TestType>(s, seed += 10);
}

TEST_CASE("swiglu launchers refuse shapes without whole 128-bit chunks", "[swiglu]") {
  test::DeviceBuffer<bf16> buf(64);
  CHECK_THROWS_WITH(swiglu_forward<bf16>(buf, buf, buf, 1, 12, 12, nullptr),
                    Catch::Contains("swiglu_forward: need N>=0, H a positive multiple of 8"));
  CHECK_THROWS_WITH(swiglu_backward<bf16>(buf, buf, buf, buf, buf, 1, 8, 4, nullptr),
                    Catch::Contains("got N=1 H=8 ld=4"));
}
