// ring_attention.cuh — blockwise attention for context parallelism (ring attention): one query
// block attending to one key/value block under a mask kind, the log-sum-exp merge of the blocks'
// partial results, the blockwise backward, the ring's buffer copies (K/V packed out of qkv, dqkv
// assembled from fp32 gradients, accumulators added) and the zigzag layout's causal work per rank.
//
// Tensors: q comes from the query block's fused qkv (B, Tq, (NH + 2·NKV)·HS) as the model has it
// (its own k and v channels are not read); the key/value block is kv (B, Tk, 2·NKV·HS), each row
// its NKV key heads then its NKV value heads: only the K/V heads travel around the ring (GQA:
// query head h reads K/V head h / (NH / NKV)). Block outputs are (B, Tq, NH·HS) and lse (B, NH, Tq)
// fp32, as in attention.cuh; gradients accumulate (+=) in fp32 into dq (B, Tq, NH·HS) and dkv
// (kv's layout).
//
// Mask kinds: full (every key of the block is visible: the key block lies wholly before the
// query block) and causal_diagonal (the two blocks are the same positions, Tq == Tk: row i sees
// keys 0..i). A key block wholly after the query block is simply not launched.
//
// Two implementations, both bitwise reproducible. ring_attention_*: attention.cuh's kernels (one
// warp per row, its row functions and lane split) with keys and queries bounded by the mask kind
// instead of the causal prefix: float and bf16, every head size attention.cuh takes.
// ring_flash_attention_*: flash_attention.cuh's tensor-core kernels instantiated for a K/V block
// (FlashKeys::block_diagonal, block_full): bf16, head sizes 16, 32, 64, 128, block outputs in fp32.
// docs/ATTENTION.md, "Blockwise attention for context parallelism", has the merge and the zigzag.
#pragma once
#include <cstdint>

#include "attention.cuh"
#include "flash_attention.cuh"

enum class AttentionBlockMask { full, causal_diagonal };

// Stores this lane's V fp32 values as OutT (OutT float or the input type: V is a whole number of
// OutT's 16-byte chunks).
template <typename OutT, int V>
__device__ __forceinline__ void ring_store_floats(OutT* dst, const float x[V]) {
  constexpr int W = Vec128<OutT>::size;
  static_assert(V % W == 0, "block output: fp32 or the input type");
  for (int j = 0; j < V; j += W) {
    Vec128<OutT> o;
    for (int i = 0; i < W; ++i) o[i] = from_float<OutT>(x[j + i]);
    store128(dst + j, o);
  }
}

// dst[0..V) += x (fp32): the only writer of these elements, so the sum's order is the launch order.
template <int V>
__device__ __forceinline__ void ring_accumulate_floats(float* dst, const float x[V], float scale) {
  constexpr int W = Vec128<float>::size;
  for (int j = 0; j < V; j += W) {
    Vec128<float> a = load128(dst + j);
    for (int i = 0; i < W; ++i) a[i] += x[j + i] * scale;
    store128(dst + j, a);
  }
}

// One warp per (b, h, t) of the query block: softmax over the keys the mask leaves.
template <typename T, typename OutT>
__global__ void ring_attention_forward_kernel(OutT* out, float* lse, const T* qkv, const T* kv, int B, int Tq, int Tk,
                                              int NH, int NKV, int head_size, float scale, AttentionBlockMask mask) {
  constexpr int V = Vec128<T>::size;
  int warp = blockIdx.x * kAttentionWarpsPerBlock + static_cast<int>(threadIdx.x) / 32;
  if (warp >= B * NH * Tq) return;
  int t = Tq - 1 - warp % Tq;  // under causal_diagonal the long prefixes go first
  int h = (warp / Tq) % NH, b = warp / Tq / NH;
  int C = NH * head_size, kv_C = NKV * head_size;
  size_t q_stride = static_cast<size_t>(C) + 2 * kv_C, kv_stride = 2 * static_cast<size_t>(kv_C);
  AttentionLane lane = attention_lane(head_size, V);

  float q[V];
  attention_load_floats<T>(q, qkv + (static_cast<size_t>(b) * Tq + t) * q_stride + h * head_size + lane.chunk * V,
                           lane.owns_chunk);
  const T* k_chunk = kv + static_cast<size_t>(b) * Tk * kv_stride + h / (NH / NKV) * head_size + lane.chunk * V;
  int key_count = mask == AttentionBlockMask::full ? Tk : t + 1;
  AttentionOnlineSoftmax<V> softmax = attention_row_softmax<T>(q, k_chunk, k_chunk + kv_C, kv_stride, key_count, lane,
                                                               scale);

  if (lane.group == 0 && lane.owns_chunk) {
    float o[V];
    float inv_sum = 1.0f / softmax.running_sum;
    for (int i = 0; i < V; ++i) o[i] = softmax.acc[i] * inv_sum;
    ring_store_floats<OutT, V>(out + (static_cast<size_t>(b) * Tq + t) * C + h * head_size + lane.chunk * V, o);
  }
  if (threadIdx.x % 32 == 0)
    lse[(static_cast<size_t>(b) * NH + h) * Tq + t] = softmax.running_max + logf(softmax.running_sum);
}

