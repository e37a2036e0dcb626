// encoder.cuh — GPT-2 input embedding: token embedding (wte) plus learned position
// embedding (wpe), and its backward pass into both tables.
//
// Layouts: tokens (B, seq_len) int; wte (Vp, C); wpe (maxT, C) with maxT >= seq_len;
// out/dout (B, seq_len, C). All rows move as 128-bit vectors, so C must be a multiple of
// 16 / sizeof(T) (4 floats, 8 bf16); the launchers exit with a message otherwise.
// Vocabulary parallelism: a rank may hold a slice of wte, the rows of tokens [vocab_begin,
// vocab_begin + rows); its forward adds only the tokens in the slice (0 for the others) and
// its backward writes only the slice's rows of dwte.
//
// Determinism of the backward pass: the rows of dout that feed one row of dwte (a token's
// bucket of positions) are summed in fp32 in an order fixed by the tokens alone, and added to the
// stored gradient once. A bucket is cut into segments of kEncoderSegment positions (the last
// may be shorter); one block sums each segment, a thread per 16-byte column chunk, in increasing
// position (b·seq_len + t) order. A bucket of one segment is added to dwte by that block; the
// segments of a larger bucket ("split": "," or " the", up to ~5,000 of d12's 65,536
// positions on the default corpus) write rows of fp32 partial sums in parallel, and a second
// kernel adds each split bucket's rows in segment order. So a hot token is walked by many warps,
// not by one block serially. Grouping positions by token is done on the host (the trainer holds
// the tokens there): encoder_backward_build_buckets() writes a bucket list that the caller
// uploads (e.g. next to the step's input tokens, so the host buffer's lifetime is handled like
// theirs), then encoder_backward() consumes it.
#pragma once
#include "common.cuh"

#include <algorithm>
#include <climits>
#include <numeric>
#include <vector>

// out[b,t,:] = (wte[tokens[b,t] - vocab_begin,:] if that row is in [0, vocab_rows), else 0)
// + (wpe[t,:] if wpe, else 0); one thread per 128-bit chunk of a row.
template <typename T>
__global__ void encoder_forward_kernel(T* out, const int* tokens, const T* wte, const T* wpe, int N, int seq_len,
                                       int C, int vocab_begin, int vocab_rows) {
  constexpr int kVec = Vec128<T>::size;
  const int chunks = C / kVec;
  const size_t idx = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= static_cast<size_t>(N) * chunks) return;
  const int position = static_cast<int>(idx / chunks);
  const int c = static_cast<int>(idx % chunks) * kVec;
  const int t = position % seq_len;
  const int row = tokens[position] - vocab_begin;
  float sum[kVec] = {};
  if (row >= 0 && row < vocab_rows) {
    const Vec128<T> token_row = load128(wte + static_cast<size_t>(row) * C + c);
    for (int k = 0; k < kVec; ++k) sum[k] = to_float(token_row[k]);
  }
  if (wpe != nullptr) {
    const Vec128<T> position_row = load128(wpe + static_cast<size_t>(t) * C + c);
    for (int k = 0; k < kVec; ++k) sum[k] += to_float(position_row[k]);
  }
  Vec128<T> rounded;
  for (int k = 0; k < kVec; ++k) rounded[k] = from_float<T>(sum[k]);
  store128(out + static_cast<size_t>(position) * C + c, rounded);
}

// Positions per segment of a bucket: the most one block walks serially. A block's thread
// keeps ~4 row loads in flight, so a segment takes ~32 memory latencies (~15 µs on an H100),
// well inside the ~35 µs the whole d12 sum (100 MB of dout) needs at full bandwidth.
constexpr int kEncoderSegment = 128;

// The most buckets of more than kEncoderSegment positions ("split") N positions can hold.
__host__ __device__ inline int encoder_backward_max_split_buckets(int N) { return N / (kEncoderSegment + 1); }

