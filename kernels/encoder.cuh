// encoder.cuh — GPT-2 input embedding: token embedding (wte) plus learned position
// embedding (wpe), and its backward pass into both tables.
//
// Layouts: tokens (B, seq_len) int; wte (Vp, C); wpe (maxT, C) with maxT >= seq_len;
// out/dout (B, seq_len, C). All rows move as 128-bit vectors, so C must be a multiple of
// 16 / sizeof(T) (4 floats, 8 bf16); the launchers exit with a message otherwise.
//
// Determinism of the backward pass: the rows of dout that feed one row of dwte are summed
// by ONE thread per 16-byte column chunk, in increasing position (b·seq_len + t) order,
// in fp32, and added to the stored gradient once. Grouping positions by token is done on
// the host (the trainer holds the tokens there): encoder_backward_build_buckets() writes a
// bucket list that the caller uploads (e.g. next to the step's input tokens, so the host
// buffer's lifetime is handled like theirs), then encoder_backward() consumes it.
#pragma once
#include "common.cuh"

#include <algorithm>
#include <numeric>
#include <vector>

// out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:]; one thread per 128-bit chunk of a row.
template <typename T>
__global__ void encoder_forward_kernel(T* out, const int* tokens, const T* wte, const T* wpe, int N, int seq_len,
                                       int C) {
  constexpr int kVec = Vec128<T>::size;
  const int chunks = C / kVec;
  const size_t idx = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= static_cast<size_t>(N) * chunks) return;
  const int position = static_cast<int>(idx / chunks);
  const int c = static_cast<int>(idx % chunks) * kVec;
  const int t = position % seq_len;
  const Vec128<T> token_row = load128(wte + static_cast<size_t>(tokens[position]) * C + c);
  const Vec128<T> position_row = load128(wpe + static_cast<size_t>(t) * C + c);
  Vec128<T> sum;
  for (int k = 0; k < kVec; ++k) sum[k] = from_float<T>(to_float(token_row[k]) + to_float(position_row[k]));
  store128(out + static_cast<size_t>(position) * C + c, sum);
}

// Bucket list (ints), for N = B·seq_len positions and U <= N distinct tokens (buckets):
//   [0, N)            token of bucket u, for u < U
//   [N, 2N+1)         start of bucket u's positions at N+u, its end at N+u+1
//   [2N+1, 3N+1)      positions (b·seq_len + t) of all buckets, increasing within a bucket
// Buckets are ordered by size, largest first, so the longest sums start first on the GPU.

// dwte[token of bucket u, chunk] += Σ dout[p, chunk] over the bucket's positions p, in order.
// grid = (buckets, chunk blocks); one thread per 128-bit column chunk.
template <typename T>
__global__ void encoder_backward_wte_kernel(T* dwte, const int* buckets, const T* dout, int N, int C) {
  constexpr int kVec = Vec128<T>::size;
  const int chunk = blockIdx.y * blockDim.x + threadIdx.x;
  if (chunk >= C / kVec) return;
  const int c = chunk * kVec;
  const int bucket = blockIdx.x;
  const int token = buckets[bucket];
  const int begin = buckets[N + bucket], end = buckets[N + bucket + 1];
  const int* positions = buckets + 2 * N + 1;
  float acc[kVec] = {};
  for (int k = begin; k < end; ++k) {
    const Vec128<T> g = load128(dout + static_cast<size_t>(positions[k]) * C + c);
    for (int i = 0; i < kVec; ++i) acc[i] += to_float(g[i]);
  }
  T* row = dwte + static_cast<size_t>(token) * C + c;
  Vec128<T> stored = load128(row);
  for (int i = 0; i < kVec; ++i) stored[i] = from_float<T>(to_float(stored[i]) + acc[i]);
  store128(row, stored);
}

// dwpe[t, chunk] += Σ_b dout[b, t, chunk], b increasing; one thread per (t, chunk).
template <typename T>
__global__ void encoder_backward_wpe_kernel(T* dwpe, const T* dout, int B, int seq_len, int C) {
  constexpr int kVec = Vec128<T>::size;
  const int chunks = C / kVec;
  const int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= seq_len * chunks) return;
  const int t = idx / chunks;
  const int c = (idx % chunks) * kVec;
  float acc[kVec] = {};
  for (int b = 0; b < B; ++b) {
    const Vec128<T> g = load128(dout + (static_cast<size_t>(b) * seq_len + t) * C + c);
    for (int i = 0; i < kVec; ++i) acc[i] += to_float(g[i]);
  }
  T* row = dwpe + static_cast<size_t>(t) * C + c;
  Vec128<T> stored = load128(row);
  for (int i = 0; i < kVec; ++i) stored[i] = from_float<T>(to_float(stored[i]) + acc[i]);
  store128(row, stored);
}

template <typename T>
void encoder_check_shape(const char* op, int B, int seq_len, int C) {
  if (B < 1 || seq_len < 1 || C < 1 || C % Vec128<T>::size != 0) {
    throw_errorf("%s: need B>=1, seq_len>=1 and C a positive multiple of %d (128-bit accesses); got B=%d "
                 "seq_len=%d C=%d", op, Vec128<T>::size, B, seq_len, C);
  }
}