// One warp per (b, h, t): (out, lse) of the row := their merge with the block's (out_b, lse_b).
// A row with lse = -inf has seen no key: its out is not read (it may be anything) and it takes
// weight 0; two such rows give lse = -inf and out = 0.
template <typename BlockT>
__global__ void ring_attention_merge_kernel(float* out, float* lse, const BlockT* out_b, const float* lse_b, int B,
                                            int T, int NH, int head_size) {
  constexpr int V = Vec128<BlockT>::size;
  int warp = blockIdx.x * kAttentionWarpsPerBlock + static_cast<int>(threadIdx.x) / 32;
  if (warp >= B * NH * T) return;
  int t = warp % T, h = (warp / T) % NH, b = warp / T / NH;
  size_t lse_at = (static_cast<size_t>(b) * NH + h) * T + t;
  float a = lse[lse_at], a_b = lse_b[lse_at];
  float m = fmaxf(a, a_b);
  // log(e^a + e^a_b) = m + log(1 + e^-|a - a_b|): no overflow, and m exactly when one side is -inf.
  float merged = m == -INFINITY ? -INFINITY : m + log1pf(expf(-fabsf(a - a_b)));
  float w = a == -INFINITY ? 0.0f : expf(a - merged);
  float w_b = a_b == -INFINITY ? 0.0f : expf(a_b - merged);
  int lane = static_cast<int>(threadIdx.x) % 32;
  for (int c = lane * V; c < head_size; c += 32 * V) {
    size_t at = (static_cast<size_t>(b) * T + t) * NH * head_size + h * head_size + c;
    Vec128<BlockT> ob = load128(out_b + at);
    for (int j = 0; j < V; j += Vec128<float>::size) {
      Vec128<float> o = load128(out + at + j);
      for (int i = 0; i < Vec128<float>::size; ++i) {
        float mine = w == 0.0f ? 0.0f : w * o[i];  // not 0 · NaN for a row that saw no key
        float theirs = w_b == 0.0f ? 0.0f : w_b * to_float(ob[j + i]);
        o[i] = mine + theirs;
      }
      store128(out + at + j, o);
    }
  }
  __syncwarp();  // every lane has read lse before lane 0 overwrites it
  if (lane == 0) lse[lse_at] = merged;
}

// Every element of a fp32 buffer set to `value`; rounding fp32 to T (one element per thread).
__global__ void ring_attention_fill_kernel(float* x, size_t n, float value) {
  size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] = value;
}
template <typename T>
__global__ void ring_attention_round_kernel(T* dst, const float* src, size_t n) {
  size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = from_float<T>(src[i]);
}

