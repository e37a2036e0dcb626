// layernorm.cuh — LayerNorm over the last dimension (eps 1e-5), with a fused
// residual-add variant, and its backward pass.
//
// Layouts: inp/out/residual/dout/dinp (N, C) with N = B·T rows; weight/bias (C);
// mean/rstd (N) fp32, rstd = 1/sqrt(biased variance + eps). Statistics and all math are
// fp32. One warp per row; each lane owns the 128-bit column chunks j ≡ lane (mod 32), so
// C must be a multiple of 16 / sizeof(T) (4 floats, 8 bf16); the launchers exit with a
// message otherwise.
#pragma once
#include "common.cuh"

constexpr float kLayerNormEps = 1e-5f;
constexpr int kLayerNormWarps = 8;  // rows in flight per block (one per warp)

// Finishes one row given this lane's partial sum of x: writes mean, rstd and
// out = (x - mean)·rstd·weight + bias. Variance is taken about the mean (second pass over x).
template <typename T>
__device__ void layernorm_row(T* out, float* mean, float* rstd, const T* x, const T* weight, const T* bias,
                              float lane_sum, int C, int lane) {
  constexpr int kVec = Vec128<T>::size;
  const int chunks = C / kVec;
  const float m = warp_sum(lane_sum) / C;
  float lane_sq = 0.0f;
  for (int j = lane; j < chunks; j += 32) {
    const Vec128<T> v = load128(x + j * kVec);
    for (int i = 0; i < kVec; ++i) {
      const float d = to_float(v[i]) - m;
      lane_sq += d * d;
    }
  }
  const float s = rsqrtf(warp_sum(lane_sq) / C + kLayerNormEps);
  for (int j = lane; j < chunks; j += 32) {
    const Vec128<T> v = load128(x + j * kVec);
    const Vec128<T> w = load128(weight + j * kVec);
    const Vec128<T> b = load128(bias + j * kVec);
    Vec128<T> y;
    for (int i = 0; i < kVec; ++i) y[i] = from_float<T>((to_float(v[i]) - m) * s * to_float(w[i]) + to_float(b[i]));
    store128(out + j * kVec, y);
  }
  if (lane == 0) {
    *mean = m;
    *rstd = s;
  }
}

template <typename T>
__global__ void layernorm_forward_kernel(T* out, float* mean, float* rstd, const T* inp, const T* weight,
                                         const T* bias, int N, int C) {
  constexpr int kVec = Vec128<T>::size;
  const int row = blockIdx.x * kLayerNormWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;  // whole warps leave together, so the warp reductions stay complete
  const T* x = inp + static_cast<size_t>(row) * C;
  float lane_sum = 0.0f;
  for (int j = lane; j < C / kVec; j += 32) {
    const Vec128<T> v = load128(x + j * kVec);
    for (int i = 0; i < kVec; ++i) lane_sum += to_float(v[i]);
  }
  layernorm_row(out + static_cast<size_t>(row) * C, mean + row, rstd + row, x, weight, bias, lane_sum, C, lane);
}

// residual = inp1 + inp2 rounded to T, then LayerNorm of those rounded values. Each lane
// re-reads only the chunks it wrote itself, so no synchronization is needed between passes.
template <typename T>
__global__ void residual_layernorm_forward_kernel(T* residual, T* out, float* mean, float* rstd, const T* inp1,
                                                  const T* inp2, const T* weight, const T* bias, int N, int C) {
  constexpr int kVec = Vec128<T>::size;
  const int row = blockIdx.x * kLayerNormWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const size_t offset = static_cast<size_t>(row) * C;
  float lane_sum = 0.0f;
  for (int j = lane; j < C / kVec; j += 32) {
    const Vec128<T> a = load128(inp1 + offset + j * kVec);
    const Vec128<T> b = load128(inp2 + offset + j * kVec);
    Vec128<T> r;
    for (int i = 0; i < kVec; ++i) {
      r[i] = from_float<T>(to_float(a[i]) + to_float(b[i]));
      lane_sum += to_float(r[i]);
    }
    store128(residual + offset + j * kVec, r);
  }
  layernorm_row(out + offset, mean + row, rstd + row, residual + offset, weight, bias, lane_sum, C, lane);
}