constexpr int kEncoderBlock = 256;

// out (B, seq_len, C) = wte[tokens] + wpe[0..seq_len) (sum in fp32, rounded to T once).
// tokens is a device array of B·seq_len ids, each in [0, rows of wte).
template <typename T>
void encoder_forward(T* out, const int* tokens, const T* wte, const T* wpe, int B, int seq_len, int C,
                     cudaStream_t stream) {
  encoder_check_shape<T>("encoder_forward", B, seq_len, C);
  const size_t threads = static_cast<size_t>(B) * seq_len * (C / Vec128<T>::size);
  const size_t blocks = ceil_div(threads, static_cast<size_t>(kEncoderBlock));
  launch(encoder_forward_kernel<T>, dim3(static_cast<unsigned>(blocks)), dim3(kEncoderBlock), 0, stream, out, tokens,
         wte, wpe, B * seq_len, seq_len, C);
  CUDA_CHECK(cudaGetLastError());
}

// Size in bytes of the bucket list for B·seq_len positions (the same on host and device).
inline size_t encoder_backward_scratch_bytes(int B, int seq_len) {
  return (3 * static_cast<size_t>(B) * seq_len + 1) * sizeof(int);
}

// Host: groups the positions of tokens_host (B·seq_len ids) by token into buckets_host
// (encoder_backward_scratch_bytes(B, seq_len) bytes; layout above) and returns the number
// of buckets. Exits with a message if a token is outside [0, vocab_size). The caller copies
// buckets_host to a device buffer of the same size before encoder_backward runs.
inline int encoder_backward_build_buckets(int* buckets_host, const int* tokens_host, int B, int seq_len,
                                          int vocab_size) {
  const int N = B * seq_len;
  for (int p = 0; p < N; ++p) {
    if (tokens_host[p] < 0 || tokens_host[p] >= vocab_size) {
      throw_errorf("encoder_backward: token %d at position %d is outside [0, %d)", tokens_host[p], p,
                   vocab_size);
    }
  }
  // Positions sorted by token; the stable sort keeps increasing position order per token.
  std::vector<int> by_token(N);
  std::iota(by_token.begin(), by_token.end(), 0);
  std::stable_sort(by_token.begin(), by_token.end(),
                   [&](int a, int b) { return tokens_host[a] < tokens_host[b]; });
  std::vector<int> run_starts;  // where each token's run begins in by_token, plus N at the end
  for (int k = 0; k < N; ++k)
    if (k == 0 || tokens_host[by_token[k]] != tokens_host[by_token[k - 1]]) run_starts.push_back(k);
  const int buckets = static_cast<int>(run_starts.size());
  run_starts.push_back(N);
  std::vector<int> order(buckets);  // runs by size, largest first; ties by token id
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return run_starts[a + 1] - run_starts[a] > run_starts[b + 1] - run_starts[b];
  });
  int* bucket_tokens = buckets_host;
  int* bucket_starts = buckets_host + N;
  int* positions = buckets_host + 2 * N + 1;
  std::fill(buckets_host, buckets_host + 3 * static_cast<size_t>(N) + 1, 0);
  int next = 0;
  for (int u = 0; u < buckets; ++u) {
    const int run = order[u];
    bucket_tokens[u] = tokens_host[by_token[run_starts[run]]];
    bucket_starts[u] = next;
    for (int k = run_starts[run]; k < run_starts[run + 1]; ++k) positions[next++] = by_token[k];
  }
  bucket_starts[buckets] = next;
  return buckets;
}

// Backward of encoder_forward. ACCUMULATES into the parameter gradients:
//   dwte[v,:] += Σ dout[b,t,:] over positions with tokens[b,t] == v  (rows of unused tokens untouched)
//   dwpe[t,:] += Σ_b dout[b,t,:]                                     for t < seq_len
// Each sum is formed in fp32 in increasing position order and added to the stored value
// once (one rounding to T). buckets is the device copy of encoder_backward_build_buckets'
// output and num_buckets its return value.
template <typename T>
void encoder_backward(T* dwte, T* dwpe, const int* buckets, int num_buckets, const T* dout, int B, int seq_len, int C,
                      cudaStream_t stream) {
  encoder_check_shape<T>("encoder_backward", B, seq_len, C);
  const int chunks = C / Vec128<T>::size;
  const int wte_block = std::min(ceil_div(chunks, 32) * 32, kEncoderBlock);
  launch(encoder_backward_wte_kernel<T>, dim3(num_buckets, ceil_div(chunks, wte_block)), dim3(wte_block), 0, stream,
         dwte, buckets, dout, B * seq_len, C);
  CUDA_CHECK(cudaGetLastError());
  launch(encoder_backward_wpe_kernel<T>, dim3(ceil_div(seq_len * chunks, kEncoderBlock)), dim3(kEncoderBlock), 0,
         stream, dwpe, dout, B, seq_len, C);
  CUDA_CHECK(cudaGetLastError());
}