// One warp per (b, h, t) of the query block: D_t = dout_t · out_t into delta (the final out) and
// dq_t += scale · sum_s P_ts (dout_t · v_s - D_t) k_s over the block's visible keys.
template <typename T>
__global__ void ring_attention_backward_query_kernel(float* dq, float* delta, const T* dout, const T* qkv,
                                                     const T* out, const float* lse, const T* kv, int B, int Tq,
                                                     int Tk, int NH, int NKV, int head_size, float scale,
                                                     AttentionBlockMask mask) {
  constexpr int V = Vec128<T>::size;
  int warp = blockIdx.x * kAttentionWarpsPerBlock + static_cast<int>(threadIdx.x) / 32;
  if (warp >= B * NH * Tq) return;
  int t = Tq - 1 - warp % Tq;
  int h = (warp / Tq) % NH, b = warp / Tq / NH;
  int C = NH * head_size, kv_C = NKV * head_size;
  size_t q_stride = static_cast<size_t>(C) + 2 * kv_C, kv_stride = 2 * static_cast<size_t>(kv_C);
  size_t bh_row = (static_cast<size_t>(b) * NH + h) * Tq;
  AttentionLane lane = attention_lane(head_size, V);

  size_t out_row = (static_cast<size_t>(b) * Tq + t) * C + h * head_size + lane.chunk * V;
  float q[V], dout_t[V], out_t[V];
  attention_load_floats<T>(q, qkv + (static_cast<size_t>(b) * Tq + t) * q_stride + h * head_size + lane.chunk * V,
                           lane.owns_chunk);
  attention_load_floats<T>(dout_t, dout + out_row, lane.owns_chunk);
  attention_load_floats<T>(out_t, out + out_row, lane.owns_chunk);
  float row_delta = attention_row_delta<V>(dout_t, out_t, lane.group_lanes);
  if (threadIdx.x % 32 == 0) delta[bh_row + t] = row_delta;

  const T* k_chunk = kv + static_cast<size_t>(b) * Tk * kv_stride + h / (NH / NKV) * head_size + lane.chunk * V;
  int key_count = mask == AttentionBlockMask::full ? Tk : t + 1;
  float g[V];
  attention_row_dq<T>(g, q, dout_t, lse[bh_row + t], row_delta, k_chunk, k_chunk + kv_C, kv_stride, key_count, lane,
                      scale);
  if (lane.group == 0 && lane.owns_chunk) ring_accumulate_floats<V>(dq + out_row, g, scale);
}

// One warp per (b, K/V head, s) of the key/value block: dk_s, dv_s += the sums over the group's
// query heads (ascending) and the block's queries that see key s (all, or t >= s on the diagonal).
template <typename T>
__global__ void ring_attention_backward_key_value_kernel(float* dkv, const float* delta, const T* dout, const T* qkv,
                                                         const float* lse, const T* kv, int B, int Tq, int Tk, int NH,
                                                         int NKV, int head_size, float scale,
                                                         AttentionBlockMask mask) {
  constexpr int V = Vec128<T>::size;
  int warp = blockIdx.x * kAttentionWarpsPerBlock + static_cast<int>(threadIdx.x) / 32;
  if (warp >= B * NKV * Tk) return;
  int s = warp % Tk;
  int kv_h = (warp / Tk) % NKV, b = warp / Tk / NKV;
  int C = NH * head_size, kv_C = NKV * head_size, group = NH / NKV;
  size_t q_stride = static_cast<size_t>(C) + 2 * kv_C, kv_stride = 2 * static_cast<size_t>(kv_C);
  AttentionLane lane = attention_lane(head_size, V);

  size_t k_at = (static_cast<size_t>(b) * Tk + s) * kv_stride + kv_h * head_size + lane.chunk * V;
  float k[V], v[V];
  attention_load_floats<T>(k, kv + k_at, lane.owns_chunk);
  attention_load_floats<T>(v, kv + k_at + kv_C, lane.owns_chunk);

  float dk[V], dv[V];
  for (int i = 0; i < V; ++i) dk[i] = dv[i] = 0.0f;
  int first_query = mask == AttentionBlockMask::full ? 0 : s;
  for (int h = kv_h * group; h < (kv_h + 1) * group; ++h) {
    size_t bh_row = (static_cast<size_t>(b) * NH + h) * Tq;
    const T* q_chunk = qkv + static_cast<size_t>(b) * Tq * q_stride + h * head_size + lane.chunk * V;
    const T* dout_chunk = dout + static_cast<size_t>(b) * Tq * C + h * head_size + lane.chunk * V;
    attention_key_value_accumulate<T>(dk, dv, k, v, q_chunk, q_stride, dout_chunk, C, lse + bh_row, delta + bh_row,
                                      first_query, Tq, lane, scale);
  }
  for (int i = 0; i < V; ++i) {
    dk[i] = attention_across_groups_sum(dk[i], lane.group_lanes);
    dv[i] = attention_across_groups_sum(dv[i], lane.group_lanes);
  }
  if (lane.group == 0 && lane.owns_chunk) {
    ring_accumulate_floats<V>(dkv + k_at, dk, scale);
    ring_accumulate_floats<V>(dkv + k_at + kv_C, dv, 1.0f);
  }
}