// Backward, per row (norm = (x - mean)·rstd, dnorm = dout·weight):
//   dinp += rstd·(dnorm - mean(dnorm) - norm·mean(dnorm·norm))
// and this block's share of dweight = Σ dout·norm, dbias = Σ dout over its rows.
// Block b handles rows b·W + warp + k·gridDim.x·W (W = kLayerNormWarps). Each warp sums its
// rows into its own shared-memory slice (no two lanes touch the same word); after all rows
// the block adds the W slices in warp order and writes its partial sums, fp32, to
// partials[b] = [dweight(C) | dbias(C)]. Shared slices store channel j·V + i (chunk j,
// element i) at i·chunks + j so that the 32 lanes of a warp hit 32 different banks.
template <typename T>
__global__ void layernorm_backward_kernel(T* dinp, float* partials, const T* dout, const T* inp, const T* weight,
                                          const float* mean, const float* rstd, int N, int C) {
  constexpr int kVec = Vec128<T>::size;
  DYNAMIC_SHARED(float, slices);  // [kLayerNormWarps][2][C]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int chunks = C / kVec;
  float* dweight_acc = slices + static_cast<size_t>(warp) * 2 * C;
  float* dbias_acc = dweight_acc + C;
  for (int j = lane; j < chunks; j += 32) {
    for (int i = 0; i < kVec; ++i) {
      dweight_acc[i * chunks + j] = 0.0f;
      dbias_acc[i * chunks + j] = 0.0f;
    }
  }
  for (int row = blockIdx.x * kLayerNormWarps + warp; row < N; row += gridDim.x * kLayerNormWarps) {
    const size_t offset = static_cast<size_t>(row) * C;
    const float m = mean[row], s = rstd[row];
    float lane_dnorm = 0.0f, lane_dnorm_norm = 0.0f;
    for (int j = lane; j < chunks; j += 32) {
      const Vec128<T> dy = load128(dout + offset + j * kVec);
      const Vec128<T> x = load128(inp + offset + j * kVec);
      const Vec128<T> w = load128(weight + j * kVec);
      for (int i = 0; i < kVec; ++i) {
        const float dnorm = to_float(dy[i]) * to_float(w[i]);
        lane_dnorm += dnorm;
        lane_dnorm_norm += dnorm * (to_float(x[i]) - m) * s;
      }
    }
    const float mean_dnorm = warp_sum(lane_dnorm) / C;
    const float mean_dnorm_norm = warp_sum(lane_dnorm_norm) / C;
    for (int j = lane; j < chunks; j += 32) {
      const Vec128<T> dy = load128(dout + offset + j * kVec);
      const Vec128<T> x = load128(inp + offset + j * kVec);
      const Vec128<T> w = load128(weight + j * kVec);
      Vec128<T> dx = load128(dinp + offset + j * kVec);
      for (int i = 0; i < kVec; ++i) {
        const float g = to_float(dy[i]);
        const float norm = (to_float(x[i]) - m) * s;
        const float dnorm = g * to_float(w[i]);
        dx[i] = from_float<T>(to_float(dx[i]) + s * (dnorm - mean_dnorm - norm * mean_dnorm_norm));
        dweight_acc[i * chunks + j] += g * norm;
        dbias_acc[i * chunks + j] += g;
      }
      store128(dinp + offset + j * kVec, dx);
    }
  }
  __syncthreads();
  float* block_partial = partials + static_cast<size_t>(blockIdx.x) * 2 * C;
  for (int c = threadIdx.x; c < 2 * C; c += blockDim.x) {
    const int half = c / C, channel = c % C;  // half 0: dweight, 1: dbias
    const int k = half * C + (channel % kVec) * chunks + channel / kVec;
    float sum = 0.0f;
    for (int w = 0; w < kLayerNormWarps; ++w) sum += slices[static_cast<size_t>(w) * 2 * C + k];
    block_partial[c] = sum;
  }
}

// dweight[c] += Σ_b partials[b][c], dbias[c] += Σ_b partials[b][C + c], in block_column_sum's
// fixed order over the (blocks × 2C) partials, each added to the stored gradient once. Blocks of
// (kColumnSumWidth, kColumnSumWarps) threads, one per kColumnSumWidth of the 2C columns.
template <typename T>
__global__ void layernorm_backward_reduce_kernel(T* dweight, T* dbias, const float* partials, int blocks, int C) {
  const int c = blockIdx.x * kColumnSumWidth + threadIdx.x;
  const float sum = block_column_sum(partials, blocks, 2 * C);
  if (threadIdx.y != 0 || c >= 2 * C) return;
  T* dst = c < C ? dweight + c : dbias + (c - C);
  *dst = from_float<T>(to_float(*dst) + sum);
}

