// gelu.cuh — GELU, tanh approximation (GPT-2's activation):
//   gelu(x) = 0.5·x·(1 + tanh(u)),  u = sqrt(2/π)·(x + 0.044715·x³)
// Element-wise, fp32 math, one 128-bit access per operand per thread. The forward can also write
// its output's FP8 E4M3 copy and record its amax (Fp8Out, kernels/fp8_cast.cuh: the codes and amax
// fp8_cast gives on the rounded output, bit for bit): the input cast of the MLP's down product,
// which reads the activation (src/model/fp8_state.h).
#pragma once
#include "common.cuh"
#include "fp8_cast.cuh"

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/π)
constexpr float kGeluCubic = 0.044715f;

constexpr int kGeluBlock = 256;

// gelu(x) in fp32, before the rounding to the output type.
__device__ __forceinline__ float gelu_value(float x) {
  const float u = kGeluScale * (x + kGeluCubic * x * x * x);
  return 0.5f * x * (1.0f + tanhf(u));
}

// kFp8 (an FP8 copy, out8 set): a kernel of its own, so that the plain activation keeps its
// registers; out8, scale8, amax8 are Fp8Out's. Every thread reaches the block's amax reduction.
template <typename T, bool kFp8>
__global__ void __launch_bounds__(kGeluBlock)
    gelu_forward_kernel(T* out, const T* inp, size_t n, fp8e4m3* out8, const float* scale8, float* amax8) {
  LAUNCH_BOUNDS_GUARD(kGeluBlock);
  constexpr int kVec = Vec128<T>::size;
  const size_t i = (static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kVec;
  int key = 0;
  if (i < n) {
    const Vec128<T> x = load128(inp + i);
    Vec128<T> y;
    for (int k = 0; k < kVec; ++k) y[k] = from_float<T>(gelu_value(to_float(x[k])));
    store128(out + i, y);
    if constexpr (kFp8) key = fp8_cast_chunk(out8 + i, y, *scale8, key);
  }
  if (kFp8 && amax8 != nullptr) fp8_record_amax<kGeluBlock>(amax8, key);
}

// d gelu/dx = 0.5·(1 + tanh(u)) + 0.5·x·(1 - tanh²(u))·sqrt(2/π)·(1 + 3·0.044715·x²): GELU's
// backward here and the GELU gradient fused into matmul_backward (matmul.cuh).
__device__ __forceinline__ float gelu_grad(float x) {
  const float t = tanhf(kGeluScale * (x + kGeluCubic * x * x * x));
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
}

// dinp and dout may be the same buffer: each thread reads its 16 bytes before writing them.
template <typename T>
__global__ void gelu_backward_kernel(T* dinp, const T* inp, const T* dout, size_t n) {
  constexpr int kVec = Vec128<T>::size;
  const size_t i = (static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kVec;
  if (i >= n) return;
  const Vec128<T> x = load128(inp + i);
  const Vec128<T> dy = load128(dout + i);
  Vec128<T> dx;
  for (int k = 0; k < kVec; ++k) dx[k] = from_float<T>(to_float(dy[k]) * gelu_grad(to_float(x[k])));
  store128(dinp + i, dx);
}

// Both launchers need n % (16 / sizeof(T)) == 0 (whole 128-bit vectors: 4 floats, 8 bf16)
// and 16-byte aligned pointers; a bad n is reported and the program exits.
template <typename T>
void gelu_check_size(const char* op, size_t n) {
  if (n % Vec128<T>::size != 0) {
    throw_errorf("%s: n=%zu must be a multiple of %d (128-bit accesses)", op, n, Vec128<T>::size);
  }
}

// out[i] = gelu(inp[i]) for i < n. fp8 (none by default): out's FP8 copy (n codes) and its amax,
// as fp8_cast of out would give them.
template <typename T>
void gelu_forward(T* out, const T* inp, size_t n, cudaStream_t stream, const Fp8Out& fp8 = {}) {
  gelu_check_size<T>("gelu_forward", n);
  fp8_out_check<T>("gelu_forward", fp8);
  if (n == 0) return;
  const size_t blocks = ceil_div(n / Vec128<T>::size, static_cast<size_t>(kGeluBlock));
  auto* kernel = fp8.out != nullptr ? gelu_forward_kernel<T, true> : gelu_forward_kernel<T, false>;
  launch(kernel, dim3(static_cast<unsigned>(blocks)), dim3(kGeluBlock), 0, stream, out, inp, n, fp8.out, fp8.scale,
         fp8.amax);
  CUDA_CHECK(cudaGetLastError());
}

// dinp[i] = dout[i] · gelu'(inp[i]) for i < n (written, not accumulated). dinp may alias dout.
template <typename T>
void gelu_backward(T* dinp, const T* inp, const T* dout, size_t n, cudaStream_t stream) {
  gelu_check_size<T>("gelu_backward", n);
  if (n == 0) return;
  const size_t blocks = ceil_div(n / Vec128<T>::size, static_cast<size_t>(kGeluBlock));
  launch(gelu_backward_kernel<T>, dim3(static_cast<unsigned>(blocks)), dim3(kGeluBlock), 0, stream, dinp, inp,
         dout, n);
  CUDA_CHECK(cudaGetLastError());
}

// fp8_cast_wide's Source for the GELU of a stored bf16 pre-activation, rounded to bf16 as
// gelu_forward writes it: the MLP's activation recomputed for the backward straight into its FP8
// cast, never written (gelu_forward_fp8).
struct GeluOfStored {
  const bf16* pre;
  __device__ __forceinline__ void load(size_t i, float (&x)[kFp8WideChunk]) const {
    static_assert(Vec128<bf16>::size == kFp8WideChunk, "one 16-byte load per chunk");
    const Vec128<bf16> v = load128(pre + i);
    UNROLL
    for (int k = 0; k < kFp8WideChunk; ++k) x[k] = to_float(from_float<bf16>(gelu_value(to_float(v[k]))));
  }
};

// gelu_forward's output for pre (rows × cols) cast to E4M3 at *scale as stored (out) and/or
// transposed (out_t), its amax folded into *amax (nullptr: none), without writing the output: the
// codes fp8_cast gives on it (fp8_cast_wide's shapes: whole chunks of 8). pre 16-byte aligned.
inline void gelu_forward_fp8(fp8e4m3* out, fp8e4m3* out_t, float* amax, const float* scale, const bf16* pre, int rows,
                             int cols, cudaStream_t stream) {
  if (!fp8_aligned(pre, 16)) throw_error("gelu_forward_fp8: the input must be 16-byte aligned");
  fp8_cast_wide(out, out_t, amax, GeluOfStored{pre}, rows, cols, scale, stream);
}