// Shape checks of the blockwise calls (attention_check's, plus the key block); returns HS.
inline int ring_attention_check(const char* who, int B, int Tq, int Tk, int C, int NH, int NKV,
                                AttentionBlockMask mask, std::initializer_list<const void*> tensors) {
  int head_size = attention_check(who, B, Tq, C, NH, NKV, tensors);
  if (Tk < 1) throw_errorf("%s: need a key/value block of at least 1 row; got Tk=%d", who, Tk);
  if (mask == AttentionBlockMask::causal_diagonal && Tq != Tk)
    throw_errorf("%s: causal_diagonal needs the query and key/value blocks to be the same positions; got Tq=%d Tk=%d",
                 who, Tq, Tk);
  return head_size;
}

// The query block's attention to one key/value block: out (B, Tq, C) as OutT (fp32 or T) and
// lse (B, NH, Tq), normalized over this block's visible keys only (merge them with
// ring_attention_merge). qkv (B, Tq, C + 2·NKV·C/NH) supplies q; kv (B, Tk, 2·NKV·C/NH) k and v.
template <typename T, typename OutT>
void ring_attention_forward(OutT* out, float* lse, const T* qkv, const T* kv, int B, int Tq, int Tk, int C, int NH,
                            int NKV, AttentionBlockMask mask, cudaStream_t stream) {
  int head_size = ring_attention_check("ring_attention_forward", B, Tq, Tk, C, NH, NKV, mask, {out, qkv, kv});
  float scale = 1.0f / sqrtf(static_cast<float>(head_size));
  launch(ring_attention_forward_kernel<T, OutT>, attention_grid(B, Tq, NH), dim3(32 * kAttentionWarpsPerBlock), 0,
         stream, out, lse, qkv, kv, B, Tq, Tk, NH, NKV, head_size, scale, mask);
  CUDA_CHECK(cudaGetLastError());
}

// ring_attention_forward on tensor cores (flash_attention.cuh's forward kernel with a K/V block):
// bf16 inputs, head sizes flash_attention_supports; out (B, Tq, C) in fp32, the merge's input.
template <int HD>
void ring_flash_attention_forward_hd(float* out, float* lse, const bf16* qkv, const bf16* kv, int B, int Tq, int Tk,
                                     int NH, int NKV, bool full, cudaStream_t stream) {
  using Tiles = FlashTiles<HD>;
  const float scale = 1.0f / sqrtf(static_cast<float>(HD));
  const FlashKeys keys = full ? FlashKeys::block_full : FlashKeys::block_diagonal;
  auto kernel = full ? flash_attention_forward_kernel<HD, FlashKeys::block_full>
                     : flash_attention_forward_kernel<HD, FlashKeys::block_diagonal>;
  // Both kinds have the same tiling (forward_m_tiles depends only on causal or not).
  static_assert(Tiles::forward_rows(FlashKeys::block_full) == Tiles::forward_rows(FlashKeys::block_diagonal), "");
  flash_attention_allow_smem(kernel, Tiles::forward_smem(keys));
  launch(kernel, flash_attention_grid(B, Tq, NH, Tiles::forward_rows(keys)), dim3(Tiles::kThreads),
         Tiles::forward_smem(keys), stream, nullptr, lse, qkv, Tq, NH, NKV, scale * kFlashLog2e, kv, Tk, out);
  CUDA_CHECK(cudaGetLastError());
}

inline void ring_flash_attention_forward(float* out, float* lse, const bf16* qkv, const bf16* kv, int B, int Tq, int Tk,
                                         int C, int NH, int NKV, AttentionBlockMask mask, cudaStream_t stream) {
  const char* who = "ring_flash_attention_forward";
  ring_attention_check(who, B, Tq, Tk, C, NH, NKV, mask, {out, qkv, kv});
  const int head_size = flash_attention_check(who, B, Tq, C, NH, NKV, {out, qkv, kv});
  const bool full = mask == AttentionBlockMask::full;
  switch (head_size) {
    case 16: ring_flash_attention_forward_hd<16>(out, lse, qkv, kv, B, Tq, Tk, NH, NKV, full, stream); break;
    case 32: ring_flash_attention_forward_hd<32>(out, lse, qkv, kv, B, Tq, Tk, NH, NKV, full, stream); break;
    case 64: ring_flash_attention_forward_hd<64>(out, lse, qkv, kv, B, Tq, Tk, NH, NKV, full, stream); break;
    default: ring_flash_attention_forward_hd<128>(out, lse, qkv, kv, B, Tq, Tk, NH, NKV, full, stream); break;
  }
}

