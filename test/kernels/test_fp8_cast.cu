// fp8_cast and fp8_amax (kernels/fp8_cast.cuh) vs. loops written here: every expected code is
// test/fp8_reference.h's expected_code (a search of the format's table, never the conversion under
// test) of the fp32 product in·scale, the transpose is placed by index, and the amax is the largest
// |in| (a NaN when any input is one). Both formats, fp32 and bf16 inputs, scales 1, 16, 0.37 and
// one that saturates most elements, every output choice (stored, transposed, both), shapes off
// every multiple of the 32×32 tile (1×1, a single row, a single column, 130 rows: a second block of
// row tiles), outputs poisoned with guard bytes after them, values at every rounding boundary,
// NaN and ±inf inputs, the amax accumulated across calls, and the widest shapes the model casts
// (B·T = 8·1024 rows of GPT-2 d12's MLP width 3,072; two rows and a thin transpose of every
// preset's C, fused QKV and MLP widths, Llama 3.1 8B's 14,336 to 405B's 53,248).
#include "test/fp8_reference.h"
#include "test/preset_shapes.h"
#include "test/test_util.h"
#include "kernels/fp8_cast.cuh"

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <unordered_map>
#include <vector>

namespace {

template <typename F8> const test::Format& format_of() {
  return std::is_same<F8, fp8e4m3>::value ? test::kE4M3 : test::kE5M2;
}

constexpr uint8_t kPoison = 0xFF;  // DeviceBuffer's fill: a NaN code in both formats, never expected here
constexpr size_t kGuard = 64;      // poisoned bytes after each output, which no write may touch

// The code of each element's fp32 product x·scale (one float multiply, as the kernel's), memoized
// per distinct product so that the wide cases stay fast.
class ExpectedCodes {
 public:
  ExpectedCodes(const test::Format& f, float scale) : format_(f), scale_(scale) {}
  uint8_t operator()(float x) {
    const float product = x * scale_;
    uint32_t bits;
    std::memcpy(&bits, &product, sizeof(bits));
    auto it = memo_.find(bits);
    if (it == memo_.end()) it = memo_.emplace(bits, test::expected_code(format_, product, true)).first;
    return it->second;
  }

 private:
  const test::Format& format_;
  float scale_;
  std::unordered_map<uint32_t, uint8_t> memo_;
};

// max(start, max |x|), a NaN when start or any x is one.
float expected_amax(const std::vector<float>& x, float start) {
  bool nan = std::isnan(start);
  float m = start;
  for (float v : x) {
    if (std::isnan(v)) nan = true;
    else if (std::fabs(v) > m) m = std::fabs(v);
  }
  return nan ? std::numeric_limits<float>::quiet_NaN() : m;
}

void check_amax(float got, float want) {
  INFO("amax got " << got << " want " << want);
  if (std::isnan(want)) CHECK(std::isnan(got));
  else CHECK(test::same_bits(std::vector<float>{got}, std::vector<float>{want}));
}

// Bytes [0, n) equal `want` (the first mismatches reported by index), and the guard after them untouched.
void check_codes(const char* what, const std::vector<uint8_t>& got, const std::vector<uint8_t>& want, int rows,
                 int cols) {
  REQUIRE(got.size() == want.size() + kGuard);
  size_t bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (got[i] == want[i]) continue;
    if (bad++ < 5) {
      INFO(what << " " << rows << "x" << cols << " [" << i / cols << "][" << i % cols << "] got 0x" << std::hex
                << int{got[i]} << " want 0x" << int{want[i]});
      CHECK(got[i] == want[i]);
    }
  }
  INFO(what << ": " << bad << " of " << want.size() << " codes wrong");
  CHECK(bad == 0);
  size_t guard_written = 0;
  for (size_t i = want.size(); i < got.size(); ++i) guard_written += got[i] != kPoison;
  INFO(what << ": " << guard_written << " guard bytes written past the end");
  CHECK(guard_written == 0);
}

enum class Outputs { both, stored, transposed };

