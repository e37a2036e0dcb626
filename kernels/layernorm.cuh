// layernorm.cuh — LayerNorm over the last dimension (eps 1e-5), with a fused
// residual-add variant, and its backward pass.
//
// Layouts: inp/out/residual/dout/dinp (N, C) with N = B·T rows; weight/bias (C);
// mean/rstd (N) fp32, rstd = 1/sqrt(biased variance + eps). Statistics and all math are
// fp32. The forward and the input gradient run one warp per row, each lane owning the 128-bit
// column chunks j ≡ lane (mod 32); the weight and bias gradients run one thread per 128-bit column
// chunk over chunks of rows, then a column sum. C must be a multiple of 16 / sizeof(T) (4 floats,
// 8 bf16); the launchers exit with a message otherwise. No kernel's shared memory grows with C
// (what a block may have, 163 KB on A100 and 227 KB on H100, would otherwise cap the width).
//
// The forwards can also write their output's FP8 E4M3 copy and record its amax (Fp8Out,
// kernels/fp8_cast.cuh: the codes and amax fp8_cast gives on the rounded output, bit for bit), the
// input cast of the product that reads the norm (src/model/fp8_state.h). Only the copy as stored:
// the transposed one the weight gradient needs would take a tile across 32 rows that a warp per
// row does not have (a block's rows through shared memory, and a slower forward for a copy used
// once), and the backward reads the norm's bf16 output anyway, so it casts it there.
#pragma once
#include "common.cuh"
#include "fp8_cast.cuh"

constexpr float kLayerNormEps = 1e-5f;
constexpr int kLayerNormWarps = 8;  // rows in flight per block (one per warp)

// Finishes one row given this lane's partial sum of x: writes mean, rstd and
// out = (x - mean)·rstd·weight + bias. Variance is taken about the mean (second pass over x).
// kFp8: also the row's FP8 codes into out8 at scale8 (fp8_cast_chunk); returns the lane's
// magnitude key of its outputs (0 without kFp8).
template <typename T, bool kFp8>
__device__ int layernorm_row(T* out, float* mean, float* rstd, const T* x, const T* weight, const T* bias,
                             float lane_sum, int C, int lane, fp8e4m3* out8, float scale8) {
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
  int key = 0;
  for (int j = lane; j < chunks; j += 32) {
    const Vec128<T> v = load128(x + j * kVec);
    const Vec128<T> w = load128(weight + j * kVec);
    const Vec128<T> b = load128(bias + j * kVec);
    Vec128<T> y;
    for (int i = 0; i < kVec; ++i) y[i] = from_float<T>((to_float(v[i]) - m) * s * to_float(w[i]) + to_float(b[i]));
    store128(out + j * kVec, y);
    if constexpr (kFp8) key = fp8_cast_chunk(out8 + j * kVec, y, scale8, key);
  }
  if (lane == 0) {
    *mean = m;
    *rstd = s;
  }
  return key;
}

// kFp8 (an FP8 copy, out8 set): a kernel of its own, so that the plain norm keeps its registers.
// The copy's arguments (out8, scale8, amax8) are Fp8Out's, passed one by one: a kernel's pointer
// arguments are what the CPU build's stream-order checker sees it touch.
template <typename T, bool kFp8>
__global__ void layernorm_forward_kernel(T* out, float* mean, float* rstd, const T* inp, const T* weight,
                                         const T* bias, int N, int C, fp8e4m3* out8, const float* scale8,
                                         float* amax8) {
  constexpr int kVec = Vec128<T>::size;
  const int row = blockIdx.x * kLayerNormWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  int key = 0;
  // Whole warps skip together, so the warp reductions stay complete; none returns early, as every
  // warp takes part in the block's amax.
  if (row < N) {
    const size_t offset = static_cast<size_t>(row) * C;
    float lane_sum = 0.0f;
    for (int j = lane; j < C / kVec; j += 32) {
      const Vec128<T> v = load128(inp + offset + j * kVec);
      for (int i = 0; i < kVec; ++i) lane_sum += to_float(v[i]);
    }
    key = layernorm_row<T, kFp8>(out + offset, mean + row, rstd + row, inp + offset, weight, bias, lane_sum, C,
                                 lane, kFp8 ? out8 + offset : nullptr, kFp8 ? *scale8 : 0.0f);
  }
  if (kFp8 && amax8 != nullptr) fp8_record_amax<32 * kLayerNormWarps>(amax8, key);
}