// Bucket list (ints), for N = B·seq_len positions, S = kEncoderSegment, M =
// encoder_backward_max_split_buckets(N), and `segments` <= N segments:
//   [0]                  D <= M: split buckets (more than S positions)
//   [1]                  P: segments of the split buckets
//   [2, 2+N)             token of segment k, for k < segments (relative to a vocabulary slice's first)
//   [2+N, 3+2N)          start of segment k's positions at 2+N+k, its end at 2+N+k+1
//   [3+2N, 3+3N)         positions (b·seq_len + t) of all buckets, increasing within a bucket (a
//                        vocabulary slice's buckets hold only its tokens' positions: zeros follow)
//   [3+3N, 4+3N+M)       first segment of split bucket j at 3+3N+j, its end at 3+3N+j+1
// Buckets are ordered by size, largest first, so the longest sums start first on the GPU and the
// split buckets come first: their segments are [0, P), segment k < P writing row k of partials.
template <typename Int>  // int where the host writes the list, const int where kernels read it
struct EncoderBucketList {
  Int* header;          // D, P
  Int* segment_tokens;  // N
  Int* segment_starts;  // N + 1
  Int* positions;       // N
  Int* split_starts;    // M + 1
  __host__ __device__ EncoderBucketList(Int* list, int N)
      : header(list),
        segment_tokens(list + 2),
        segment_starts(segment_tokens + N),
        positions(segment_starts + N + 1),
        split_starts(positions + N) {}
};

// row[0, kVec) += acc in fp32, rounded to T once: the one write of a gradient row's chunk.
template <typename T>
__device__ __forceinline__ void encoder_add_to_row(T* row, const float* acc) {
  Vec128<T> stored = load128(row);
  for (int i = 0; i < Vec128<T>::size; ++i) stored[i] = from_float<T>(to_float(stored[i]) + acc[i]);
  store128(row, stored);
}

// Segment k = blockIdx.x: acc = Σ dout[p, chunk] over its positions p, in order; then
// dwte[token, chunk] += acc, or, for a segment of a split bucket (k < P), partials[k, chunk] = acc
// (partials: P × C fp32). grid = (segments, chunk blocks); one thread per 128-bit column chunk.
template <typename T>
__global__ void encoder_backward_wte_kernel(T* dwte, float* partials, const int* buckets, const T* dout, int N, int C) {
  constexpr int kVec = Vec128<T>::size, kFloatVec = Vec128<float>::size;
  const int chunk = blockIdx.y * blockDim.x + threadIdx.x;
  if (chunk >= C / kVec) return;
  const int c = chunk * kVec;
  const EncoderBucketList<const int> list(buckets, N);
  const int segment = blockIdx.x;
  const int begin = list.segment_starts[segment], end = list.segment_starts[segment + 1];
  float acc[kVec] = {};
  for (int k = begin; k < end; ++k) {
    const Vec128<T> g = load128(dout + static_cast<size_t>(list.positions[k]) * C + c);
    for (int i = 0; i < kVec; ++i) acc[i] += to_float(g[i]);
  }
  if (segment >= list.header[1]) {
    encoder_add_to_row(dwte + static_cast<size_t>(list.segment_tokens[segment]) * C + c, acc);
    return;
  }
  float* row = partials + static_cast<size_t>(segment) * C + c;
  for (int j = 0; j < kVec; j += kFloatVec) {
    Vec128<float> v;
    for (int e = 0; e < kFloatVec; ++e) v[e] = acc[j + e];
    store128(row + j, v);
  }
}

