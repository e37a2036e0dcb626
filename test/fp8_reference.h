// fp8_reference.h — the two FP8 formats written out from their definitions (OCP 8-bit floating
// point, as cuda_fp8.h documents them), for the tests that check FP8 code against them
// (test/kernels/test_fp8.cu: the conversions; test/simt/simt_cublaslt_fp8.cpp: the cuBLASLt
// stand-in's FP8 products): a code's value from its fields, and the code a conversion should give,
// found by searching the table of codes.
#pragma once
#include "kernels/fp8.cuh"

#include <cmath>
#include <cstdint>
#include <limits>

namespace test {

// A format from its definition (OCP 8-bit floating point): field widths, bias, and whether the
// all-ones exponent is IEEE's (inf and NaNs: E5M2) or ordinary but for the one NaN mantissa (E4M3).
struct Format {
  const char* name;
  __nv_fp8_interpretation_t kind;
  int exponent_bits, mantissa_bits, bias;
  bool ieee_specials;
};
inline constexpr Format kE4M3{"E4M3", __NV_E4M3, 4, 3, 7, false};
inline constexpr Format kE5M2{"E5M2", __NV_E5M2, 5, 2, 15, true};

// The value of a code, from its sign, exponent and mantissa fields.
inline double decode(const Format& f, int code) {
  const int sign = code >> 7;
  const int exponent = (code >> f.mantissa_bits) & ((1 << f.exponent_bits) - 1);
  const int mantissa = code & ((1 << f.mantissa_bits) - 1);
  const int all_ones_exponent = (1 << f.exponent_bits) - 1, all_ones_mantissa = (1 << f.mantissa_bits) - 1;
  double magnitude;
  if (exponent == all_ones_exponent && f.ieee_specials)
    magnitude = mantissa != 0 ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  else if (exponent == all_ones_exponent && mantissa == all_ones_mantissa)
    magnitude = std::numeric_limits<double>::quiet_NaN();
  else if (exponent == 0)  // subnormal: 0.mantissa × 2^(1 - bias)
    magnitude = std::ldexp(mantissa, 1 - f.bias - f.mantissa_bits);
  else  // normal: 1.mantissa × 2^(exponent - bias)
    magnitude = std::ldexp((1 << f.mantissa_bits) + mantissa, exponent - f.bias - f.mantissa_bits);
  return sign ? -magnitude : magnitude;
}

// The largest finite positive code: the positive codes 0x00..max are finite and increasing.
inline int max_finite_code(const Format& f) { return f.ieee_specials ? 0x7B : 0x7E; }

// What converting x should give, found by searching the table: the nearer of the two finite codes
// around |x| (a tie goes to the even code), where one step past the largest finite value stands for
// overflow. Overflow saturates to the largest finite value, or without saturation gives NaN (E4M3:
// 0x7F) or inf (E5M2: 0x7C), of x's sign; NaN gives 0x7F.
inline uint8_t expected_code(const Format& f, double x, bool saturate) {
  if (std::isnan(x)) return 0x7F;
  const int sign = std::signbit(x) ? 0x80 : 0;
  const double a = std::fabs(x);
  const int max_code = max_finite_code(f);
  auto value = [&](int code) {  // codes up to max_code + 1, the step past the largest finite value
    return code <= max_code ? decode(f, code) : 2 * decode(f, max_code) - decode(f, max_code - 1);
  };
  int code = max_code + 1;  // beyond the step: overflow
  for (int c = 0; c <= max_code; ++c) {
    const double low = value(c), high = value(c + 1);
    if (a < low || a > high) continue;
    const double mid = (low + high) / 2;  // exact: both have few significant bits
    code = a < mid ? c : a > mid ? c + 1 : (c % 2 == 0 ? c : c + 1);
    break;
  }
  if (code <= max_code) return static_cast<uint8_t>(code | sign);
  if (saturate) return static_cast<uint8_t>(max_code | sign);
  return static_cast<uint8_t>((f.ieee_specials ? 0x7C : 0x7F) | sign);
}

}  // namespace test