// residual = inp1 + inp2 rounded to T, then LayerNorm of those rounded values. Each lane
// re-reads only the chunks it wrote itself, so no synchronization is needed between passes.
template <typename T, bool kFp8>
__global__ void residual_layernorm_forward_kernel(T* residual, T* out, float* mean, float* rstd, const T* inp1,
                                                  const T* inp2, const T* weight, const T* bias, int N, int C,
                                                  fp8e4m3* out8, const float* scale8, float* amax8) {
  constexpr int kVec = Vec128<T>::size;
  const int row = blockIdx.x * kLayerNormWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  int key = 0;
  if (row < N) {  // as layernorm_forward_kernel's
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
    key = layernorm_row<T, kFp8>(out + offset, mean + row, rstd + row, residual + offset, weight, bias, lane_sum,
                                 C, lane, kFp8 ? out8 + offset : nullptr, kFp8 ? *scale8 : 0.0f);
  }
  if (kFp8 && amax8 != nullptr) fp8_record_amax<32 * kLayerNormWarps>(amax8, key);
}

// Backward of the input, per row (norm = (x - mean)·rstd, dnorm = dout·weight):
//   dinp += rstd·(dnorm - mean(dnorm) - norm·mean(dnorm·norm))
// One warp per row, as in the forward; no shared memory, so any C launches.
template <typename T>
__global__ void layernorm_backward_kernel(T* dinp, const T* dout, const T* inp, const T* weight, const float* mean,
                                          const float* rstd, int N, int C) {
  constexpr int kVec = Vec128<T>::size;
  const int row = blockIdx.x * kLayerNormWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const int chunks = C / kVec;
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
      const float norm = (to_float(x[i]) - m) * s;
      const float dnorm = to_float(dy[i]) * to_float(w[i]);
      dx[i] = from_float<T>(to_float(dx[i]) + s * (dnorm - mean_dnorm - norm * mean_dnorm_norm));
    }
    store128(dinp + offset + j * kVec, dx);
  }
}

// Parameter-gradient block: x picks a 128-bit column chunk, y interleaves rows.
constexpr int kLayerNormParamsX = 32;
constexpr int kLayerNormParamsY = 8;
constexpr int kLayerNormMaxChunks = 256;  // row chunks, each one row of [dweight | dbias] partials

