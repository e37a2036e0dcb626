// FP8 conversions (kernels/fp8.cuh: cuda_fp8.h's __nv_fp8_e4m3 and __nv_fp8_e5m2) against the two
// formats as test/fp8_reference.h writes them out from their definitions: all 256 codes of each format decoded; and encoded
// from every code's exact value, from each midpoint between neighbouring codes and the floats just
// above and below it (ties to even), from beyond the largest finite value (saturated, or NaN / inf
// without saturation), through the subnormals and underflow, ±0, ±inf and NaN. Each conversion runs
// on the host and inside a kernel; the expected codes come from a search of the table, never from
// the conversion under test.
#include "test/fp8_reference.h"
#include "test/test_util.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace {

using test::decode;
using test::expected_code;
using test::kE4M3;
using test::kE5M2;
using test::max_finite_code;
using test::Format;

// The inputs: every finite code's value, each midpoint between neighbouring positive codes (0 with
// the smallest subnormal included) and the floats next to it, the same step past the largest finite
// value, all of these negated, and the specials.
std::vector<float> encode_inputs(const Format& f) {
  std::vector<float> in;
  const int max_code = max_finite_code(f);
  const double step_past = 2 * decode(f, max_code) - decode(f, max_code - 1);
  for (int c = 0; c <= max_code; ++c) {
    const double low = decode(f, c), high = c < max_code ? decode(f, c + 1) : step_past;
    const float mid = static_cast<float>((low + high) / 2);
    for (float x : {static_cast<float>(low), std::nextafter(mid, -INFINITY), mid, std::nextafter(mid, INFINITY)}) {
      in.push_back(x);
      in.push_back(-x);
    }
  }
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (float x : {static_cast<float>(step_past), static_cast<float>(step_past) * 2, 1e30f,
                  std::numeric_limits<float>::max(), inf, std::numeric_limits<float>::denorm_min(),
                  std::ldexp(1.0f, -40)}) {
    in.push_back(x);
    in.push_back(-x);
  }
  in.push_back(nan);
  in.push_back(-nan);
  return in;
}

}  // namespace

// Kernels have external linkage, as the project's do, so the ptxas table has their rows (docs/SIMT.md).
// One thread per input: the four conversions (each format, saturating through fp8.cuh's from_float,
// and without saturation through cuda_fp8.h's intrinsic).
__global__ void fp8_encode_kernel(uint16_t* codes, const float* in, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  codes[4 * i + 0] = from_float<fp8e4m3>(in[i]).__x;
  codes[4 * i + 1] = __nv_cvt_float_to_fp8(in[i], __NV_NOSAT, __NV_E4M3);
  codes[4 * i + 2] = from_float<fp8e5m2>(in[i]).__x;
  codes[4 * i + 3] = __nv_cvt_float_to_fp8(in[i], __NV_NOSAT, __NV_E5M2);
}

// One thread per code: its value in each format, through fp8.cuh's to_float.
__global__ void fp8_decode_kernel(float* e4m3, float* e5m2) {
  const int code = blockIdx.x * blockDim.x + threadIdx.x;
  if (code >= 256) return;
  fp8e4m3 a;
  fp8e5m2 b;
  a.__x = static_cast<__nv_fp8_storage_t>(code);
  b.__x = static_cast<__nv_fp8_storage_t>(code);
  e4m3[code] = to_float(a);
  e5m2[code] = to_float(b);
}

namespace {

// float `got` is exactly the value of `code` (a NaN for a NaN code; -0 keeps its sign).
bool decodes_to(const Format& f, int code, float got) {
  const double want = decode(f, code);
  if (std::isnan(want)) return std::isnan(got);
  return static_cast<double>(got) == want && std::signbit(got) == std::signbit(want);
}

float host_decode(const Format& f, int code) {
  if (f.kind == __NV_E4M3) {
    fp8e4m3 x;
    x.__x = static_cast<__nv_fp8_storage_t>(code);
    return static_cast<float>(x);
  }
  fp8e5m2 x;
  x.__x = static_cast<__nv_fp8_storage_t>(code);
  return static_cast<float>(x);
}

}  // namespace

