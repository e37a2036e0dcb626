// global_norm.cuh — sum of squares of a tensor (the gradient norm for clipping), reduced in
// a fixed order so the same values at the same address always give the same bits.
//
// Two launches: a grid of partial sums (one fp32 per block into scratch), then one block
// that adds the partials in block order. No float atomics.
#pragma once
#include "common.cuh"

constexpr int kNormThreads = 256;
constexpr int kNormMaxBlocks = 512;

// Block-wide sum; every thread returns the same bits (butterfly within warps, then each
// thread adds the per-warp sums in warp order). Ends with a barrier so the shared array
// may be reused by a following call.
__device__ __forceinline__ float global_norm_block_sum(float x) {
  alignas(16) __shared__ float sum_of_warp[kNormThreads / 32];
  const float w = warp_sum(x);
  if (threadIdx.x % 32 == 0) sum_of_warp[threadIdx.x / 32] = w;
  __syncthreads();
  float total = 0.0f;
  for (int i = 0; i < static_cast<int>(blockDim.x / 32); ++i) total += sum_of_warp[i];
  __syncthreads();
  return total;
}

// The n values are split into `head` scalar elements (up to the first 16-byte boundary),
// `vectors` 128-bit chunks, and the scalar tail; each is a "unit" of work. Threads take
// units grid-stride, so which thread sums which elements depends only on n and on the
// pointer's alignment.
template <typename T>
__global__ void global_norm_partials_kernel(float* partials, const T* values, size_t n, size_t head,
                                            size_t vectors) {
  constexpr int W = Vec128<T>::size;
  const size_t units = n - vectors * (W - 1);
  const size_t body_end = head + vectors;
  float acc = 0.0f;
  for (size_t u = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; u < units;
       u += static_cast<size_t>(gridDim.x) * blockDim.x) {
    if (u < head || u >= body_end) {
      const size_t i = u < head ? u : u + vectors * (W - 1);
      const float x = to_float(values[i]);
      acc += x * x;
    } else {
      const Vec128<T> x = load128cs(values + head + (u - head) * W);
      for (int k = 0; k < W; ++k) {
        const float f = to_float(x[k]);
        acc += f * f;
      }
    }
  }
  const float block_total = global_norm_block_sum(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = block_total;
}

__global__ void global_norm_finish_kernel(float* out, const float* partials, int count) {
  float acc = 0.0f;
  for (int i = threadIdx.x; i < count; i += blockDim.x) acc += partials[i];
  const float total = global_norm_block_sum(acc);
  if (threadIdx.x == 0) *out += total;
}

// Bytes of device scratch global_norm_squared needs (one fp32 partial per block).
inline size_t global_norm_scratch_bytes() { return kNormMaxBlocks * sizeof(float); }

// *out += sum over i < n of values[i]^2, accumulated in fp32. ACCUMULATES: zero *out first
// (cudaMemsetAsync) for one tensor; calling it once per tensor/range on the same *out sums the
// ranges (stream order fixes the order of the adds). values may start at any element offset
// (a misaligned start is handled with scalar head elements). scratch: device memory of
// global_norm_scratch_bytes(); it is free again once the call's kernels have run in stream order.
// The grid size is a function of n only (at most kNormMaxBlocks), so results are bit-reproducible.
template <typename T>
void global_norm_squared(float* out, float* scratch, const T* values, size_t n, cudaStream_t stream) {
  constexpr size_t W = Vec128<T>::size;
  const size_t misalignment = reinterpret_cast<uintptr_t>(values) % 16;
  const size_t to_boundary = (16 - misalignment) % 16 / sizeof(T);
  const size_t head = to_boundary < n ? to_boundary : n;
  const size_t vectors = (n - head) / W;
  const size_t units = n - vectors * (W - 1);
  const size_t wanted = ceil_div(units, static_cast<size_t>(kNormThreads));
  const int blocks = static_cast<int>(wanted < 1 ? 1 : (wanted > kNormMaxBlocks ? kNormMaxBlocks : wanted));
  launch(global_norm_partials_kernel<T>, dim3(blocks), dim3(kNormThreads), 0, stream, scratch, values, n, head,
         vectors);
  CUDA_CHECK(cudaGetLastError());
  launch(global_norm_finish_kernel, dim3(1), dim3(kNormThreads), 0, stream, out, scratch, blocks);
  CUDA_CHECK(cudaGetLastError());
}
