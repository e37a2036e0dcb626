// fp8_copy_check.h — the check of a producer kernel's FP8 copy of its output (kernels/fp8_cast.cuh's
// Fp8Out, written by the norms and the MLP activations), shared by their tests: its output as
// without the copy, bit for bit; every code that of the output as stored (rounded to T) times the
// scale, one fp32 multiply, found by test/fp8_reference.h's search of the E4M3 table (never the
// conversion under test); nothing written past the codes; the amax max(start, max |output|), a NaN
// when any output is one; and without an amax pointer, the same codes. Also check_fp8_cast_of, for
// the producers that write the cast of values they never write, as stored and transposed, and
// check_codes, the comparison of both layouts that it and the gradient casts' tests share.
#pragma once
#include "test/fp8_reference.h"
#include "test/test_util.h"
#include "kernels/fp8_cast.cuh"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <unordered_map>
#include <vector>

namespace test {

constexpr uint8_t kCodePoison = 0xFF;  // DeviceBuffer's fill: E4M3's NaN, which only a NaN output gives
constexpr size_t kCodeGuard = 64;      // poisoned bytes after the codes, which no write may touch

// What a cast to format f at `scale` should give: each value's code (from the table, memoized per
// fp32 product), and the amax max(start, max |value|), NaN once a value is one.
class ExpectedCodes {
 public:
  ExpectedCodes(const Format& f, float scale, float amax_start) : format_(f), scale_(scale), amax_(amax_start) {}
  uint8_t code(float x) {
    const float product = x * scale_;
    if (std::isnan(x)) nan_ = true;
    else if (std::fabs(x) > amax_) amax_ = std::fabs(x);
    uint32_t bits;
    std::memcpy(&bits, &product, sizeof(bits));
    auto it = memo_.find(bits);
    if (it == memo_.end()) it = memo_.emplace(bits, expected_code(format_, product, true)).first;
    return it->second;
  }
  // The recorded amax against the values seen.
  void check_amax(float got) const {
    INFO("amax " << got << ", want " << (nan_ ? std::numeric_limits<float>::quiet_NaN() : amax_));
    if (nan_) CHECK(std::isnan(got));
    else CHECK(same_bits(std::vector<float>{got}, std::vector<float>{amax_}));
  }

