// rmsnorm.cuh — RMSNorm over the last dimension (Llama's norm), with a fused residual-add
// variant, and its backward pass.
//
// Layouts: inp/out/residual/dout/dinp (N, C) with N = B·T rows; weight (C); rstd (N) fp32,
// rstd = 1/sqrt(mean(x²) + eps). Meta's order of operations: the statistic and the normalized
// row x·rstd in fp32, that row rounded to T, then multiplied by the weight and rounded again
// (for fp32 both roundings are exact). One warp per row; each lane owns the 128-bit column chunks
// j ≡ lane (mod 32), so C must be a multiple of 16 / sizeof(T) (4 floats, 8 bf16). No kernel's
// shared memory grows with C: the weight gradient is summed per column tile (below).
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

constexpr int kRmsNormWarps = 8;  // rows in flight per block (one per warp)

// Finishes one row given this lane's partial sum of x²: writes rstd and out = round(x·rstd)·weight.
// kFp8: also the row's FP8 codes into out8 at scale8 (fp8_cast_chunk); returns the lane's
// magnitude key of its outputs (0 without kFp8).
template <typename T, bool kFp8>
__device__ int rmsnorm_row(T* out, float* rstd, const T* x, const T* weight, float lane_sumsq, int C, float eps,
                           int lane, fp8e4m3* out8, float scale8) {
  constexpr int kVec = Vec128<T>::size;
  const float s = rsqrtf(warp_sum(lane_sumsq) / C + eps);
  int key = 0;
  for (int j = lane; j < C / kVec; j += 32) {
    const Vec128<T> v = load128(x + j * kVec);
    const Vec128<T> w = load128(weight + j * kVec);
    Vec128<T> y;
    for (int i = 0; i < kVec; ++i) y[i] = from_float<T>(to_float(from_float<T>(to_float(v[i]) * s)) * to_float(w[i]));
    store128(out + j * kVec, y);
    if constexpr (kFp8) key = fp8_cast_chunk(out8 + j * kVec, y, scale8, key);
  }
  if (lane == 0) *rstd = s;
  return key;
}

// kFp8 (an FP8 copy, out8 set): a kernel of its own, so that the plain norm keeps its registers.
// The copy's arguments (out8, scale8, amax8) are Fp8Out's, passed one by one: a kernel's pointer
// arguments are what the CPU build's stream-order checker sees it touch.
template <typename T, bool kFp8>
__global__ void rmsnorm_forward_kernel(T* out, float* rstd, const T* inp, const T* weight, int N, int C, float eps,
                                       fp8e4m3* out8, const float* scale8, float* amax8) {
  constexpr int kVec = Vec128<T>::size;
  const int row = blockIdx.x * kRmsNormWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  int key = 0;
  // Whole warps skip together, so the warp reductions stay complete; none returns early, as every
  // warp takes part in the block's amax.
  if (row < N) {
    const size_t offset = static_cast<size_t>(row) * C;
    float lane_sumsq = 0.0f;
    for (int j = lane; j < C / kVec; j += 32) {
      const Vec128<T> v = load128(inp + offset + j * kVec);
      for (int i = 0; i < kVec; ++i) lane_sumsq += to_float(v[i]) * to_float(v[i]);
    }
    key = rmsnorm_row<T, kFp8>(out + offset, rstd + row, inp + offset, weight, lane_sumsq, C, eps, lane,
                               kFp8 ? out8 + offset : nullptr, kFp8 ? *scale8 : 0.0f);
  }
  if (kFp8 && amax8 != nullptr) fp8_record_amax<32 * kRmsNormWarps>(amax8, key);
}

