// swiglu_forward / swiglu_backward vs. silu(a)·b and its derivative written here in double (the
// derivative itself checked by finite differences): separate buffers and the fused [a | b] layout
// (ld = 2H) with the gradient written in place over a and b, odd sizes (N = 1, 37, H = 40), every
// preset's FFN hidden size up to Llama 3.1 405B's 53,248, and bit-identical reruns. The forward's
// FP8 copy of its output (Fp8Out) against test/fp8_copy_check.h's loops, at the same shapes and
// with a NaN input. swiglu_backward_fp8: swiglu_backward's outputs cast to E5M2 as stored and
// transposed, each code found by test/fp8_reference.h's search of the E5M2 table, the amaxes, and
// nothing written past the codes, at partial tiles, every Llama width and with a NaN. Also
// swiglu_forward_fp8, the forward's output cast without the output (test/fp8_copy_check.h).
#include "test/fp8_copy_check.h"
#include "test/fp8_reference.h"
#include "test/test_util.h"
#include "kernels/swiglu.cuh"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

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

// The forward with an FP8 copy of its (N, H) output (test/fp8_copy_check.h); nan: one of a's
// inputs is a NaN.
template <typename T>
void check_fp8_copy(const SwigluShape& s, uint64_t seed, bool nan = false) {
  INFO("N " << s.N << " H " << s.H << " ld " << s.ld << (nan ? " with a NaN" : ""));
  const size_t strided = static_cast<size_t>(s.N) * s.ld;
  std::vector<float> a = test::round_to<T>(test::random_floats(strided, seed, 6.0f));
  const std::vector<float> b = test::round_to<T>(test::random_floats(strided, seed + 1, 3.0f));
  if (nan) a[strided / 2 - strided / 2 % s.ld] = std::numeric_limits<float>::quiet_NaN();
  test::DeviceBuffer<T> d_a(test::from_floats<T>(a)), d_b(test::from_floats<T>(b));
  test::DeviceBuffer<T> out(static_cast<size_t>(s.N) * s.H);
  test::check_fp8_copy<T>("swiglu_forward", out, s.N, s.H, [&](const Fp8Out& fp8) {
    swiglu_forward<T>(out, d_a, d_b, s.N, s.H, s.ld, nullptr, fp8);
  });
}

// swiglu_forward_fp8 (the output's cast alone, as stored and transposed) on (N, H) contiguous a and
// b, against swiglu_forward's output (test/fp8_copy_check.h); nan: one of a's inputs is a NaN.
void check_fp8_cast(int N, int H, uint64_t seed, bool nan = false) {
  INFO("N " << N << " H " << H << (nan ? " with a NaN" : ""));
  const size_t n = static_cast<size_t>(N) * H;
  std::vector<float> a = test::round_to<bf16>(test::random_floats(n, seed, 6.0f));
  const std::vector<float> b = test::round_to<bf16>(test::random_floats(n, seed + 1, 3.0f));
  if (nan) a[n / 2] = std::numeric_limits<float>::quiet_NaN();
  test::DeviceBuffer<bf16> d_a(test::from_floats<bf16>(a)), d_b(test::from_floats<bf16>(b)), out(n);
  swiglu_forward<bf16>(out, d_a, d_b, N, H, H, nullptr);
  test::check_fp8_cast_of("swiglu_forward_fp8", out.download(), N, H,
                          [&](fp8e4m3* codes, fp8e4m3* codes_t, float* amax, const float* scale) {
                            swiglu_forward_fp8(codes, codes_t, amax, scale, d_a, d_b, N, H, nullptr);
                          });
}