// A running result that has seen no key: lse (B, NH, T) = -inf, out (B, T, C) fp32 = 0.
inline void ring_attention_merge_reset(float* out, float* lse, int B, int T, int C, int NH, cudaStream_t stream) {
  const size_t out_n = static_cast<size_t>(B) * T * C, lse_n = static_cast<size_t>(B) * NH * T;
  launch(ring_attention_fill_kernel, dim3(static_cast<unsigned>(ceil_div(out_n, size_t{256}))), dim3(256), 0, stream,
         out, out_n, 0.0f);
  launch(ring_attention_fill_kernel, dim3(static_cast<unsigned>(ceil_div(lse_n, size_t{256}))), dim3(256), 0, stream,
         lse, lse_n, -INFINITY);
  CUDA_CHECK(cudaGetLastError());
}

// The running (out fp32 (B, T, C), lse (B, NH, T)) := its merge with a block's (out_b, lse_b):
// lse' = log(e^lse + e^lse_b), out' = e^(lse - lse') out + e^(lse_b - lse') out_b. Merging the
// blocks in a fixed order (the ring's) gives the same bits on every run.
template <typename BlockT>
void ring_attention_merge(float* out, float* lse, const BlockT* out_b, const float* lse_b, int B, int T, int C,
                          int NH, cudaStream_t stream) {
  int head_size = attention_check("ring_attention_merge", B, T, C, NH, NH, {out, out_b});
  launch(ring_attention_merge_kernel<BlockT>, attention_grid(B, T, NH), dim3(32 * kAttentionWarpsPerBlock), 0, stream,
         out, lse, out_b, lse_b, B, T, NH, head_size);
  CUDA_CHECK(cudaGetLastError());
}

// The merged fp32 out rounded once to T (the model's out), n elements.
template <typename T>
void ring_attention_round(T* out, const float* out_fp32, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  launch(ring_attention_round_kernel<T>, dim3(static_cast<unsigned>(ceil_div(n, size_t{256}))), dim3(256), 0, stream,
         out, out_fp32, n);
  CUDA_CHECK(cudaGetLastError());
}

// Scratch for ring_attention_backward: D_t per (b, h, t) of the query block, fp32.
inline size_t ring_attention_backward_scratch_bytes(int B, int Tq, int NH) {
  return attention_backward_scratch_bytes(B, Tq, NH);
}

// The block pair's part of the gradient, given dout (B, Tq, C) and the query block's FINAL merged
// out (B, Tq, C) and lse (B, NH, Tq) (so P is each row's softmax over all its keys):
// dq (B, Tq, C) fp32 += the query block's gradient through this key block, and dkv (B, Tk, 2·NKV·HS)
// fp32 += the key/value block's gradient from this query block. Each element has one writer.
template <typename T>
void ring_attention_backward(float* dq, float* dkv, float* scratch, const T* dout, const T* qkv, const T* out,
                             const float* lse, const T* kv, int B, int Tq, int Tk, int C, int NH, int NKV,
                             AttentionBlockMask mask, cudaStream_t stream) {
  int head_size = ring_attention_check("ring_attention_backward", B, Tq, Tk, C, NH, NKV, mask,
                                       {dq, dkv, dout, qkv, out, kv});
  float scale = 1.0f / sqrtf(static_cast<float>(head_size));
  dim3 block(32 * kAttentionWarpsPerBlock);
  // The key/value pass reads D of every query row: the query pass writes them first.
  launch(ring_attention_backward_query_kernel<T>, attention_grid(B, Tq, NH), block, 0, stream, dq, scratch, dout, qkv,
         out, lse, kv, B, Tq, Tk, NH, NKV, head_size, scale, mask);
  CUDA_CHECK(cudaGetLastError());
  launch(ring_attention_backward_key_value_kernel<T>, attention_grid(B, Tk, NKV), block, 0, stream, dkv, scratch, dout,
         qkv, lse, kv, B, Tq, Tk, NH, NKV, head_size, scale, mask);
  CUDA_CHECK(cudaGetLastError());
}