// One cast of x (rows, cols), already representable in T, against the loops; *amax starts at amax_start.
template <typename T, typename F8>
void check_cast(const std::vector<float>& x, int rows, int cols, float scale, Outputs outputs, float amax_start = 0.0f) {
  const test::Format& f = format_of<F8>();
  INFO(f.name << " from " << (std::is_same<T, float>::value ? "fp32" : "bf16") << ", " << rows << "x" << cols
              << ", scale " << scale << ", outputs " << static_cast<int>(outputs));
  const size_t n = static_cast<size_t>(rows) * cols;
  REQUIRE(x.size() == n);
  ExpectedCodes expected(f, scale);
  std::vector<uint8_t> want(n), want_t(n);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) {
      const uint8_t code = expected(x[static_cast<size_t>(r) * cols + c]);
      want[static_cast<size_t>(r) * cols + c] = code;
      want_t[static_cast<size_t>(c) * rows + r] = code;
    }

  test::DeviceBuffer<T> in(test::from_floats<T>(x));
  test::DeviceBuffer<uint8_t> out(n + kGuard), out_t(n + kGuard);
  test::DeviceBuffer<float> amax(std::vector<float>{amax_start}), d_scale(std::vector<float>{scale});
  F8* out_ptr = outputs == Outputs::transposed ? nullptr : reinterpret_cast<F8*>(out.ptr);
  F8* out_t_ptr = outputs == Outputs::stored ? nullptr : reinterpret_cast<F8*>(out_t.ptr);
  fp8_cast<T, F8>(out_ptr, out_t_ptr, amax, in, rows, cols, d_scale, nullptr);
  test::require_no_cuda_error();
  const std::vector<uint8_t> got = out.download(), got_t = out_t.download();
  if (out_ptr != nullptr) check_codes("out", got, want, rows, cols);
  else CHECK(test::same_bits(got, std::vector<uint8_t>(n + kGuard, kPoison)));
  if (out_t_ptr != nullptr) check_codes("out_t", got_t, want_t, cols, rows);
  else CHECK(test::same_bits(got_t, std::vector<uint8_t>(n + kGuard, kPoison)));
  check_amax(amax.download()[0], expected_amax(x, amax_start));
}

struct Shape {
  int rows, cols;
};
// Odd shapes (the scalar kernel), then whole chunks of 8 (the wide kernel): one chunk, tiles cut at
// both edges, one tile, rows or columns of one chunk, and rows not a multiple of 8 (stored output
// wide, a transpose scalar).
const Shape kShapes[] = {{1, 1},  {1, 37},   {37, 1},  {33, 31}, {31, 67},  {130, 45}, {3, 200}, {129, 33},
                         {8, 8},  {72, 40},  {64, 64}, {64, 96}, {136, 200}, {200, 8},  {8, 1608}, {37, 24}};

template <typename T, typename F8>
void check_shapes_and_scales(uint64_t seed) {
  // 1, a power of two, one that is not, and one that saturates most elements of N(0, 3) in both formats.
  for (float scale : {1.0f, 16.0f, 0.37f, 3e4f}) {
    for (const Shape& s : kShapes) {
      const std::vector<float> x =
          test::round_to<T>(test::random_floats(static_cast<size_t>(s.rows) * s.cols, seed++, 3.0f));
      for (Outputs outputs : {Outputs::both, Outputs::stored, Outputs::transposed})
        check_cast<T, F8>(x, s.rows, s.cols, scale, outputs);
    }
  }
}

// Every rounding boundary of the format: each positive code's value, the midpoint to the next code
// (and to the step past the largest finite value) with the floats just below and above it, all
// negated; then ±inf, NaN, values far past the range and below half the smallest subnormal.
std::vector<float> boundary_values(const test::Format& f) {
  std::vector<float> v;
  const int max_code = test::max_finite_code(f);
  const double step_past = 2 * test::decode(f, max_code) - test::decode(f, max_code - 1);
  for (int c = 0; c <= max_code; ++c) {
    const double low = test::decode(f, c), high = c < max_code ? test::decode(f, c + 1) : step_past;
    const float mid = static_cast<float>((low + high) / 2);
    for (float x : {static_cast<float>(low), std::nextafter(mid, -INFINITY), mid, std::nextafter(mid, INFINITY)}) {
      v.push_back(x);
      v.push_back(-x);
    }
  }
  for (float x : {std::numeric_limits<float>::infinity(), 1e30f, std::ldexp(1.0f, -30)}) {
    v.push_back(x);
    v.push_back(-x);
  }
  v.push_back(std::numeric_limits<float>::quiet_NaN());
  return v;
}

}  // namespace

