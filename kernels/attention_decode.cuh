// attention_decode.cuh — attention of one new query per (sequence, head) over a key/value cache,
// for incremental decoding: kv_cache_write stores the keys and values of new positions into the
// cache, attention_decode_forward attends the newest position's query over every cached one.
//
// Layout: qkv rows are (C + 2·NKV·HS) as in attention.cuh: NH query heads (C = NH·HS), then NKV
// key heads, then NKV value heads (NKV = NH: q, k, v of C channels each). The cache holds, per
// sequence b, max_len rows of the K/V heads' NKV·HS channels: k_cache and v_cache are
// (B, max_len, NKV·HS); rows [0, len) are valid. Query head h reads K/V head h / (NH / NKV) of
// the cache, which holds each K/V head once however many query heads share it.
//
// attention_decode_forward is attention_forward_kernel's loop for the row t = len - 1, with keys
// and values read from the cache: one warp per (b, h), the same lane groups, the same visiting
// order and the same butterfly merge, so for equal q, k and v it returns the bits the full
// causal attention (kernels/attention.cuh) gives for that row. No log-sum-exp: nothing
// differentiates through decoding. Requirements as attention.cuh's (checked): HS % 8 == 0,
// HS <= 128, 16-byte aligned tensors.
#pragma once
#include "attention.cuh"
#include "common.cuh"

// One warp per (b, h): online softmax of q·k_s over the cached keys s < len of h's K/V head, then
// the weighted sum of the cached values. q of sequence b is qkv[b * (C + 2 kv_C) + h*HS ..].
template <typename T>
__global__ void attention_decode_forward_kernel(T* out, const T* qkv, const T* k_cache, const T* v_cache, int B,
                                                int len, int max_len, int NH, int NKV, int head_size, float scale) {
  constexpr int V = Vec128<T>::size;
  int warp = blockIdx.x * kAttentionWarpsPerBlock + static_cast<int>(threadIdx.x) / 32;
  if (warp >= B * NH) return;  // whole warps only
  int h = warp % NH, b = warp / NH;
  int C = NH * head_size, kv_C = NKV * head_size;
  AttentionLane lane = attention_lane(head_size, V);

  float q[V];
  attention_load_floats<T>(q, qkv + static_cast<size_t>(b) * (C + 2 * kv_C) + h * head_size + lane.chunk * V,
                           lane.owns_chunk);
  const size_t head_offset =
      static_cast<size_t>(b) * max_len * kv_C + h / (NH / NKV) * head_size + lane.chunk * V;
  const T* k_chunk = k_cache + head_offset;
  const T* v_chunk = v_cache + head_offset;

  AttentionOnlineSoftmax<V> softmax;
  // Same trip count for every lane (shuffles need the whole warp); a group past the last key idles.
  for (int step = 0; step < len; step += lane.groups) {
    int s = step + lane.group;
    bool key_valid = s < len;
    float k[V];
    attention_load_floats<T>(k, k_chunk + static_cast<size_t>(s) * kv_C, key_valid && lane.owns_chunk);
    float score = attention_group_sum(attention_dot<V>(q, k), lane.group_lanes) * scale;
    if (key_valid) {
      float v[V];
      attention_load_floats<T>(v, v_chunk + static_cast<size_t>(s) * kv_C, lane.owns_chunk);
      softmax.add(score, v);
    }
  }
  softmax.merge_groups(lane.group_lanes);

  if (lane.group == 0 && lane.owns_chunk)
    store128(out + static_cast<size_t>(b) * C + h * head_size + lane.chunk * V, softmax.template output<T>());
}

// One thread per 16-byte chunk of the k and v parts (kv_C channels each) of the n new qkv rows of
// each sequence: row i of sequence b goes to cache row pos + i.
template <typename T>
__global__ void kv_cache_write_kernel(T* k_cache, T* v_cache, const T* qkv, int B, int n, int pos, int max_len,
                                      int C, int kv_C) {
  constexpr int V = Vec128<T>::size;
  const int chunks = kv_C / V;
  const size_t index = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (index >= static_cast<size_t>(B) * n * chunks) return;
  const int chunk = static_cast<int>(index % chunks);
  const int i = static_cast<int>(index / chunks % n), b = static_cast<int>(index / chunks / n);
  const T* row = qkv + (static_cast<size_t>(b) * n + i) * (C + 2 * kv_C) + chunk * V;
  const size_t at = (static_cast<size_t>(b) * max_len + pos + i) * kv_C + chunk * V;
  store128(k_cache + at, load128(row + C));
  store128(v_cache + at, load128(row + C + kv_C));
}

// k_cache, v_cache (B, max_len, NKV·HS) rows [pos, pos + n) = the k and v parts of qkv
// (B, n, C + 2·NKV·HS), HS = C / NH.
template <typename T>
void kv_cache_write(T* k_cache, T* v_cache, const T* qkv, int B, int n, int pos, int max_len, int C, int NH, int NKV,
                    cudaStream_t stream) {
  const int head_size = attention_check("kv_cache_write", B, n, C, NH, NKV, {k_cache, v_cache, qkv});
  if (pos < 0 || n > max_len - pos) {
    throw_errorf("kv_cache_write: rows [%d, %d) do not fit a cache of %d rows", pos, pos + n, max_len);
  }
  const int kv_C = NKV * head_size;
  const size_t threads = static_cast<size_t>(B) * n * (kv_C / Vec128<T>::size);
  const int block = 256;
  launch(kv_cache_write_kernel<T>, dim3(static_cast<unsigned>(ceil_div<size_t>(threads, block))), dim3(block), 0,
         stream, k_cache, v_cache, qkv, B, n, pos, max_len, C, kv_C);
  CUDA_CHECK(cudaGetLastError());
}

// out (B, C): each sequence's newest query (its qkv row (B, C + 2·NKV·HS)) attended over cache
// rows [0, len).
template <typename T>
void attention_decode_forward(T* out, const T* qkv, const T* k_cache, const T* v_cache, int B, int len, int max_len,
                              int C, int NH, int NKV, cudaStream_t stream) {
  int head_size = attention_check("attention_decode_forward", B, len, C, NH, NKV, {out, qkv, k_cache, v_cache});
  if (len > max_len) {
    throw_errorf("attention_decode_forward: %d cached rows requested of a cache of %d", len, max_len);
  }
  float scale = 1.0f / sqrtf(static_cast<float>(head_size));
  launch(attention_decode_forward_kernel<T>, dim3(static_cast<unsigned>(ceil_div(B * NH, kAttentionWarpsPerBlock))),
         dim3(32 * kAttentionWarpsPerBlock), 0, stream, out, qkv, k_cache, v_cache, B, len, max_len, NH, NKV,
         head_size, scale);
  CUDA_CHECK(cudaGetLastError());
}