// Backward of weight and bias, stage 1: block (bx, by) owns the kLayerNormParamsX·V columns of
// column group bx (V = Vec128<T>::size) and the rows [k·rows_per_chunk, (k+1)·rows_per_chunk) of
// chunk k = gridDim.y - 1 - by: the last chunks are launched first, as the rows the input-gradient
// kernel read last are the likeliest to be still in L2 (this kernel reads dout and inp again).
// Thread (x, y) adds dout·norm and dout over rows y, y + kLayerNormParamsY, ... of the chunk in
// increasing order (norm recomputed from inp, mean and rstd); the block then adds the y sums in
// increasing y through a shared tile whose size is fixed (8 or 16 KB, whatever C), and writes
// partials[k] = [dweight(C) | dbias(C)] for its columns. The tile stores element i of lane x at
// i·kLayerNormParamsX + x, so the lanes of a warp hit 32 different banks.
template <typename T>
__global__ void layernorm_backward_params_kernel(float* partials, const T* dout, const T* inp, const float* mean,
                                                 const float* rstd, int N, int C, int rows_per_chunk) {
  constexpr int kVec = Vec128<T>::size, kFloatVec = Vec128<float>::size;
  constexpr int kTile = kLayerNormParamsX * kVec;
  __shared__ float tile[kLayerNormParamsY][2][kTile];  // [y][dweight, dbias][i·32 + x]
  const int col = (blockIdx.x * kLayerNormParamsX + threadIdx.x) * kVec;
  const int chunk = gridDim.y - 1 - blockIdx.y;
  const int row_begin = chunk * rows_per_chunk;
  const int row_end = min(row_begin + rows_per_chunk, N);
  float dweight[kVec], dbias[kVec];
  for (int i = 0; i < kVec; ++i) dweight[i] = dbias[i] = 0.0f;
  if (col < C) {
    for (int r = row_begin + threadIdx.y; r < row_end; r += kLayerNormParamsY) {
      const size_t offset = static_cast<size_t>(r) * C + col;
      const Vec128<T> dy = load128(dout + offset);
      const Vec128<T> x = load128(inp + offset);
      const float m = mean[r], s = rstd[r];
      for (int i = 0; i < kVec; ++i) {
        const float g = to_float(dy[i]);
        dweight[i] += g * ((to_float(x[i]) - m) * s);
        dbias[i] += g;
      }
    }
  }
  for (int i = 0; i < kVec; ++i) {
    tile[threadIdx.y][0][i * kLayerNormParamsX + threadIdx.x] = dweight[i];
    tile[threadIdx.y][1][i * kLayerNormParamsX + threadIdx.x] = dbias[i];
  }
  __syncthreads();
  if (threadIdx.y != 0 || col >= C) return;
  float* row_partials = partials + static_cast<size_t>(chunk) * 2 * C;
  for (int half = 0; half < 2; ++half) {  // 0: dweight, 1: dbias
    for (int i0 = 0; i0 < kVec; i0 += kFloatVec) {
      Vec128<float> sum;
      for (int e = 0; e < kFloatVec; ++e) {
        sum[e] = 0.0f;
        for (int y = 0; y < kLayerNormParamsY; ++y) sum[e] += tile[y][half][(i0 + e) * kLayerNormParamsX + threadIdx.x];
      }
      store128(row_partials + half * C + col + i0, sum);
    }
  }
}