// swiglu_backward_fp8 on a, b, dout (N, H) against swiglu_backward's da and db (checked above
// against the double-precision loops): every code, as stored and transposed, that of the bf16
// gradient times its scale (one fp32 multiply) in the E5M2 table; the amaxes max(start, max |g|),
// NaN when a gradient is; nothing written past the codes. nan: one of dout's values is a NaN.
void check_fp8_gradients(int N, int H, uint64_t seed, bool nan = false) {
  INFO("N " << N << " H " << H << (nan ? " with a NaN" : ""));
  constexpr float kAmaxStart = 0.25f;
  const size_t n = static_cast<size_t>(N) * H;
  const std::vector<float> a = test::round_to<bf16>(test::random_floats(n, seed, 6.0f));
  const std::vector<float> b = test::round_to<bf16>(test::random_floats(n, seed + 1, 3.0f));
  std::vector<float> dy = test::round_to<bf16>(test::random_floats(n, seed + 2, 40.0f));
  if (nan) dy[n / 2] = std::numeric_limits<float>::quiet_NaN();
  test::DeviceBuffer<bf16> d_a(test::from_floats<bf16>(a)), d_b(test::from_floats<bf16>(b)),
      d_dy(test::from_floats<bf16>(dy)), da(n), db(n);
  swiglu_backward<bf16>(da, db, d_dy, d_a, d_b, N, H, H, nullptr);
  test::require_no_cuda_error();
  const std::vector<bf16> grads[2] = {da.download(), db.download()};
  for (const float scale_a : {0.5f, 3000.0f}) {  // in range; past E5M2's 57344 for the largest
    const float scales[2] = {scale_a, scale_a * 3.0f};
    INFO("scales " << scales[0] << ", " << scales[1]);
    // da's codes as stored and transposed, then db's.
    test::DeviceBuffer<uint8_t> codes[4] = {
        test::DeviceBuffer<uint8_t>(n + test::kCodeGuard), test::DeviceBuffer<uint8_t>(n + test::kCodeGuard),
        test::DeviceBuffer<uint8_t>(n + test::kCodeGuard), test::DeviceBuffer<uint8_t>(n + test::kCodeGuard)};
    test::DeviceBuffer<float> d_scales(std::vector<float>{scales[0], scales[1]});
    test::DeviceBuffer<float> amaxes[2] = {test::DeviceBuffer<float>(std::vector<float>{kAmaxStart}),
                                           test::DeviceBuffer<float>(std::vector<float>{kAmaxStart})};
    auto f8 = [&](int k) { return reinterpret_cast<fp8e5m2*>(codes[k].ptr); };
    swiglu_backward_fp8(f8(0), f8(1), amaxes[0], d_scales.ptr, f8(2), f8(3), amaxes[1], d_scales.ptr + 1, d_dy, d_a,
                        d_b, N, H, nullptr);
    test::require_no_cuda_error();
    for (int g = 0; g < 2; ++g) {
      INFO((g == 0 ? "da" : "db"));
      test::ExpectedCodes expected(test::kE5M2, scales[g], kAmaxStart);
      const std::vector<uint8_t> stored = codes[2 * g].download();
      test::check_codes(expected, grads[g], N, H, &stored, codes[2 * g + 1].download());
      expected.check_amax(amaxes[g].download()[0]);
    }
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

TEMPLATE_TEST_CASE("swiglu forward writes the FP8 copy of its output and its amax", "[swiglu][fp8]", float, bf16) {
  uint64_t seed = 5000;
  for (const SwigluShape& s : kShapes) check_fp8_copy<TestType>(s, seed += 10);
  check_fp8_copy<TestType>({37, 40, 40}, seed += 10, true);
}

TEST_CASE("swiglu forward refuses an FP8 copy without its scale or aligned codes", "[swiglu][fp8]") {
  test::DeviceBuffer<bf16> buf(64);
  test::DeviceBuffer<float> scale(4);
  test::DeviceBuffer<uint8_t> codes(72);
  fp8e4m3* aligned = reinterpret_cast<fp8e4m3*>(codes.ptr);
  CHECK_THROWS_WITH(swiglu_forward<bf16>(buf, buf, buf, 2, 32, 32, nullptr, {aligned, nullptr, nullptr}),
                    Catch::Contains("swiglu_forward: the FP8 output has no scale"));
  CHECK_THROWS_WITH(swiglu_forward<bf16>(buf, buf, buf, 2, 32, 32, nullptr, {aligned + 4, scale, nullptr}),
                    Catch::Contains("swiglu_forward: the FP8 output must be 8-byte aligned"));
}

TEST_CASE("swiglu backward casts its gradients to E5M2 as stored and transposed", "[swiglu][fp8]") {
  uint64_t seed = 7000;
  for (const auto& [N, H] : std::vector<std::pair<int, int>>{{8, 8}, {24, 40}, {72, 136}, {136, 200}, {8, 8192},
                                                            {8, 14336}, {8, 28672}, {8, 53248}})
    check_fp8_gradients(N, H, seed += 10);
  check_fp8_gradients(40, 72, seed += 10, true);
}

TEST_CASE("swiglu backward's FP8 casts refuse partial chunks, a missing scale or codes", "[swiglu][fp8]") {
  test::DeviceBuffer<bf16> buf(256);
  test::DeviceBuffer<float> scale(4);
  test::DeviceBuffer<uint8_t> codes(512);
  fp8e5m2* c = reinterpret_cast<fp8e5m2*>(codes.ptr);
  CHECK_THROWS_WITH(swiglu_backward_fp8(c, c, nullptr, scale, c, c, nullptr, scale, buf, buf, buf, 12, 8, nullptr),
                    Catch::Contains("swiglu_backward_fp8: N=12 H=8 must be multiples of 8"));
  CHECK_THROWS_WITH(swiglu_backward_fp8(c, c, nullptr, nullptr, c, c, nullptr, scale, buf, buf, buf, 8, 8, nullptr),
                    Catch::Contains("a scale is null"));
  CHECK_THROWS_WITH(swiglu_backward_fp8(c, nullptr, nullptr, scale, c, c, nullptr, scale, buf, buf, buf, 8, 8, nullptr),
                    Catch::Contains("the codes must be given and 8-byte aligned"));
  CHECK_THROWS_WITH(swiglu_backward_fp8(c, c, nullptr, scale, c, c, nullptr, scale, buf, buf.ptr + 1, buf, 8, 8, nullptr),
                    Catch::Contains("the inputs must be 16-byte aligned"));
}

TEST_CASE("swiglu_forward_fp8 casts the output it does not write, as stored and transposed", "[swiglu][fp8]") {
  uint64_t seed = 8000;
  for (const auto& [N, H] : std::vector<std::pair<int, int>>{{8, 8}, {72, 136}, {136, 200}, {8, 8192}, {8, 53248}})
    check_fp8_cast(N, H, seed += 10);
  check_fp8_cast(40, 72, seed += 10, true);
}