TEMPLATE_TEST_CASE("fp8_cast: codes, transpose and amax at odd shapes, every scale kind and output choice", "[fp8_cast]",
                   float, bf16) {
  check_shapes_and_scales<TestType, fp8e4m3>(100);
  check_shapes_and_scales<TestType, fp8e5m2>(200);
}

TEMPLATE_TEST_CASE("fp8_cast: every rounding boundary (ties to even, once), saturation, inf and NaN", "[fp8_cast]",
                   float, bf16) {
  // The values as T holds them (bf16 keeps the codes and most midpoints, fp32 the floats beside
  // them too), laid out 7 to a row: the transpose and the tile edges see them as well. Scale 1
  // keeps the boundaries where they are; 0.37 moves them across the whole range.
  for (const test::Format* f : {&test::kE4M3, &test::kE5M2}) {
    std::vector<float> x = test::round_to<TestType>(boundary_values(*f));
    const int cols = 7;
    while (x.size() % cols != 0) x.push_back(0.0f);
    const int rows = static_cast<int>(x.size()) / cols;
    for (float scale : {1.0f, 0.37f}) {
      if (f == &test::kE4M3) check_cast<TestType, fp8e4m3>(x, rows, cols, scale, Outputs::both);
      else check_cast<TestType, fp8e5m2>(x, rows, cols, scale, Outputs::both);
    }
  }
}

TEMPLATE_TEST_CASE("fp8_cast and fp8_amax accumulate the amax across calls, of the input before the scale",
                   "[fp8_cast]", float, bf16) {
  const int rows = 45, cols = 70;
  const size_t n = static_cast<size_t>(rows) * cols;
  std::vector<float> a = test::random_floats(n, 7, 1.0f), b = test::random_floats(n, 8, 1.0f), c = a;
  a[n / 3] = -6.5f;      // a's amax
  b[n - 1] = 5.25f;      // smaller, in fp8_amax's tail (n = 3,150 is no multiple of 8)
  c[2 * n / 3] = 9.75f;  // larger
  test::DeviceBuffer<TestType> da(test::from_floats<TestType>(a)), db(test::from_floats<TestType>(b)),
      dc(test::from_floats<TestType>(c));
  test::DeviceBuffer<uint8_t> out(n);
  test::DeviceBuffer<float> amax(std::vector<float>{0.0f}), scale(std::vector<float>{0.37f});
  fp8_cast<TestType, fp8e4m3>(reinterpret_cast<fp8e4m3*>(out.ptr), nullptr, amax, da, rows, cols, scale, nullptr);
  check_amax(amax.download()[0], 6.5f);
  fp8_amax<TestType>(amax, db, n, nullptr);
  check_amax(amax.download()[0], 6.5f);
  fp8_cast<TestType, fp8e5m2>(nullptr, reinterpret_cast<fp8e5m2*>(out.ptr), amax, dc, rows, cols, scale, nullptr);
  check_amax(amax.download()[0], 9.75f);
  fp8_amax<TestType>(amax, db, n, nullptr);
  check_amax(amax.download()[0], 9.75f);
  // A NaN already there stays (the step that produced it stays visible).
  amax.upload({std::numeric_limits<float>::quiet_NaN()});
  fp8_amax<TestType>(amax, dc, n, nullptr);
  CHECK(std::isnan(amax.download()[0]));
  // An amax above the tensor's stays; without an amax pointer nothing is recorded and the codes are the same.
  check_cast<TestType, fp8e4m3>(test::round_to<TestType>(a), rows, cols, 0.37f, Outputs::both, 50.0f);
  amax.upload({1.0f});
  fp8_cast<TestType, fp8e4m3>(reinterpret_cast<fp8e4m3*>(out.ptr), nullptr, amax, da, rows, cols, scale, nullptr);
  test::DeviceBuffer<uint8_t> out_without(n);
  fp8_cast<TestType, fp8e4m3>(reinterpret_cast<fp8e4m3*>(out_without.ptr), nullptr, nullptr, da, rows, cols, scale,
                              nullptr);
  test::require_no_cuda_error();
  CHECK(test::same_bits(out_without.download(), out.download()));
  check_amax(amax.download()[0], 6.5f);
}

