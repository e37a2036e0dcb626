// residual.cuh — the residual add alone: out = inp1 + inp2 (fp32 add, rounded once to T), the
// same bits as the residual the fused residual-norm kernels (layernorm.cuh, rmsnorm.cuh) write.
// A pipeline stage whose last layer hands the residual stream to the next stage has no next norm
// to fuse it with (its weights live on that stage); the next stage normalizes the received rows.
// Element-wise, one 128-bit access per operand per thread.
#pragma once
#include "common.cuh"

template <typename T>
__global__ void residual_forward_kernel(T* out, const T* inp1, const T* inp2, size_t n) {
  constexpr int kVec = Vec128<T>::size;
  const size_t i = (static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kVec;
  if (i >= n) return;
  const Vec128<T> a = load128(inp1 + i);
  const Vec128<T> b = load128(inp2 + i);
  Vec128<T> r;
  for (int k = 0; k < kVec; ++k) r[k] = from_float<T>(to_float(a[k]) + to_float(b[k]));
  store128(out + i, r);
}

constexpr int kResidualBlock = 256;

// out[i] = inp1[i] + inp2[i] for i < n; out may be inp1 or inp2 (each thread reads its 16 bytes of
// both before writing). n % (16 / sizeof(T)) == 0 and 16-byte aligned pointers (a bad n throws).
template <typename T>
void residual_forward(T* out, const T* inp1, const T* inp2, size_t n, cudaStream_t stream) {
  if (n % Vec128<T>::size != 0) throw_errorf("residual_forward: n=%zu must be a multiple of %d (128-bit accesses)", n, Vec128<T>::size);
  if (n == 0) return;
  const size_t blocks = ceil_div(n / Vec128<T>::size, static_cast<size_t>(kResidualBlock));
  launch(residual_forward_kernel<T>, dim3(static_cast<unsigned>(blocks)), dim3(kResidualBlock), 0, stream, out, inp1,
         inp2, n);
  CUDA_CHECK(cudaGetLastError());
}
