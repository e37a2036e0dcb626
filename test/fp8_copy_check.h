// fp8_copy_check.h — the check of a producer kernel's FP8 copy of its output (kernels/fp8_cast.cuh's
// Fp8Out, written by the norms and the MLP activations), shared by their tests: its output as
// without the copy, bit for bit; every code that of the output as stored (rounded to T) times the
// scale, one fp32 multiply, found by test/fp8_reference.h's search of the E4M3 table (never the
// conversion under test); nothing written past the codes; the amax max(start, max |output|), a NaN
// when any output is one; and without an amax pointer, the same codes. Also check_fp8_cast_of, for
// the producers that write the cast of values they never write, as stored and transposed.
#pragma once
#include "test/fp8_reference.h"
#include "test/test_util.h"
#include "kernels/fp8_cast.cuh"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <unordered_map>
#include <vector>

namespace test {

// produce(fp8) runs the producer, writing `out` (rows × cols of T) and, when fp8.out is set, its copy.
template <typename T, typename Produce>
void check_fp8_copy(const char* what, DeviceBuffer<T>& out, int rows, int cols, Produce produce) {
  constexpr uint8_t kPoison = 0xFF;  // DeviceBuffer's fill: E4M3's NaN, which only a NaN output gives
  constexpr size_t kGuard = 64;      // poisoned bytes after the codes, which no write may touch
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
      DeviceBuffer<uint8_t> codes(n + kGuard);
      DeviceBuffer<float> d_scale(std::vector<float>{scale}), amax(std::vector<float>{kAmaxStart});
      out.poison();
      produce(Fp8Out{reinterpret_cast<fp8e4m3*>(codes.ptr), d_scale.ptr, with_amax ? amax.ptr : nullptr});
      require_no_cuda_error();
      const std::vector<T> got_out = out.download();
      CHECK(bytes_of(got_out) == bytes_of(plain));

      std::unordered_map<uint32_t, uint8_t> memo;  // expected code per distinct fp32 product
      const std::vector<uint8_t> got = codes.download();
      size_t bad = 0, guard_written = 0;
      bool nan = false;
      float want_amax = kAmaxStart;
      for (size_t i = 0; i < n; ++i) {
        const float x = static_cast<float>(got_out[i]), product = x * scale;
        if (std::isnan(x)) nan = true;
        else if (std::fabs(x) > want_amax) want_amax = std::fabs(x);
        uint32_t bits;
        std::memcpy(&bits, &product, sizeof(bits));
        auto it = memo.find(bits);
        if (it == memo.end()) it = memo.emplace(bits, expected_code(kE4M3, product, true)).first;
        if (got[i] == it->second) continue;
        if (bad++ < 5) {
          INFO("[" << i / cols << "][" << i % cols << "] output " << x << ": code 0x" << std::hex << int{got[i]}
                   << ", want 0x" << int{it->second});
          CHECK(got[i] == it->second);
        }
      }
      for (size_t i = n; i < n + kGuard; ++i) guard_written += got[i] != kPoison;
      INFO(bad << " of " << n << " codes wrong, " << guard_written << " guard bytes written");
      CHECK(bad == 0);
      CHECK(guard_written == 0);
      const float got_amax = amax.download()[0];
      INFO("amax " << got_amax << ", want " << (nan ? std::numeric_limits<float>::quiet_NaN() : want_amax));
      if (!with_amax) CHECK(same_bits(std::vector<float>{got_amax}, std::vector<float>{kAmaxStart}));
      else if (nan) CHECK(std::isnan(got_amax));
      else CHECK(same_bits(std::vector<float>{got_amax}, std::vector<float>{want_amax}));
    }
  }
}

// A producer that writes the E4M3 cast of values it never writes (gelu_forward_fp8,
// swiglu_forward_fp8: an activation recomputed for the backward): `values` (rows × cols) is the
// output as the plain kernel writes it; produce(out, out_t, amax, scale) runs the producer with
// device codes (stored, transposed: either may be nullptr), amax and scale. Every code, both
// layouts, from the E4M3 table of value · scale; the amax; nothing written past the codes.
template <typename Produce>
void check_fp8_cast_of(const char* what, const std::vector<bf16>& values, int rows, int cols, Produce produce) {
  constexpr uint8_t kPoison = 0xFF;
  constexpr size_t kGuard = 64;
  constexpr float kAmaxStart = 0.5f;
  const size_t n = static_cast<size_t>(rows) * cols;
  for (const float scale : {0.37f, 120.0f}) {
    for (const int layouts : {3, 2}) {  // both, or the transposed alone (the backward's use)
      INFO(what << " " << rows << "x" << cols << " cast at scale " << scale << (layouts == 2 ? ", transposed only" : ""));
      DeviceBuffer<uint8_t> stored(n + kGuard), transposed(n + kGuard);
      DeviceBuffer<float> d_scale(std::vector<float>{scale}), amax(std::vector<float>{kAmaxStart});
      produce(layouts & 1 ? reinterpret_cast<fp8e4m3*>(stored.ptr) : nullptr, reinterpret_cast<fp8e4m3*>(transposed.ptr),
              amax.ptr, d_scale.ptr);
      require_no_cuda_error();
      const std::vector<uint8_t> got = stored.download(), got_t = transposed.download();
      std::unordered_map<uint32_t, uint8_t> memo;
      size_t bad = 0, guard_written = 0, stored_written = 0;
      bool nan = false;
      float want_amax = kAmaxStart;
      for (int r = 0; r < rows; ++r)
        for (int c = 0; c < cols; ++c) {
          const size_t i = static_cast<size_t>(r) * cols + c;
          const float x = static_cast<float>(values[i]), product = x * scale;
          if (std::isnan(x)) nan = true;
          else if (std::fabs(x) > want_amax) want_amax = std::fabs(x);
          uint32_t bits;
          std::memcpy(&bits, &product, sizeof(bits));
          auto it = memo.find(bits);
          if (it == memo.end()) it = memo.emplace(bits, expected_code(kE4M3, product, true)).first;
          const uint8_t t = got_t[static_cast<size_t>(c) * rows + r];
          stored_written += (layouts & 1) == 0 && got[i] != kPoison;
          if (t == it->second && ((layouts & 1) == 0 || got[i] == it->second)) continue;
          if (bad++ < 5) {
            INFO("[" << r << "][" << c << "] value " << x << ": code 0x" << std::hex << int{got[i]} << ", transposed 0x"
                     << int{t} << ", want 0x" << int{it->second});
            CHECK(false);
          }
        }
      for (size_t i = n; i < n + kGuard; ++i) guard_written += (got[i] != kPoison) + (got_t[i] != kPoison);
      INFO(bad << " of " << n << " codes wrong, " << guard_written << " guard bytes written");
      CHECK(bad == 0);
      CHECK(guard_written == 0);
      CHECK(stored_written == 0);
      const float got_amax = amax.download()[0];
      INFO("amax " << got_amax << ", want " << want_amax);
      if (nan) CHECK(std::isnan(got_amax));
      else CHECK(same_bits(std::vector<float>{got_amax}, std::vector<float>{want_amax}));
    }
  }
}

}  // namespace test