// residual = inp1 + inp2 rounded to T, then RMSNorm of those rounded values. Each lane re-reads
// only the chunks it wrote itself, so no synchronization is needed between passes.
template <typename T, bool kFp8>
__global__ void residual_rmsnorm_forward_kernel(T* residual, T* out, float* rstd, const T* inp1, const T* inp2,
                                                const T* weight, int N, int C, float eps, fp8e4m3* out8,
                                                const float* scale8, float* amax8) {
  constexpr int kVec = Vec128<T>::size;
  const int row = blockIdx.x * kRmsNormWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  int key = 0;
  if (row < N) {  // as rmsnorm_forward_kernel's
    const size_t offset = static_cast<size_t>(row) * C;
    float lane_sumsq = 0.0f;
    for (int j = lane; j < C / kVec; j += 32) {
      const Vec128<T> a = load128(inp1 + offset + j * kVec);
      const Vec128<T> b = load128(inp2 + offset + j * kVec);
      Vec128<T> r;
      for (int i = 0; i < kVec; ++i) {
        r[i] = from_float<T>(to_float(a[i]) + to_float(b[i]));
        lane_sumsq += to_float(r[i]) * to_float(r[i]);
      }
      store128(residual + offset + j * kVec, r);
    }
    key = rmsnorm_row<T, kFp8>(out + offset, rstd + row, residual + offset, weight, lane_sumsq, C, eps, lane,
                               kFp8 ? out8 + offset : nullptr, kFp8 ? *scale8 : 0.0f);
  }
  if (kFp8 && amax8 != nullptr) fp8_record_amax<32 * kRmsNormWarps>(amax8, key);
}

// Input gradient, one warp per row (x̂ = x·rstd, dx̂ = dout·weight; the rounding of x̂ to T is
// treated as the identity, as autograd treats PyTorch's cast):
//   dinp += rstd·(dx̂ − x̂·mean(dx̂·x̂))
template <typename T>
__global__ void rmsnorm_backward_input_kernel(T* dinp, const T* dout, const T* inp, const T* weight,
                                              const float* rstd, int N, int C) {
  constexpr int kVec = Vec128<T>::size;
  const int row = blockIdx.x * kRmsNormWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const size_t offset = static_cast<size_t>(row) * C;
  const float s = rstd[row];
  float lane_dot = 0.0f;
  for (int j = lane; j < C / kVec; j += 32) {
    const Vec128<T> dy = load128(dout + offset + j * kVec);
    const Vec128<T> x = load128(inp + offset + j * kVec);
    const Vec128<T> w = load128(weight + j * kVec);
    for (int i = 0; i < kVec; ++i) lane_dot += to_float(dy[i]) * to_float(w[i]) * to_float(x[i]) * s;
  }
  const float mean_dot = warp_sum(lane_dot) / C;
  for (int j = lane; j < C / kVec; j += 32) {
    const Vec128<T> dy = load128(dout + offset + j * kVec);
    const Vec128<T> x = load128(inp + offset + j * kVec);
    const Vec128<T> w = load128(weight + j * kVec);
    Vec128<T> dx = load128(dinp + offset + j * kVec);
    for (int i = 0; i < kVec; ++i) {
      const float dnorm = to_float(dy[i]) * to_float(w[i]);
      dx[i] = from_float<T>(to_float(dx[i]) + s * (dnorm - to_float(x[i]) * s * mean_dot));
    }
    store128(dinp + offset + j * kVec, dx);
  }
}