TEMPLATE_TEST_CASE("fp8_amax: any n, the largest magnitude anywhere (tail included), NaN and inf", "[fp8_cast]", float,
                   bf16) {
  // 2,500,003: past the grid's 1,024 blocks of 256 threads of 128-bit vectors (a grid-stride loop).
  for (size_t n : {size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{1003}, size_t{2500003}}) {
    const std::vector<float> base = test::round_to<TestType>(test::random_floats(n, n, 2.0f));
    for (size_t at : {size_t{0}, n / 2, n - 1}) {
      for (float planted : {-100.0f, 100.0f, std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN()}) {
        INFO("n " << n << " at " << at << " planted " << planted);
        std::vector<float> x = base;
        x[at] = planted;
        test::DeviceBuffer<TestType> in(test::from_floats<TestType>(x));
        test::DeviceBuffer<float> amax(std::vector<float>{0.0f});
        fp8_amax<TestType>(amax, in, n, nullptr);
        test::require_no_cuda_error();
        check_amax(amax.download()[0], expected_amax(x, 0.0f));
      }
    }
  }
}

TEST_CASE("fp8_cast at the widest shapes the model casts", "[fp8_cast]") {
  // GPT-2 d12's MLP activation at B·T = 8·1024 (the weight gradient's x^T and the forward's x).
  check_cast<bf16, fp8e4m3>(test::round_to<bf16>(test::random_floats(8192ull * 3072, 31, 3.0f)), 8192, 3072, 0.37f,
                            Outputs::both);
  // Every preset's widths: two rows of activations (C, the fused QKV, the MLP's hidden units; the
  // transpose then has two columns) and a thin slice of a weight the other way round.
  for (const test::PresetShape& s : test::preset_shapes()) {
    INFO("presets " << s.presets);
    for (int width : {s.C, s.QKV, s.H}) {
      check_cast<bf16, fp8e4m3>(test::round_to<bf16>(test::random_floats(2ull * width, width, 3.0f)), 2, width, 0.37f,
                                Outputs::both);
      check_cast<float, fp8e5m2>(test::round_to<float>(test::random_floats(3ull * width, width + 1, 3.0f)), width, 3,
                                 16.0f, Outputs::both);
    }
  }
}

TEST_CASE("fp8_cast and fp8_amax refuse what they cannot do, naming it", "[fp8_cast]") {
  test::DeviceBuffer<float> x(8), amax(1), scale(std::vector<float>{1.0f});
  test::DeviceBuffer<uint8_t> out(8);
  fp8e4m3* o = reinterpret_cast<fp8e4m3*>(out.ptr);
  CHECK_THROWS_WITH((fp8_cast<float, fp8e4m3>(o, nullptr, amax, x, -1, 8, scale, nullptr)),
                    Catch::Contains("rows=-1"));
  CHECK_THROWS_WITH((fp8_cast<float, fp8e4m3>(nullptr, nullptr, amax, x, 1, 8, scale, nullptr)),
                    Catch::Contains("no output"));
  CHECK_THROWS_WITH((fp8_cast<float, fp8e4m3>(o, nullptr, amax, x, 1, 8, nullptr, nullptr)),
                    Catch::Contains("scale is null"));
  CHECK_THROWS_WITH((fp8_cast<float, fp8e4m3>(o, nullptr, amax, x, 1, 65536 * 32, scale, nullptr)),
                    Catch::Contains("cols=2097152"));
  CHECK_THROWS_WITH(fp8_amax<float>(nullptr, x, 8, nullptr), Catch::Contains("amax is null"));
  // Empty tensors are no work: nothing written.
  fp8_cast<float, fp8e4m3>(o, o, amax, x, 0, 8, scale, nullptr);
  fp8_cast<float, fp8e4m3>(o, o, amax, x, 8, 0, scale, nullptr);
  test::require_no_cuda_error();
  CHECK(test::same_bits(out.download(), std::vector<uint8_t>(8, kPoison)));
}
