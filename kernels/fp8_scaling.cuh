// fp8_scaling.cuh — the per-tensor scaling state of the FP8 matrix products for M tensors, all on
// the device (nothing goes through the host, so a step needs no synchronisation), and its update
// once a step: delayed scaling (the scale from the amaxes of the last H steps) or current scaling
// (from this step's amax, measured by fp8_amax before the cast).
//
// The state, fp32 device arrays:
//   history   (M, H) row-major, H = --fp8-amax-history (16 by default): row m holds tensor m's last H
//             amaxes, the newest in column 0 and the oldest in column H-1. An update shifts the row by
//             one (the oldest falls out) and writes the step's amax into column 0: no position to
//             keep, so a checkpoint saves the arrays as they are.
//   amax      (M): the running amax of the current step; fp8_cast and fp8_amax (fp8_cast.cuh) fold
//             into amax + m; the update reads it and leaves it 0 for the next step.
//   scale     (M): what a cast multiplies by (fp8_cast's scale pointer: scale + m).
//   scale_inv (M, kFp8ScaleInvStride apart): 1 / scale at scale_inv[m · kFp8ScaleInvStride], the
//             dequantizing factor cuBLASLt's A and B scale pointers take (the product is computed on
//             the decoded codes times scale_a · scale_b). 16 bytes apart: cuBLASLt's FP8 products
//             refuse a scale pointer that is not 16-byte aligned (NOT_SUPPORTED, measured on an H200:
//             docs/SIMT.md), so every tensor's starts a 16-byte boundary of an aligned array.
//   format_max (M, read only): each tensor's format's largest finite value (kFp8E4M3Max or
//             kFp8E5M2Max), filled once by the caller.
// Tensors [a, b) alone are the call with every pointer offset by a (history by a·H, scale_inv by
// a·kFp8ScaleInvStride) and M = b - a.
//
// The update, per tensor (one launch for all M):
//   1. the step's amax is pushed into the history (in both modes: the history is also the record of
//      recent amaxes, NaN and inf included, as measured);
//   2. basis = delayed ? the largest finite entry of the window (the H newest amaxes, this step's
//      included, so an amax stops counting H steps after its own) : the step's amax;
//   3. when the basis is finite and > 0: scale = (format_max · 2^-margin) / basis, one fp32 division
//      (the numerator is exact), capped at FLT_MAX when the basis is so small that the quotient
//      overflows; otherwise the previous scale stays. Zero: an all-zero tensor (a gradient that has
//      not flowed yet) casts exactly under any scale, and the scale it would give is inf (0·inf is a
//      NaN). Non-finite: the amax of a step with an overflow or a NaN, which the trainer skips or
//      stops on; its scale would be 0 or NaN and ruin every later cast. The delayed window skips
//      non-finite entries for the same reason: one bad step would otherwise hold the scale for H.
//      (TransformerEngine's delayed scaling also keeps the previous scale for a zero or non-finite
//      amax; torchao instead clamps the amax below at 1e-12.)
//   4. scale_inv = 1 / scale (one fp32 division), amax = 0.
// Exact and deterministic: every tensor is one thread's fixed sequence of IEEE operations.
#pragma once
#include "common.cuh"

#include <cfloat>
#include <cmath>

// x is neither ±inf nor NaN (all exponent bits set), from its bits: the same test in both builds.
__device__ __forceinline__ bool fp8_scaling_finite(float x) {
  uint32_t bits;
  memcpy(&bits, &x, sizeof(bits));
  return (bits & 0x7F800000u) != 0x7F800000u;
}

constexpr int kFp8ScaleInvStride = 4;  // floats: 16 bytes

// One thread per tensor: it walks its history row (H loads and stores; once a step, on a few
// hundred tensors at most).
constexpr int kFp8ScalingThreads = 128;

__global__ void __launch_bounds__(kFp8ScalingThreads)
    fp8_update_scales_kernel(float* scale, float* scale_inv, float* history, float* amax, const float* format_max,
                             int M, int H, float margin_factor, bool delayed) {
  LAUNCH_BOUNDS_GUARD(kFp8ScalingThreads);
  const int m = blockIdx.x * blockDim.x + threadIdx.x;
  if (m >= M) return;
  float* row = history + static_cast<size_t>(m) * H;
  const float newest = amax[m];
  float window = fp8_scaling_finite(newest) && newest > 0.0f ? newest : 0.0f;
  for (int i = H - 1; i > 0; --i) {
    const float older = row[i - 1];
    row[i] = older;
    if (fp8_scaling_finite(older) && older > window) window = older;
  }
  row[0] = newest;
  const float basis = delayed ? window : newest;
  float s = scale[m];
  if (fp8_scaling_finite(basis) && basis > 0.0f) s = fminf(format_max[m] * margin_factor / basis, FLT_MAX);
  scale[m] = s;
  scale_inv[static_cast<size_t>(m) * kFp8ScaleInvStride] = 1.0f / s;
  amax[m] = 0.0f;
}

__global__ void __launch_bounds__(kFp8ScalingThreads)
    fp8_scaling_init_kernel(float* scale, float* scale_inv, float* history, float* amax, int M, int H) {
  LAUNCH_BOUNDS_GUARD(kFp8ScalingThreads);
  const int m = blockIdx.x * blockDim.x + threadIdx.x;
  if (m >= M) return;
  scale[m] = 1.0f;
  scale_inv[static_cast<size_t>(m) * kFp8ScaleInvStride] = 1.0f;
  amax[m] = 0.0f;
  for (int i = 0; i < H; ++i) history[static_cast<size_t>(m) * H + i] = 0.0f;
}

inline void fp8_scaling_check(const char* op, int M, int H) {
  if (M < 0) throw_errorf("%s: M=%d tensors must not be negative", op, M);
  if (H < 1) throw_errorf("%s: the amax history H=%d must be at least 1 (--fp8-amax-history)", op, H);
}

// The state before the first step: scale 1 and scale_inv 1 (the first delayed step casts unscaled),
// history and amax 0.
inline void fp8_scaling_init(float* scale, float* scale_inv, float* history, float* amax, int M, int H,
                             cudaStream_t stream) {
  fp8_scaling_check("fp8_scaling_init", M, H);
  if (M == 0) return;
  launch(fp8_scaling_init_kernel, dim3(static_cast<unsigned>(ceil_div(M, kFp8ScalingThreads))),
         dim3(kFp8ScalingThreads), 0, stream, scale, scale_inv, history, amax, M, H);
  CUDA_CHECK(cudaGetLastError());
}

// The update of the opening comment, for M tensors in one launch. margin in [0, 32]: the scale
// leaves 2^margin of headroom below the format's largest value.
inline void fp8_update_scales(float* scale, float* scale_inv, float* history, float* amax, const float* format_max,
                              int M, int H, int margin, bool delayed, cudaStream_t stream) {
  fp8_scaling_check("fp8_update_scales", M, H);
  if (margin < 0 || margin > 32) throw_errorf("fp8_update_scales: margin=%d must be in [0, 32]", margin);
  if (M == 0) return;
  launch(fp8_update_scales_kernel, dim3(static_cast<unsigned>(ceil_div(M, kFp8ScalingThreads))),
         dim3(kFp8ScalingThreads), 0, stream, scale, scale_inv, history, amax, format_max, M, H,
         std::ldexp(1.0f, -margin), delayed);
  CUDA_CHECK(cudaGetLastError());
}
