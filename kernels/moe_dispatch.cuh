// moe_dispatch.cuh — dropless token dispatch of a mixture-of-experts block (no capacity factor):
// the plan (a stable counting sort of the N·K routed (token, k) pairs by expert), the permutation
// of the tokens into expert order, the gated combination of the experts' outputs back into token
// order, and their backward passes.
//
// Layouts (row-major): expert, slot, gate, dgate (N, K), entry k of row n being pair (n, k);
// offsets (E + 1) and token_of_slot (N·K) int; x, out, dout, dx (N, C) and xp, y, dy, dxp
// (N·K, C) in T, row s of the permuted matrices holding slot s. Expert e's slots are
// offsets[e] .. offsets[e+1] − 1, its pairs in (n, k) order. C is a positive multiple of
// 16 / sizeof(T) (128-bit accesses). Expert indices must lie in [0, E) (the router's do).
//
// Deterministic: the plan is integer arithmetic in a fixed order; each output element is written
// by one thread, its sums over k taken in increasing k in fp32 and rounded to T once; dgate's dot
// products in a lane's chunks' increasing order, then warp_sum. No atomics.
#pragma once
#include "common.cuh"

constexpr int kMoeDispatchThreads = 256;
constexpr int kMoeDispatchWarps = kMoeDispatchThreads / 32;

// The plan's first step: offsets[e + 1] = #{pairs routed to e}. Block e counts its expert's pairs.
__global__ void __launch_bounds__(kMoeDispatchThreads)
moe_dispatch_count_kernel(int* offsets, const int* expert, int pairs) {
  LAUNCH_BOUNDS_GUARD(kMoeDispatchThreads);
  __shared__ int warp_counts[kMoeDispatchWarps];
  const int e = blockIdx.x, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int count = 0;
  for (int i = threadIdx.x; i < pairs; i += kMoeDispatchThreads) count += expert[i] == e;
  for (int offset = 16; offset > 0; offset >>= 1) count += __shfl_xor_sync(0xffffffffu, count, offset);
  if (lane == 0) warp_counts[warp] = count;
  __syncthreads();
  if (threadIdx.x != 0) return;
  int total = 0;
  for (int w = 0; w < kMoeDispatchWarps; ++w) total += warp_counts[w];
  offsets[e + 1] = total;
}

// The counts into offsets: offsets[0] = 0, offsets[e + 1] = Σ_{e' <= e} counts. One thread (E is small).
__global__ void moe_dispatch_scan_kernel(int* offsets, int E) {
  offsets[0] = 0;
  for (int e = 1; e <= E; ++e) offsets[e] += offsets[e - 1];
}

// Block e walks the pairs in order, 256 at a time: a pair of its expert takes slot offsets[e] +
// the number of its expert's pairs before it (the earlier tiles', the lower warps' of this tile,
// the lower lanes' of its warp: a ballot).
__global__ void __launch_bounds__(kMoeDispatchThreads)
moe_dispatch_scatter_kernel(int* slot, int* token_of_slot, const int* offsets, const int* expert, int pairs, int K) {
  LAUNCH_BOUNDS_GUARD(kMoeDispatchThreads);
  __shared__ int warp_counts[kMoeDispatchWarps];
  const int e = blockIdx.x, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int base = offsets[e];
  for (int start = 0; start < pairs; start += kMoeDispatchThreads) {
    const int i = start + threadIdx.x;
    const bool mine = i < pairs && expert[i] == e;
    const unsigned votes = __ballot_sync(0xffffffffu, mine);
    if (lane == 0) warp_counts[warp] = __popc(votes);
    __syncthreads();
    int before = base, tile = 0;
    for (int w = 0; w < kMoeDispatchWarps; ++w) {
      if (w < warp) before += warp_counts[w];
      tile += warp_counts[w];
    }
    if (mine) {
      const int s = before + __popc(votes & ((1u << lane) - 1u));
      slot[i] = s;
      token_of_slot[s] = i / K;
    }
    base += tile;
    __syncthreads();  // warp_counts is rewritten by the next tile
  }
}

// xp[s] = x[token_of_slot[s]]: one thread per 128-bit chunk.
template <typename T>
__global__ void moe_permute_kernel(T* xp, const T* x, const int* token_of_slot, size_t chunks, int C) {
  constexpr int kVec = Vec128<T>::size;
  const size_t chunk = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (chunk >= chunks) return;
  const size_t per_row = static_cast<size_t>(C / kVec);
  const size_t s = chunk / per_row, j = chunk % per_row;
  const size_t token = static_cast<size_t>(token_of_slot[s]);
  store128(xp + chunk * kVec, load128(x + (token * per_row + j) * kVec));
}