// Stage 2: dweight[c] += Σ_k partials[k][c], dbias[c] += Σ_k partials[k][C + c], in
// block_column_sum's fixed order over the (chunks × 2C) partials, each added to the stored gradient
// once. Blocks of (kColumnSumWidth, kColumnSumWarps) threads, one per kColumnSumWidth of the 2C
// columns.
template <typename T>
__global__ void layernorm_backward_reduce_kernel(T* dweight, T* dbias, const float* partials, int chunks, int C) {
  const int c = blockIdx.x * kColumnSumWidth + threadIdx.x;
  const float sum = block_column_sum(partials, chunks, 2 * C);
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

// Row chunks of the parameter gradients' stage 1: >= 64 rows each, at most kLayerNormMaxChunks
// (at d12's 65,536 rows, 256 chunks of 256 rows and 3 to 16 column groups, C = 768 to 4,096:
// 768 to 4,096 blocks of 256 threads). A function of N only, so the summation order never changes.
inline int layernorm_backward_rows_per_chunk(int N) {
  const int wanted = ceil_div(N, 64);
  return ceil_div(N, wanted < kLayerNormMaxChunks ? wanted : kLayerNormMaxChunks);
}

// Bytes of fp32 scratch layernorm_backward needs: one [dweight | dbias] partial row per chunk.
inline size_t layernorm_backward_scratch_bytes(int N, int C) {
  return static_cast<size_t>(ceil_div(N, layernorm_backward_rows_per_chunk(N))) * 2 * C * sizeof(float);
}

// out = LayerNorm(inp)·weight + bias per row; mean and rstd (fp32, N each) are written for
// the backward pass. fp8 (none by default): out's FP8 copy (N, C) and its amax, as fp8_cast of
// out would write them (the opening comment).
template <typename T>
void layernorm_forward(T* out, float* mean, float* rstd, const T* inp, const T* weight, const T* bias, int N, int C,
                       cudaStream_t stream, const Fp8Out& fp8 = {}) {
  layernorm_check_shape<T>("layernorm_forward", N, C);
  fp8_out_check<T>("layernorm_forward", fp8);
  auto* kernel = fp8.out != nullptr ? layernorm_forward_kernel<T, true> : layernorm_forward_kernel<T, false>;
  launch(kernel, dim3(ceil_div(N, kLayerNormWarps)), dim3(32 * kLayerNormWarps), 0, stream, out,
         mean, rstd, inp, weight, bias, N, C, fp8.out, fp8.scale, fp8.amax);
  CUDA_CHECK(cudaGetLastError());
}

// residual = inp1 + inp2 (fp32 add, rounded to T), then out/mean/rstd = LayerNorm of the
// ROUNDED residual (what the backward pass will read back as its input). residual may be
// the same buffer as inp1 or inp2 (in-place residual add); out must be distinct. fp8: as
// layernorm_forward's.
template <typename T>
void residual_layernorm_forward(T* residual, T* out, float* mean, float* rstd, const T* inp1, const T* inp2,
                                const T* weight, const T* bias, int N, int C, cudaStream_t stream,
                                const Fp8Out& fp8 = {}) {
  layernorm_check_shape<T>("residual_layernorm_forward", N, C);
  fp8_out_check<T>("residual_layernorm_forward", fp8);
  auto* kernel = fp8.out != nullptr ? residual_layernorm_forward_kernel<T, true>
                                  : residual_layernorm_forward_kernel<T, false>;
  launch(kernel, dim3(ceil_div(N, kLayerNormWarps)), dim3(32 * kLayerNormWarps), 0,
         stream, residual, out, mean, rstd, inp1, inp2, weight, bias, N, C, fp8.out, fp8.scale, fp8.amax);
  CUDA_CHECK(cudaGetLastError());
}

// Backward of layernorm_forward given its input and saved mean/rstd. ALL THREE gradients
// ACCUMULATE, each rounded to T once per call:
//   dinp    += d loss/d inp   (dinp is the residual-stream gradient that already holds the
//                              skip-connection contribution)
//   dweight += Σ_rows dout·norm,  dbias += Σ_rows dout   (parameter gradients, accumulated
//                              over micro-steps)
// scratch: layernorm_backward_scratch_bytes(N, C) bytes of device memory (contents
// overwritten). Three kernels: the input gradient, the parameter gradients' per-chunk partial
// sums, their column sum. Deterministic: fixed assignments of rows and columns to threads,
// fixed-order fp32 reductions, no atomics.
// dinp must not alias dout or inp.
template <typename T>
void layernorm_backward(T* dinp, T* dweight, T* dbias, float* scratch, const T* dout, const T* inp, const T* weight,
                        const float* mean, const float* rstd, int N, int C, cudaStream_t stream) {
  layernorm_check_shape<T>("layernorm_backward", N, C);
  launch(layernorm_backward_kernel<T>, dim3(ceil_div(N, kLayerNormWarps)), dim3(32 * kLayerNormWarps), 0, stream, dinp,
         dout, inp, weight, mean, rstd, N, C);
  CUDA_CHECK(cudaGetLastError());
  const int rows_per_chunk = layernorm_backward_rows_per_chunk(N);
  const int chunks = ceil_div(N, rows_per_chunk);
  launch(layernorm_backward_params_kernel<T>, dim3(ceil_div(C / Vec128<T>::size, kLayerNormParamsX), chunks),
         dim3(kLayerNormParamsX, kLayerNormParamsY), 0, stream, scratch, dout, inp, mean, rstd, N, C, rows_per_chunk);
  CUDA_CHECK(cudaGetLastError());
  launch(layernorm_backward_reduce_kernel<T>, dim3(ceil_div(2 * C, kColumnSumWidth)),
         dim3(kColumnSumWidth, kColumnSumWarps), 0, stream, dweight, dbias, scratch, chunks, C);
  CUDA_CHECK(cudaGetLastError());
}
