// fp8.cuh — the FP8 element types of the Hopper matrix products (E4M3 for activations and weights,
// E5M2 for gradients) and their scalar conversions to and from fp32, in both builds.
//
// The types are CUDA's own (cuda_fp8.h). Nothing here differs between the builds: nvcc compiles the
// header's device code (the cvt.rn.satfinite instructions on sm_90, its integer emulation on
// sm_80), and g++ the same header's host implementation, so the CPU build needs no stand-in.
// test/kernels/test_fp8.cu checks both, on the host and in a kernel, against all 256 codes of each
// format written out from the formats' definitions.
//
// The formats (OCP 8-bit floating point, as cuda_fp8.h implements them):
//   E4M3: 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities, NaN only S.1111.111
//         (0x7F, 0xFF); largest finite 448 (0x7E), smallest subnormal 2^-9.
//   E5M2: 1 sign, 5 exponent (bias 15), 2 mantissa bits, IEEE-like: ±inf (0x7C, 0xFC), NaNs
//         (exponent 11111, mantissa ≠ 0); largest finite 57344 (0x7B), smallest subnormal 2^-16.
// from_float rounds to nearest, ties to even, and saturates (__NV_SATFINITE): a magnitude that
// would round past the largest finite value, ±inf included, becomes ±largest finite; a NaN becomes
// 0x7F. Values below half the smallest subnormal become zero of their sign.
#pragma once
#include "common.cuh"

#include <cuda_fp8.h>

using fp8e4m3 = __nv_fp8_e4m3;
using fp8e5m2 = __nv_fp8_e5m2;

// Largest finite magnitudes: the numerators of the per-tensor scales (scale = max / amax).
constexpr float kFp8E4M3Max = 448.0f;
constexpr float kFp8E5M2Max = 57344.0f;

__device__ __forceinline__ float to_float(fp8e4m3 x) { return static_cast<float>(x); }
__device__ __forceinline__ float to_float(fp8e5m2 x) { return static_cast<float>(x); }
template <> __device__ __forceinline__ fp8e4m3 from_float<fp8e4m3>(float x) { return fp8e4m3(x); }
template <> __device__ __forceinline__ fp8e5m2 from_float<fp8e5m2>(float x) { return fp8e5m2(x); }