// out[n] (+)= round(Σ_k gate[n][k]·rows[slot[n][k]]), k in increasing order, the old out added last
// (accumulate), rounded once; gate nullptr: every gate 1 (the same bits as a plain sum: x·1 = x).
// One thread per chunk of out. The combine and the backward of the permutation.
template <typename T>
__global__ void moe_gather_sum_kernel(T* out, const T* rows, const float* gate, const int* slot, size_t chunks, int K,
                                      int C, bool accumulate) {
  constexpr int kVec = Vec128<T>::size;
  const size_t chunk = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (chunk >= chunks) return;
  const size_t per_row = static_cast<size_t>(C / kVec);
  const size_t n = chunk / per_row, j = chunk % per_row;
  float acc[kVec];
  UNROLL for (int i = 0; i < kVec; ++i) acc[i] = 0.0f;
  for (int k = 0; k < K; ++k) {
    const float g = gate != nullptr ? gate[n * K + k] : 1.0f;
    const Vec128<T> v = load128(rows + (static_cast<size_t>(slot[n * K + k]) * per_row + j) * kVec);
    UNROLL for (int i = 0; i < kVec; ++i) acc[i] += g * to_float(v[i]);
  }
  Vec128<T> r;
  if (accumulate) {
    const Vec128<T> old = load128(out + chunk * kVec);
    UNROLL for (int i = 0; i < kVec; ++i) r[i] = from_float<T>(to_float(old[i]) + acc[i]);
  } else {
    UNROLL for (int i = 0; i < kVec; ++i) r[i] = from_float<T>(acc[i]);
  }
  store128(out + chunk * kVec, r);
}

// One warp per pair p = (n, k): dy[slot[p]] = round(gate[p]·dout[n]) and dgate[p] = Σ_c dout[n][c]·y[slot[p]][c]
// (lane l adds its chunks l, l + 32, ... in increasing order, then warp_sum).
template <typename T>
__global__ void moe_combine_backward_kernel(T* dy, float* dgate, const T* dout, const T* y, const float* gate,
                                            const int* slot, int pairs, int K, int C) {
  constexpr int kVec = Vec128<T>::size;
  const int p = blockIdx.x * kMoeDispatchWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (p >= pairs) return;  // whole warps leave together
  const size_t n = static_cast<size_t>(p / K), s = static_cast<size_t>(slot[p]);
  const float g = gate[p];
  float dot = 0.0f;
  for (int j = lane; j < C / kVec; j += 32) {
    const Vec128<T> d = load128(dout + n * C + j * kVec);
    const Vec128<T> v = load128(y + s * C + j * kVec);
    Vec128<T> r;
    UNROLL for (int i = 0; i < kVec; ++i) {
      dot += to_float(d[i]) * to_float(v[i]);
      r[i] = from_float<T>(g * to_float(d[i]));
    }
    store128(dy + s * C + j * kVec, r);
  }
  dot = warp_sum(dot);
  if (lane == 0) dgate[p] = dot;
}

inline void moe_dispatch_check(const char* op, int N, int K) {
  if (N < 0 || K < 1 || static_cast<long long>(N) * K > 0x7fffffff)
    throw_errorf("%s: need N>=0, K>=1 and N*K < 2^31; got N=%d K=%d", op, N, K);
}
template <typename T>
void moe_dispatch_check_width(const char* op, int C) {
  if (C < 1 || C % Vec128<T>::size != 0)
    throw_errorf("%s: need C a positive multiple of %d (128-bit accesses); got C=%d", op, Vec128<T>::size, C);
}

inline unsigned moe_dispatch_chunk_blocks(size_t chunks) {
  return static_cast<unsigned>(ceil_div(chunks, static_cast<size_t>(kMoeDispatchThreads)));
}