// Weight gradient, first level: partials[g][c] = Σ dout·round(x·rstd) over row group g's rows.
// Block (tile, g) of (32, kRmsNormWarps) threads owns the 32 chunks of columns starting at chunk
// tile·32 (lane l: chunk tile·32 + l, one 128-bit access per row); warp w adds the group's rows
// w, w + kRmsNormWarps, ... in increasing order; then thread t adds the warps' sums of one column
// in increasing warp order. The order depends on N and C alone. Shared memory: 8 KB for bf16,
// 4 KB for fp32, whatever C.
template <typename T>
__global__ void rmsnorm_backward_weight_kernel(float* partials, const T* dout, const T* inp, const float* rstd, int N,
                                               int C, int rows_per_group) {
  constexpr int kVec = Vec128<T>::size;
  __shared__ float warp_sums[kRmsNormWarps][kVec][32];
  const int lane = threadIdx.x, warp = threadIdx.y;
  const int chunk = blockIdx.x * 32 + lane;
  const bool owns_chunk = chunk < C / kVec;
  const int first = blockIdx.y * rows_per_group;
  const int end = first + rows_per_group < N ? first + rows_per_group : N;
  float acc[kVec];
  for (int i = 0; i < kVec; ++i) acc[i] = 0.0f;
  if (owns_chunk) {
    for (int row = first + warp; row < end; row += kRmsNormWarps) {
      const size_t offset = static_cast<size_t>(row) * C + static_cast<size_t>(chunk) * kVec;
      const float s = rstd[row];
      const Vec128<T> dy = load128(dout + offset);
      const Vec128<T> x = load128(inp + offset);
      for (int i = 0; i < kVec; ++i) acc[i] += to_float(dy[i]) * to_float(from_float<T>(to_float(x[i]) * s));
    }
  }
  for (int i = 0; i < kVec; ++i) warp_sums[warp][i][lane] = acc[i];
  __syncthreads();
  for (int t = warp * 32 + lane; t < kVec * 32; t += 32 * kRmsNormWarps) {
    const int i = t / 32, owner = t % 32;  // element i of lane `owner`'s chunk
    const int column = (blockIdx.x * 32 + owner) * kVec + i;
    if (column >= C) continue;
    float sum = 0.0f;
    for (int w = 0; w < kRmsNormWarps; ++w) sum += warp_sums[w][i][owner];
    partials[static_cast<size_t>(blockIdx.y) * C + column] = sum;
  }
}

// dweight[c] += Σ_g partials[g][c] in block_column_sum's fixed order, added to the stored
// gradient once. Blocks of (kColumnSumWidth, kColumnSumWarps) threads.
template <typename T>
__global__ void rmsnorm_backward_reduce_kernel(T* dweight, const float* partials, int groups, int C) {
  const int c = blockIdx.x * kColumnSumWidth + threadIdx.x;
  const float sum = block_column_sum(partials, groups, C);
  if (threadIdx.y != 0 || c >= C) return;
  dweight[c] = from_float<T>(to_float(dweight[c]) + sum);
}

template <typename T>
void rmsnorm_check_shape(const char* op, int N, int C) {
  if (N < 1 || C < 1 || C % Vec128<T>::size != 0) {
    throw_errorf("%s: need N>=1 and C a positive multiple of %d (128-bit accesses); got N=%d C=%d", op,
                 Vec128<T>::size, N, C);
  }
}

// Row groups of the weight gradient's first level: at least kRmsNormMinGroupRows rows each, and
// at most kRmsNormMaxGroups groups (the scratch's rows). Functions of N only, so the summation
// order never changes with the launch.
constexpr int kRmsNormMinGroupRows = 32;
constexpr int kRmsNormMaxGroups = 256;
inline int rmsnorm_group_rows(int N) {
  const int spread = ceil_div(N, kRmsNormMaxGroups);
  return spread > kRmsNormMinGroupRows ? spread : kRmsNormMinGroupRows;
}
inline int rmsnorm_groups(int N) { return ceil_div(N, rmsnorm_group_rows(N)); }

// Bytes of fp32 scratch rmsnorm_backward needs: one weight-gradient partial row per row group.
inline size_t rmsnorm_backward_scratch_bytes(int N, int C) {
  return static_cast<size_t>(rmsnorm_groups(N)) * C * sizeof(float);
}