 private:
  const Format& format_;
  const float scale_;
  float amax_;
  bool nan_ = false;
  std::unordered_map<uint32_t, uint8_t> memo_;
};

// produce(fp8) runs the producer, writing `out` (rows × cols of T) and, when fp8.out is set, its copy.
template <typename T, typename Produce>
void check_fp8_copy(const char* what, DeviceBuffer<T>& out, int rows, int cols, Produce produce) {
  constexpr float kAmaxStart = 0.5f;
  const size_t n = static_cast<size_t>(rows) * cols;
  out.poison();
  produce(Fp8Out{});
  require_no_cuda_error();
  const std::vector<T> plain = out.download();

  // A scale that keeps every code in range, and one that saturates the outputs past 448 / 120.
  for (const float scale : {0.37f, 120.0f}) {
    for (const bool with_amax : {true, false}) {
      INFO(what << " " << rows << "x" << cols << " FP8 copy at scale " << scale << (with_amax ? "" : ", no amax"));
      DeviceBuffer<uint8_t> codes(n + kCodeGuard);
      DeviceBuffer<float> d_scale(std::vector<float>{scale}), amax(std::vector<float>{kAmaxStart});
      out.poison();
      produce(Fp8Out{reinterpret_cast<fp8e4m3*>(codes.ptr), d_scale.ptr, with_amax ? amax.ptr : nullptr});
      require_no_cuda_error();
      const std::vector<T> got_out = out.download();
      CHECK(bytes_of(got_out) == bytes_of(plain));

      ExpectedCodes expected(kE4M3, scale, kAmaxStart);
      const std::vector<uint8_t> got = codes.download();
      size_t bad = 0, guard_written = 0;
      for (size_t i = 0; i < n; ++i) {
        const float x = static_cast<float>(got_out[i]);
        const uint8_t want = expected.code(x);
        if (got[i] == want) continue;
        if (bad++ < 5) {
          INFO("[" << i / cols << "][" << i % cols << "] output " << x << ": code 0x" << std::hex << int{got[i]}
                   << ", want 0x" << int{want});
          CHECK(got[i] == want);
        }
      }
      for (size_t i = n; i < n + kCodeGuard; ++i) guard_written += got[i] != kCodePoison;
      INFO(bad << " of " << n << " codes wrong, " << guard_written << " guard bytes written");
      CHECK(bad == 0);
      CHECK(guard_written == 0);
      const float got_amax = amax.download()[0];
      if (with_amax) expected.check_amax(got_amax);
      else CHECK(same_bits(std::vector<float>{got_amax}, std::vector<float>{kAmaxStart}));
    }
  }
}

// The cast of `values` (rows × cols, row-major) against `expected`: every code of `transposed`
// (cols × rows) and, unless nullptr, of `stored` (rows × cols) from the table, the first few wrong
// ones reported; nothing written in the kCodeGuard poisoned bytes after either.
inline void check_codes(ExpectedCodes& expected, const std::vector<bf16>& values, int rows, int cols,
                        const std::vector<uint8_t>* stored, const std::vector<uint8_t>& transposed) {
  const size_t n = static_cast<size_t>(rows) * cols;
  size_t bad = 0, guard_written = 0;
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) {
      const size_t i = static_cast<size_t>(r) * cols + c;
      const float x = static_cast<float>(values[i]);
      const uint8_t want = expected.code(x), t = transposed[static_cast<size_t>(c) * rows + r];
      const uint8_t s = stored != nullptr ? (*stored)[i] : want;
      if (t == want && s == want) continue;
      if (bad++ < 5) {
        INFO("[" << r << "][" << c << "] value " << x << ": code 0x" << std::hex << int{s} << ", transposed 0x"
                 << int{t} << ", want 0x" << int{want});
        CHECK(false);
      }
    }
  for (size_t i = n; i < n + kCodeGuard; ++i)
    guard_written += (stored != nullptr && (*stored)[i] != kCodePoison) + (transposed[i] != kCodePoison);
  INFO(bad << " of " << n << " codes wrong, " << guard_written << " guard bytes written");
  CHECK(bad == 0);
  CHECK(guard_written == 0);
}

// A producer that writes the E4M3 cast of values it never writes (gelu_forward_fp8,
// swiglu_forward_fp8: an activation recomputed for the backward): `values` (rows × cols) is the
// output as the plain kernel writes it; produce(out, out_t, amax, scale) runs the producer with
// device codes (stored, transposed: either may be nullptr), amax and scale. Every code, both
// layouts, from the E4M3 table of value · scale (check_codes); the amax; nothing written past the
// codes, nor, without the stored layout, to it.
template <typename Produce>
void check_fp8_cast_of(const char* what, const std::vector<bf16>& values, int rows, int cols, Produce produce) {
  constexpr float kAmaxStart = 0.5f;
  const size_t n = static_cast<size_t>(rows) * cols;
  for (const float scale : {0.37f, 120.0f}) {
    for (const bool with_stored : {true, false}) {  // both, or the transposed alone (the backward's use)
      INFO(what << " " << rows << "x" << cols << " cast at scale " << scale << (with_stored ? "" : ", transposed only"));
      DeviceBuffer<uint8_t> stored(n + kCodeGuard), transposed(n + kCodeGuard);
      DeviceBuffer<float> d_scale(std::vector<float>{scale}), amax(std::vector<float>{kAmaxStart});
      produce(with_stored ? reinterpret_cast<fp8e4m3*>(stored.ptr) : nullptr, reinterpret_cast<fp8e4m3*>(transposed.ptr),
              amax.ptr, d_scale.ptr);
      require_no_cuda_error();
      const std::vector<uint8_t> got = stored.download(), got_t = transposed.download();
      ExpectedCodes expected(kE4M3, scale, kAmaxStart);
      check_codes(expected, values, rows, cols, with_stored ? &got : nullptr, got_t);
      if (!with_stored) CHECK(std::count(got.begin(), got.end(), kCodePoison) == static_cast<long>(got.size()));
      expected.check_amax(amax.download()[0]);
    }
  }
}

}  // namespace test