// The plan (all written): offsets (E + 1), slot[n][k] = where pair (n, k) goes, token_of_slot[s] =
// the token of slot s. A stable counting sort: expert e's slots hold its pairs in (n, k) order.
// Three launches (count, scan, place); each of the E blocks of the first and last reads all N·K
// expert indices.
inline void moe_dispatch_plan(int* offsets, int* slot, int* token_of_slot, const int* expert, int N, int E, int K,
                              cudaStream_t stream) {
  moe_dispatch_check("moe_dispatch_plan", N, K);
  if (K > E) throw_errorf("moe_dispatch_plan: need 1<=K<=E; got E=%d K=%d", E, K);
  const int pairs = N * K;
  launch(moe_dispatch_count_kernel, dim3(E), dim3(kMoeDispatchThreads), 0, stream, offsets, expert, pairs);
  CUDA_CHECK(cudaGetLastError());
  launch(moe_dispatch_scan_kernel, dim3(1), dim3(1), 0, stream, offsets, E);
  CUDA_CHECK(cudaGetLastError());
  launch(moe_dispatch_scatter_kernel, dim3(E), dim3(kMoeDispatchThreads), 0, stream, slot, token_of_slot,
         static_cast<const int*>(offsets), expert, pairs, K);
  CUDA_CHECK(cudaGetLastError());
}

// xp[s] = x[token_of_slot[s]] for the `slots` (= N·K) rows of xp: exact copies.
template <typename T>
void moe_permute(T* xp, const T* x, const int* token_of_slot, int slots, int C, cudaStream_t stream) {
  if (slots < 0) throw_errorf("moe_permute: need slots>=0; got slots=%d", slots);
  moe_dispatch_check_width<T>("moe_permute", C);
  const size_t chunks = static_cast<size_t>(slots) * (C / Vec128<T>::size);
  if (chunks == 0) return;
  launch(moe_permute_kernel<T>, dim3(moe_dispatch_chunk_blocks(chunks)), dim3(kMoeDispatchThreads), 0, stream, xp, x,
         token_of_slot, chunks, C);
  CUDA_CHECK(cudaGetLastError());
}

// out[n] = round(Σ_k gate[n][k]·y[slot[n][k]]) (written), fp32 in k order.
template <typename T>
void moe_combine(T* out, const T* y, const float* gate, const int* slot, int N, int K, int C, cudaStream_t stream) {
  moe_dispatch_check("moe_combine", N, K);
  moe_dispatch_check_width<T>("moe_combine", C);
  const size_t chunks = static_cast<size_t>(N) * (C / Vec128<T>::size);
  if (chunks == 0) return;
  launch(moe_gather_sum_kernel<T>, dim3(moe_dispatch_chunk_blocks(chunks)), dim3(kMoeDispatchThreads), 0, stream, out,
         y, gate, slot, chunks, K, C, false);
  CUDA_CHECK(cudaGetLastError());
}

// Backward of moe_combine (both written): dy[slot[n][k]] = round(gate[n][k]·dout[n]);
// dgate[n][k] = Σ_c dout[n][c]·y[slot[n][k]][c] in fp32.
template <typename T>
void moe_combine_backward(T* dy, float* dgate, const T* dout, const T* y, const float* gate, const int* slot, int N,
                          int K, int C, cudaStream_t stream) {
  moe_dispatch_check("moe_combine_backward", N, K);
  moe_dispatch_check_width<T>("moe_combine_backward", C);
  const int pairs = N * K;
  if (pairs == 0) return;
  launch(moe_combine_backward_kernel<T>, dim3(ceil_div(pairs, kMoeDispatchWarps)), dim3(kMoeDispatchThreads), 0,
         stream, dy, dgate, dout, y, gate, slot, pairs, K, C);
  CUDA_CHECK(cudaGetLastError());
}

// Backward of moe_permute: dx[n] = Σ_k dxp[slot[n][k]] (accumulate: dx[n] + that), fp32 in k order,
// rounded to T once.
template <typename T>
void moe_unpermute_sum(T* dx, const T* dxp, const int* slot, int N, int K, int C, bool accumulate,
                       cudaStream_t stream) {
  moe_dispatch_check("moe_unpermute_sum", N, K);
  moe_dispatch_check_width<T>("moe_unpermute_sum", C);
  const size_t chunks = static_cast<size_t>(N) * (C / Vec128<T>::size);
  if (chunks == 0) return;
  launch(moe_gather_sum_kernel<T>, dim3(moe_dispatch_chunk_blocks(chunks)), dim3(kMoeDispatchThreads), 0, stream, dx,
         dxp, static_cast<const float*>(nullptr), slot, chunks, K, C, accumulate);
  CUDA_CHECK(cudaGetLastError());
}