// ring_attention_backward on tensor cores (flash_attention.cuh's delta kernel and backward kernels,
// BLOCKWISE): bf16 inputs, head sizes flash_attention_supports; the same fp32 accumulation.
template <int HD>
void ring_flash_attention_backward_hd(float* dq, float* dkv, float* delta, const bf16* dout, const bf16* qkv,
                                      const bf16* out, const float* lse, const bf16* kv, int B, int Tq, int Tk, int NH,
                                      int NKV, bool full, cudaStream_t stream) {
  using Tiles = FlashTiles<HD>;
  const float scale = 1.0f / sqrtf(static_cast<float>(HD));
  flash_attention_backward_delta<HD>(delta, dout, out, B, Tq, NH, stream);
  auto key_value_kernel = full ? flash_attention_backward_key_value_kernel<HD, FlashKeys::block_full>
                                : flash_attention_backward_key_value_kernel<HD, FlashKeys::block_diagonal>;
  flash_attention_allow_smem(key_value_kernel, Tiles::key_value_smem());
  launch(key_value_kernel, flash_attention_grid(B, Tk, NKV, Tiles::kRows), dim3(Tiles::kThreads),
         Tiles::key_value_smem(), stream, nullptr, delta, dout, qkv, lse, Tq, NH, NKV, scale, scale * kFlashLog2e, kv,
         Tk, dkv);
  CUDA_CHECK(cudaGetLastError());
  auto query_kernel = full ? flash_attention_backward_query_kernel<HD, FlashKeys::block_full>
                           : flash_attention_backward_query_kernel<HD, FlashKeys::block_diagonal>;
  flash_attention_allow_smem(query_kernel, Tiles::query_smem());
  launch(query_kernel, flash_attention_grid(B, Tq, NH, Tiles::kRows), dim3(Tiles::kThreads), Tiles::query_smem(),
         stream, nullptr, delta, dout, qkv, lse, Tq, NH, NKV, scale, scale * kFlashLog2e, kv, Tk, dq);
  CUDA_CHECK(cudaGetLastError());
}

inline void ring_flash_attention_backward(float* dq, float* dkv, float* scratch, const bf16* dout, const bf16* qkv,
                                          const bf16* out, const float* lse, const bf16* kv, int B, int Tq, int Tk,
                                          int C, int NH, int NKV, AttentionBlockMask mask, cudaStream_t stream) {
  const char* who = "ring_flash_attention_backward";
  ring_attention_check(who, B, Tq, Tk, C, NH, NKV, mask, {dq, dkv, dout, qkv, out, kv});
  const int head_size = flash_attention_check(who, B, Tq, C, NH, NKV, {dq, dkv, dout, qkv, out, kv});
  const bool full = mask == AttentionBlockMask::full;
  switch (head_size) {
    case 16: ring_flash_attention_backward_hd<16>(dq, dkv, scratch, dout, qkv, out, lse, kv, B, Tq, Tk, NH, NKV, full, stream); break;
    case 32: ring_flash_attention_backward_hd<32>(dq, dkv, scratch, dout, qkv, out, lse, kv, B, Tq, Tk, NH, NKV, full, stream); break;
    case 64: ring_flash_attention_backward_hd<64>(dq, dkv, scratch, dout, qkv, out, lse, kv, B, Tq, Tk, NH, NKV, full, stream); break;
    default: ring_flash_attention_backward_hd<128>(dq, dkv, scratch, dout, qkv, out, lse, kv, B, Tq, Tk, NH, NKV, full, stream); break;
  }
}

// ---- The ring's buffers (src/model/context_attention.h): K/V leave the fused qkv for a contiguous
// block (what travels), and the fp32 gradients come back into the model's dqkv layout. One thread
// per element: memory-bound copies, a small part of a layer's attention.

// kv (rows, kv_width) = channels [C, C + kv_width) of qkv (rows, C + kv_width).
template <typename T>
__global__ void ring_attention_pack_kv_kernel(T* kv, const T* qkv, size_t rows, int C, int kv_width) {
  size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * kv_width) return;
  size_t row = i / kv_width, col = i % kv_width;
  kv[i] = qkv[row * (C + kv_width) + C + col];
}