template <typename T>
void layernorm_check_shape(const char* op, int N, int C) {
  if (N < 1 || C < 1 || C % Vec128<T>::size != 0) {
    throw_errorf("%s: need N>=1 and C a positive multiple of %d (128-bit accesses); got N=%d C=%d", op,
                 Vec128<T>::size, N, C);
  }
}

// Blocks of layernorm_backward_kernel: one warp per row up to this cap, then each warp
// loops over several rows. A function of N only, so the summation order never changes.
constexpr int kLayerNormBackwardMaxBlocks = 512;
inline int layernorm_backward_blocks(int N) {
  const int wanted = ceil_div(N, kLayerNormWarps);
  return wanted < kLayerNormBackwardMaxBlocks ? wanted : kLayerNormBackwardMaxBlocks;
}

// Bytes of fp32 scratch layernorm_backward needs: one [dweight | dbias] partial per block.
inline size_t layernorm_backward_scratch_bytes(int N, int C) {
  return static_cast<size_t>(layernorm_backward_blocks(N)) * 2 * C * sizeof(float);
}

// out = LayerNorm(inp)·weight + bias per row; mean and rstd (fp32, N each) are written for
// the backward pass.
template <typename T>
void layernorm_forward(T* out, float* mean, float* rstd, const T* inp, const T* weight, const T* bias, int N, int C,
                       cudaStream_t stream) {
  layernorm_check_shape<T>("layernorm_forward", N, C);
  launch(layernorm_forward_kernel<T>, dim3(ceil_div(N, kLayerNormWarps)), dim3(32 * kLayerNormWarps), 0, stream, out,
         mean, rstd, inp, weight, bias, N, C);
  CUDA_CHECK(cudaGetLastError());
}

// residual = inp1 + inp2 (fp32 add, rounded to T), then out/mean/rstd = LayerNorm of the
// ROUNDED residual (what the backward pass will read back as its input). residual may be
// the same buffer as inp1 or inp2 (in-place residual add); out must be distinct.
template <typename T>
void residual_layernorm_forward(T* residual, T* out, float* mean, float* rstd, const T* inp1, const T* inp2,
                                const T* weight, const T* bias, int N, int C, cudaStream_t stream) {
  layernorm_check_shape<T>("residual_layernorm_forward", N, C);
  launch(residual_layernorm_forward_kernel<T>, dim3(ceil_div(N, kLayerNormWarps)), dim3(32 * kLayerNormWarps), 0,
         stream, residual, out, mean, rstd, inp1, inp2, weight, bias, N, C);
  CUDA_CHECK(cudaGetLastError());
}

// Backward of layernorm_forward given its input and saved mean/rstd. ALL THREE gradients
// ACCUMULATE, each rounded to T once per call:
//   dinp    += d loss/d inp   (dinp is the residual-stream gradient that already holds the
//                              skip-connection contribution)
//   dweight += Σ_rows dout·norm,  dbias += Σ_rows dout   (parameter gradients, accumulated
//                              over micro-steps)
// scratch: layernorm_backward_scratch_bytes(N, C) bytes of device memory (contents
// overwritten). Deterministic: fixed row→warp assignment, fixed-order fp32 reductions.
// dinp must not alias dout or inp.
template <typename T>
void layernorm_backward(T* dinp, T* dweight, T* dbias, float* scratch, const T* dout, const T* inp, const T* weight,
                        const float* mean, const float* rstd, int N, int C, cudaStream_t stream) {
  layernorm_check_shape<T>("layernorm_backward", N, C);
  const int blocks = layernorm_backward_blocks(N);
  const size_t smem = static_cast<size_t>(kLayerNormWarps) * 2 * C * sizeof(float);
  auto kernel = layernorm_backward_kernel<T>;
  if (smem > 48 * 1024) {
    CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(smem)));
  }
  launch(kernel, dim3(blocks), dim3(32 * kLayerNormWarps), smem, stream, dinp, scratch, dout, inp, weight, mean, rstd,
         N, C);
  CUDA_CHECK(cudaGetLastError());
  launch(layernorm_backward_reduce_kernel<T>, dim3(ceil_div(2 * C, kColumnSumWidth)),
         dim3(kColumnSumWidth, kColumnSumWarps), 0, stream, dweight, dbias, scratch, blocks, C);
  CUDA_CHECK(cudaGetLastError());
}