// Split bucket j = blockIdx.x: dwte[token, chunk] += Σ of its segments' partial rows, in segment
// order. grid = (encoder_backward_max_split_buckets(N), chunk blocks): the launcher knows the
// shape, not the tokens, so blocks past the list's D return at once.
template <typename T>
__global__ void encoder_backward_wte_combine_kernel(T* dwte, const float* partials, const int* buckets, int N, int C) {
  constexpr int kVec = Vec128<T>::size, kFloatVec = Vec128<float>::size;
  const int chunk = blockIdx.y * blockDim.x + threadIdx.x;
  const EncoderBucketList<const int> list(buckets, N);
  const int split = blockIdx.x;
  if (chunk >= C / kVec || split >= list.header[0]) return;
  const int c = chunk * kVec;
  const int first = list.split_starts[split], end = list.split_starts[split + 1];
  float acc[kVec] = {};
  for (int row = first; row < end; ++row)
    for (int j = 0; j < kVec; j += kFloatVec) {
      const Vec128<float> p = load128(partials + static_cast<size_t>(row) * C + c + j);
      for (int e = 0; e < kFloatVec; ++e) acc[j + e] += p[e];
    }
  encoder_add_to_row(dwte + static_cast<size_t>(list.segment_tokens[first]) * C + c, acc);
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
  encoder_add_to_row(dwpe + static_cast<size_t>(t) * C + c, acc);
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
// A slice of the vocabulary (vocab parallelism): wte holds the vocab_rows rows of tokens
// [vocab_begin, vocab_begin + vocab_rows) (vocab_rows = -1: every token from vocab_begin on), and a
// position whose token is outside them takes 0 from wte; wpe == nullptr adds no position
// embedding (a rank that leaves it to another). The partial outputs of slices covering the
// vocabulary, one of them with wpe, sum to the full forward.
template <typename T>
void encoder_forward(T* out, const int* tokens, const T* wte, const T* wpe, int B, int seq_len, int C,
                     cudaStream_t stream, int vocab_begin = 0, int vocab_rows = -1) {
  encoder_check_shape<T>("encoder_forward", B, seq_len, C);
  if (vocab_begin < 0 || vocab_rows < -1) {
    throw_errorf("encoder_forward: need vocab_begin >= 0 and vocab_rows >= 0 (or -1: all of wte); got "
                 "vocab_begin=%d vocab_rows=%d", vocab_begin, vocab_rows);
  }
  const size_t threads = static_cast<size_t>(B) * seq_len * (C / Vec128<T>::size);
  const size_t blocks = ceil_div(threads, static_cast<size_t>(kEncoderBlock));
  launch(encoder_forward_kernel<T>, dim3(static_cast<unsigned>(blocks)), dim3(kEncoderBlock), 0, stream, out, tokens,
         wte, wpe, B * seq_len, seq_len, C, vocab_begin, vocab_rows < 0 ? INT_MAX : vocab_rows);
  CUDA_CHECK(cudaGetLastError());
}

// Size in bytes of the bucket list for B·seq_len positions (the same on host and device).
inline size_t encoder_backward_buckets_bytes(int B, int seq_len) {
  const size_t N = static_cast<size_t>(B) * seq_len;
  return (3 * N + encoder_backward_max_split_buckets(static_cast<int>(N)) + 4) * sizeof(int);
}

// Bytes of fp32 scratch encoder_backward needs: a row of C partial sums per segment of a split
// bucket. A bucket of n > kEncoderSegment positions has ceil(n / S) <= 2·floor(n / S) segments,
// so there are at most 2·floor(N / S) rows.
inline size_t encoder_backward_scratch_bytes(int B, int seq_len, int C) {
  return 2 * (static_cast<size_t>(B) * seq_len / kEncoderSegment) * C * sizeof(float);
}

// Kernel launches per encoder_backward (--profile's plan): segments, their combination where
// B·seq_len positions can hold a split bucket, positions (with_wpe: a dwpe to write). A slice of
// the vocabulary that no position's token falls in (segments == 0) launches neither wte kernel.
inline int encoder_backward_launches(int B, int seq_len, bool with_wpe = true) {
  return 1 + (encoder_backward_max_split_buckets(B * seq_len) > 0 ? 1 : 0) + (with_wpe ? 1 : 0);
}

// Host: groups the positions of tokens_host (B·seq_len ids) by token into buckets_host
// (encoder_backward_buckets_bytes(B, seq_len) bytes; layout above) and returns the number of
// segments. Exits with a message if a token is outside [0, vocab_size). The caller copies
// buckets_host to a device buffer of the same size before encoder_backward runs.
// A slice of the vocabulary (vocab parallelism: dwte holds the rows of tokens
// [vocab_begin, vocab_end); vocab_end = -1: vocab_size): positions whose token is outside it are
// left out of the list, and segment tokens are stored relative to vocab_begin, so
// encoder_backward writes rows [0, vocab_end - vocab_begin) of the slice's dwte. The segments
// returned are the kept ones; 0 when no token falls in the slice. vocab_end may pass vocab_size
// (the slice holding the padded vocabulary's last rows).
inline int encoder_backward_build_buckets(int* buckets_host, const int* tokens_host, int B, int seq_len,
                                          int vocab_size, int vocab_begin = 0, int vocab_end = -1) {
  const int N = B * seq_len;
  if (vocab_end == -1) vocab_end = vocab_size;
  if (vocab_begin < 0 || vocab_end < vocab_begin) {
    throw_errorf("encoder_backward: need 0 <= vocab_begin <= vocab_end (or vocab_end = -1: the vocabulary size); "
                 "got vocab_begin=%d vocab_end=%d", vocab_begin, vocab_end);
  }
  for (int p = 0; p < N; ++p) {
    if (tokens_host[p] < 0 || tokens_host[p] >= vocab_size) {
      throw_errorf("encoder_backward: token %d at position %d is outside [0, %d)", tokens_host[p], p,
                   vocab_size);
    }
  }
  // The slice's positions sorted by token; the stable sort keeps increasing position order per token.
  std::vector<int> by_token;
  by_token.reserve(N);
  for (int p = 0; p < N; ++p)
    if (tokens_host[p] >= vocab_begin && tokens_host[p] < vocab_end) by_token.push_back(p);
  const int kept = static_cast<int>(by_token.size());
  std::stable_sort(by_token.begin(), by_token.end(),
                   [&](int a, int b) { return tokens_host[a] < tokens_host[b]; });
  std::vector<int> run_starts;  // where each token's run begins in by_token, plus kept at the end
  for (int k = 0; k < kept; ++k)
    if (k == 0 || tokens_host[by_token[k]] != tokens_host[by_token[k - 1]]) run_starts.push_back(k);
  const int buckets = static_cast<int>(run_starts.size());
  run_starts.push_back(kept);
  std::vector<int> order(buckets);  // runs by size, largest first; ties by token id
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return run_starts[a + 1] - run_starts[a] > run_starts[b + 1] - run_starts[b];
  });
  std::fill(buckets_host, buckets_host + encoder_backward_buckets_bytes(B, seq_len) / sizeof(int), 0);
  const EncoderBucketList<int> list(buckets_host, N);
  int segments = 0, split = 0, split_segments = 0, next = 0;
  for (int u = 0; u < buckets; ++u) {
    const int run = order[u], size = run_starts[run + 1] - run_starts[run];
    const int token = tokens_host[by_token[run_starts[run]]] - vocab_begin;
    if (size > kEncoderSegment) list.split_starts[split++] = segments;
    for (int k = 0; k < size; k += kEncoderSegment) {
      list.segment_tokens[segments] = token;
      list.segment_starts[segments++] = next + k;
    }
    if (size > kEncoderSegment) split_segments = segments;  // largest first: split buckets precede the rest
    for (int k = run_starts[run]; k < run_starts[run + 1]; ++k) list.positions[next++] = by_token[k];
  }
  list.segment_starts[segments] = next;
  list.split_starts[split] = split_segments;
  list.header[0] = split;
  list.header[1] = split_segments;
  return segments;
}