// dqkv (rows, C + kv_width) = [dq (rows, C) | dkv (rows, kv_width)] rounded to T.
template <typename T>
__global__ void ring_attention_assemble_dqkv_kernel(T* dqkv, const float* dq, const float* dkv, size_t rows, int C,
                                                    int kv_width) {
  size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t width = static_cast<size_t>(C) + kv_width;
  if (i >= rows * width) return;
  size_t row = i / width, col = i % width;
  dqkv[i] = from_float<T>(col < static_cast<size_t>(C) ? dq[row * C + col] : dkv[row * kv_width + (col - C)]);
}

// acc[i] += x[i] (fp32).
__global__ void ring_attention_add_kernel(float* acc, const float* x, size_t n) {
  size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) acc[i] += x[i];
}

// The K/V heads (channels from C on: NKV key heads, then NKV value heads, kv_width = 2·NKV·HS) of
// `rows` rows of the fused qkv as a kv block (rows, kv_width).
template <typename T>
void ring_attention_pack_kv(T* kv, const T* qkv, size_t rows, int C, int kv_width, cudaStream_t stream) {
  const size_t n = rows * kv_width;
  if (n == 0) return;
  launch(ring_attention_pack_kv_kernel<T>, dim3(static_cast<unsigned>(ceil_div(n, size_t{256}))), dim3(256), 0, stream,
         kv, qkv, rows, C, kv_width);
  CUDA_CHECK(cudaGetLastError());
}

// The model's dqkv (rows, C + kv_width) from the ring's fp32 dq (rows, C) and dkv (rows, kv_width),
// rounded once.
template <typename T>
void ring_attention_assemble_dqkv(T* dqkv, const float* dq, const float* dkv, size_t rows, int C, int kv_width,
                                  cudaStream_t stream) {
  const size_t n = rows * (static_cast<size_t>(C) + kv_width);
  if (n == 0) return;
  launch(ring_attention_assemble_dqkv_kernel<T>, dim3(static_cast<unsigned>(ceil_div(n, size_t{256}))), dim3(256), 0,
         stream, dqkv, dq, dkv, rows, C, kv_width);
  CUDA_CHECK(cudaGetLastError());
}

// acc += x over n fp32 elements: a travelling dK/dV accumulator joins this rank's share.
inline void ring_attention_add(float* acc, const float* x, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  launch(ring_attention_add_kernel, dim3(static_cast<unsigned>(ceil_div(n, size_t{256}))), dim3(256), 0, stream, acc, x,
         n);
  CUDA_CHECK(cudaGetLastError());
}

// Zigzag layout: a sequence of T tokens is cut into 2N chunks of T / (2N); rank r holds chunks r
// and 2N-1-r. The mask kind of query chunk qc against key chunk kc, or false where it is skipped.
inline bool zigzag_block_mask(int qc, int kc, AttentionBlockMask* mask) {
  if (kc > qc) return false;
  *mask = kc < qc ? AttentionBlockMask::full : AttentionBlockMask::causal_diagonal;
  return true;
}

// Causal work of one rank under the zigzag layout: the (query tile, key tile) pairs of `tile` rows
// each (tiles start at each chunk's first row) that the mask leaves at least one visible pair in,
// over the rank's two query chunks and all 2N key chunks. Equal on every rank: chunk r sees r full
// chunks, chunk 2N-1-r sees 2N-1-r, plus one diagonal each. T must be divisible by 2N.
inline int64_t zigzag_tiles(int64_t T, int N, int rank, int64_t tile) {
  if (N < 1 || T < 2 * N || T % (2 * N) != 0 || rank < 0 || rank >= N || tile < 1)
    throw_errorf("zigzag_tiles: need T divisible by 2N, 0 <= rank < N and tile >= 1; got T=%lld N=%d rank=%d "
                 "tile=%lld", static_cast<long long>(T), N, rank, static_cast<long long>(tile));
  const int64_t chunk = T / (2 * N), tiles = (chunk + tile - 1) / tile;
  int64_t diagonal = 0;  // key tile j before or at query tile i within one chunk
  for (int64_t i = 0; i < tiles; ++i) diagonal += i + 1;
  int64_t count = 0;
  for (int qc : {rank, 2 * N - 1 - rank}) {
    for (int kc = 0; kc < 2 * N; ++kc) {
      AttentionBlockMask mask;
      if (!zigzag_block_mask(qc, kc, &mask)) continue;
      count += mask == AttentionBlockMask::full ? tiles * tiles : diagonal;
    }
  }
  return count;
}