TEST_CASE("the formats as fp8_reference.h writes them have the documented extremes", "[fp8]") {
  CHECK(decode(kE4M3, 0x7E) == 448.0);
  CHECK(decode(kE4M3, 0x7E) == kFp8E4M3Max);
  CHECK(decode(kE4M3, 0x01) == std::ldexp(1.0, -9));
  CHECK(decode(kE4M3, 0x08) == std::ldexp(1.0, -6));  // smallest normal
  CHECK(std::isnan(decode(kE4M3, 0x7F)));
  CHECK(std::isnan(decode(kE4M3, 0xFF)));
  CHECK(decode(kE4M3, 0x78) == 256.0);  // exponent 1111 is ordinary in E4M3
  CHECK(decode(kE5M2, 0x7B) == 57344.0);
  CHECK(decode(kE5M2, 0x7B) == kFp8E5M2Max);
  CHECK(decode(kE5M2, 0x01) == std::ldexp(1.0, -16));
  CHECK(decode(kE5M2, 0x04) == std::ldexp(1.0, -14));
  CHECK(decode(kE5M2, 0x7C) == std::numeric_limits<double>::infinity());
  CHECK(decode(kE5M2, 0xFC) == -std::numeric_limits<double>::infinity());
  for (int code : {0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF}) CHECK(std::isnan(decode(kE5M2, code)));
  CHECK(std::signbit(decode(kE4M3, 0x80)));
  CHECK(decode(kE4M3, 0x80) == 0.0);
}

TEST_CASE("fp8 decode: all 256 codes of each format, on the host and in a kernel", "[fp8]") {
  test::DeviceBuffer<float> e4m3(256), e5m2(256);
  launch(fp8_decode_kernel, dim3(2), dim3(128), 0, nullptr, e4m3.ptr, e5m2.ptr);
  test::require_no_cuda_error();
  const std::vector<float> device[2] = {e4m3.download(), e5m2.download()};
  int f = 0;
  for (const Format& format : {kE4M3, kE5M2}) {
    int bad = 0;
    for (int code = 0; code < 256; ++code) {
      INFO(format.name << " code 0x" << std::hex << code << std::dec << " want " << decode(format, code));
      const float host = host_decode(format, code);
      if (!decodes_to(format, code, host) && bad++ < 8) CHECK(host == decode(format, code));
      if (!decodes_to(format, code, device[f][code]) && bad++ < 8) CHECK(device[f][code] == decode(format, code));
    }
    CHECK(bad == 0);
    ++f;
  }
}

TEST_CASE("fp8 encode: exact values, midpoints (ties to even), overflow, underflow, ±0, NaN", "[fp8]") {
  for (const Format& format : {kE4M3, kE5M2}) {
    const std::vector<float> in = encode_inputs(format);
    const int n = static_cast<int>(in.size());
    test::DeviceBuffer<float> inputs(in);
    test::DeviceBuffer<uint16_t> codes(4 * in.size());  // poisoned 0xFFFF: no code
    launch(fp8_encode_kernel, dim3(ceil_div(n, 128)), dim3(128), 0, nullptr, codes.ptr, inputs.ptr, n);
    test::require_no_cuda_error();
    const std::vector<uint16_t> device = codes.download();
    const int column = format.kind == __NV_E4M3 ? 0 : 2;
    int bad = 0;
    for (int i = 0; i < n; ++i) {
      for (bool saturate : {true, false}) {
        const uint8_t want = expected_code(format, in[i], saturate);
        const int host_intrinsic = __nv_cvt_float_to_fp8(in[i], saturate ? __NV_SATFINITE : __NV_NOSAT, format.kind);
        const int host_constructor = format.kind == __NV_E4M3 ? fp8e4m3(in[i]).__x : fp8e5m2(in[i]).__x;
        const int in_kernel = device[4 * i + column + (saturate ? 0 : 1)];
        const bool ok = host_intrinsic == want && in_kernel == want && (!saturate || host_constructor == want);
        if (!ok && bad++ < 10) {
          INFO(format.name << (saturate ? " satfinite" : " no saturation") << ": " << in[i] << " (" << std::hexfloat
                           << in[i] << std::defaultfloat << ") want 0x" << std::hex << int{want} << " host 0x"
                           << host_intrinsic << " constructor 0x" << host_constructor << " kernel 0x" << in_kernel);
          CHECK(ok);
        }
      }
    }
    INFO(format.name << ": " << n << " inputs");
    CHECK(bad == 0);
  }
}