// Backward of encoder_forward. ACCUMULATES into the parameter gradients:
//   dwte[v,:] += Σ dout[b,t,:] over positions with tokens[b,t] == v  (rows of unused tokens untouched)
//   dwpe[t,:] += Σ_b dout[b,t,:]                                     for t < seq_len
// Each sum is formed in fp32 in the fixed order above (dwpe: b increasing) and added to the
// stored value once (one rounding to T). buckets is the device copy of
// encoder_backward_build_buckets' output and segments its return value; scratch holds
// encoder_backward_scratch_bytes(B, seq_len, C) bytes (contents overwritten). For a slice of the
// vocabulary, dwte is the slice's rows and v the token relative to the slice's first (the bucket
// list says so); segments == 0 (no token in the slice) leaves dwte alone and launches nothing for
// it. dwpe == nullptr leaves the position gradient to another caller (no launch).
template <typename T>
void encoder_backward(T* dwte, T* dwpe, float* scratch, const int* buckets, int segments, const T* dout, int B,
                      int seq_len, int C, cudaStream_t stream) {
  encoder_check_shape<T>("encoder_backward", B, seq_len, C);
  const int N = B * seq_len, chunks = C / Vec128<T>::size;
  const int wte_block = std::min(ceil_div(chunks, 32) * 32, kEncoderBlock);
  const int chunk_blocks = ceil_div(chunks, wte_block);
  if (segments > 0) {
    launch(encoder_backward_wte_kernel<T>, dim3(segments, chunk_blocks), dim3(wte_block), 0, stream, dwte, scratch,
           buckets, dout, N, C);
    CUDA_CHECK(cudaGetLastError());
    if (encoder_backward_max_split_buckets(N) > 0) {
      launch(encoder_backward_wte_combine_kernel<T>, dim3(encoder_backward_max_split_buckets(N), chunk_blocks),
             dim3(wte_block), 0, stream, dwte, scratch, buckets, N, C);
      CUDA_CHECK(cudaGetLastError());
    }
  }
  if (dwpe != nullptr) {
    launch(encoder_backward_wpe_kernel<T>, dim3(ceil_div(seq_len * chunks, kEncoderBlock)), dim3(kEncoderBlock), 0,
           stream, dwpe, dout, B, seq_len, C);
    CUDA_CHECK(cudaGetLastError());
  }
}