// out = round(inp·rstd)·weight per row; rstd (fp32, N) is written for the backward pass.
// fp8 (none by default): out's FP8 copy (N, C) and its amax, as fp8_cast of out would write them
// (the opening comment).
template <typename T>
void rmsnorm_forward(T* out, float* rstd, const T* inp, const T* weight, int N, int C, float eps,
                     cudaStream_t stream, const Fp8Out& fp8 = {}) {
  rmsnorm_check_shape<T>("rmsnorm_forward", N, C);
  fp8_out_check<T>("rmsnorm_forward", fp8);
  auto* kernel = fp8.out != nullptr ? rmsnorm_forward_kernel<T, true> : rmsnorm_forward_kernel<T, false>;
  launch(kernel, dim3(ceil_div(N, kRmsNormWarps)), dim3(32 * kRmsNormWarps), 0, stream, out, rstd,
         inp, weight, N, C, eps, fp8.out, fp8.scale, fp8.amax);
  CUDA_CHECK(cudaGetLastError());
}

// residual = inp1 + inp2 (fp32 add, rounded to T), then out/rstd = RMSNorm of the ROUNDED
// residual (what the backward pass will read back as its input). residual may be the same
// buffer as inp1 or inp2 (in-place residual add); out must be distinct. fp8: as rmsnorm_forward's.
template <typename T>
void residual_rmsnorm_forward(T* residual, T* out, float* rstd, const T* inp1, const T* inp2, const T* weight, int N,
                              int C, float eps, cudaStream_t stream, const Fp8Out& fp8 = {}) {
  rmsnorm_check_shape<T>("residual_rmsnorm_forward", N, C);
  fp8_out_check<T>("residual_rmsnorm_forward", fp8);
  auto* kernel = fp8.out != nullptr ? residual_rmsnorm_forward_kernel<T, true>
                                  : residual_rmsnorm_forward_kernel<T, false>;
  launch(kernel, dim3(ceil_div(N, kRmsNormWarps)), dim3(32 * kRmsNormWarps), 0, stream,
         residual, out, rstd, inp1, inp2, weight, N, C, eps, fp8.out, fp8.scale, fp8.amax);
  CUDA_CHECK(cudaGetLastError());
}

// Backward of rmsnorm_forward given its input and saved rstd. Both gradients ACCUMULATE, each
// rounded to T once per call:
//   dinp    += d loss/d inp   (the residual-stream gradient, already holding the skip connection's)
//   dweight += Σ_rows dout·round(inp·rstd)   (accumulated over micro-steps)
// scratch: rmsnorm_backward_scratch_bytes(N, C) bytes of device memory (contents overwritten).
// Deterministic: fixed row→warp assignment, fixed-order fp32 reductions. The weight gradient
// reads dout and inp a second time rather than keep per-block sums of all C columns on chip.
// dinp must not alias dout or inp.
template <typename T>
void rmsnorm_backward(T* dinp, T* dweight, float* scratch, const T* dout, const T* inp, const T* weight,
                      const float* rstd, int N, int C, cudaStream_t stream) {
  rmsnorm_check_shape<T>("rmsnorm_backward", N, C);
  launch(rmsnorm_backward_input_kernel<T>, dim3(ceil_div(N, kRmsNormWarps)), dim3(32 * kRmsNormWarps), 0, stream,
         dinp, dout, inp, weight, rstd, N, C);
  CUDA_CHECK(cudaGetLastError());
  const int groups = rmsnorm_groups(N);
  launch(rmsnorm_backward_weight_kernel<T>, dim3(ceil_div(C / Vec128<T>::size, 32), groups),
         dim3(32, kRmsNormWarps), 0, stream, scratch, dout, inp, rstd, N, C, rmsnorm_group_rows(N));
  CUDA_CHECK(cudaGetLastError());
  launch(rmsnorm_backward_reduce_kernel<T>, dim3(ceil_div(C, kColumnSumWidth)), dim3(kColumnSumWidth, kColumnSumWarps),
         0, stream, dweight, scratch, groups, C);
  CUDA_CHECK(cudaGetLastError());
}
