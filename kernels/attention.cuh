// attention.cuh — causal multi-head self-attention, forward and backward, fp32 math on CUDA cores.
//
// Layout: qkv is (B, T, C + 2·NKV·HS), the output of the qkv linear layer: NH query heads
// (channels [0, C), C = NH·HS), then NKV key heads, then NKV value heads, HS channels each. With
// NKV = NH (multi-head attention) that is (B, T, 3C): q = [0, C), k = [C, 2C), v = [2C, 3C). With
// NKV < NH (grouped-query attention) query head h reads K/V head h / (NH / NKV), and a K/V head's
// gradient is the sum over its group's query heads, taken in ascending head order.
// out is (B, T, C), head h's output in channels h*HS.. (the input of the attention projection).
// The forward keeps only the per-row log-sum-exp of the scaled scores, lse (B, NH, T) in fp32;
// the backward recomputes the probabilities from it instead of storing a T×T matrix.
//
// Work split (every kernel): one warp per (b, h, row). The warp's lanes form groups of
// `group_lanes` lanes (the power of two ≥ HS / Vec128<T>::size); lane c of a group owns one
// 16-byte chunk of the head dimension, and the 32 / group_lanes groups walk the inner loop's rows
// in an interleaved fixed order. Dot products are sums over a group's lanes; the groups' partial
// results are merged in a fixed butterfly order, so results are bitwise reproducible.
// Requires HS % 8 == 0 (a whole number of 16-byte chunks for float and bf16), HS <= 128 (at most
// 32 chunks) and 16-byte aligned tensors; the launchers check this.
#pragma once
#include <initializer_list>

#include "common.cuh"

constexpr int kAttentionWarpsPerBlock = 4;

// Where one lane sits in the group/chunk split described above.
struct AttentionLane {
  int chunk;        // head-dimension chunk this lane loads (elements chunk*V .. chunk*V+V-1)
  bool owns_chunk;  // false for padding lanes when the chunk count is not a power of two
  int group;        // which row of each step of the inner loop this lane's group handles
  int groups;       // rows per step of the inner loop
  int group_lanes;
};

__device__ __forceinline__ AttentionLane attention_lane(int head_size, int vec_size) {
  int chunks = head_size / vec_size;
  int group_lanes = 1;
  while (group_lanes < chunks) group_lanes <<= 1;
  int lane = static_cast<int>(threadIdx.x) % 32;
  AttentionLane a;
  a.chunk = lane % group_lanes;
  a.owns_chunk = a.chunk < chunks;
  a.group = lane / group_lanes;
  a.groups = 32 / group_lanes;
  a.group_lanes = group_lanes;
  return a;
}

// Sum over the lanes of this lane's group (groups are aligned blocks of group_lanes lanes).
__device__ __forceinline__ float attention_group_sum(float x, int group_lanes) {
  for (int offset = group_lanes >> 1; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// Sum over the groups, lane by lane (the lanes holding the same chunk in every group).
__device__ __forceinline__ float attention_across_groups_sum(float x, int group_lanes) {
  for (int offset = group_lanes; offset < 32; offset <<= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

template <int V>
__device__ __forceinline__ float attention_dot(const float a[V], const float b[V]) {
  float sum = 0.0f;
  for (int i = 0; i < V; ++i) sum += a[i] * b[i];
  return sum;
}

// One 16-byte chunk as fp32; zeros where the lane has nothing to load (padding lane, row out of range).
template <typename T>
__device__ __forceinline__ void attention_load_floats(float dst[Vec128<T>::size], const T* src, bool load) {
  Vec128<T> v;
  if (load) v = load128(src);
  for (int i = 0; i < Vec128<T>::size; ++i) dst[i] = load ? to_float(v[i]) : 0.0f;
}

// One lane group's online softmax over the keys it visits (running max, running sum and the
// p-weighted sum of its chunk of v), and the butterfly merge of the groups at the end; shared by
// the full attention and the decoding kernel (attention_decode.cuh), which must give its bits.
template <int V>
struct AttentionOnlineSoftmax {
  float running_max = -INFINITY, running_sum = 0.0f, acc[V] = {};

  __device__ __forceinline__ void add(float score, const float v[V]) {
    float new_max = fmaxf(running_max, score);
    float correction = expf(running_max - new_max);  // 0 for the first key (running_max = -inf)
    float p = expf(score - new_max);
    running_sum = running_sum * correction + p;
    for (int i = 0; i < V; ++i) acc[i] = acc[i] * correction + p * v[i];
    running_max = new_max;
  }

  // Every lane ends with the whole row's max, sum and weighted v (the whole warp must call it).
  __device__ __forceinline__ void merge_groups(int group_lanes) {
    for (int offset = group_lanes; offset < 32; offset <<= 1) {
      float other_max = __shfl_xor_sync(0xffffffffu, running_max, offset);
      float other_sum = __shfl_xor_sync(0xffffffffu, running_sum, offset);
      float new_max = fmaxf(running_max, other_max);
      // A group that saw no key still has max -inf: weight 0, not exp(-inf + inf).
      float mine = running_max == -INFINITY ? 0.0f : expf(running_max - new_max);
      float theirs = other_max == -INFINITY ? 0.0f : expf(other_max - new_max);
      running_sum = running_sum * mine + other_sum * theirs;
      for (int i = 0; i < V; ++i) acc[i] = acc[i] * mine + __shfl_xor_sync(0xffffffffu, acc[i], offset) * theirs;
      running_max = new_max;
    }
  }

  // The softmax-weighted sum of v (after merge_groups), as T.
  template <typename T>
  __device__ __forceinline__ Vec128<T> output() const {
    float inv_sum = 1.0f / running_sum;
    Vec128<T> o;
    for (int i = 0; i < V; ++i) o[i] = from_float<T>(acc[i] * inv_sum);
    return o;
  }
};

// One query row (q: this lane's chunk) over keys 0 .. key_count-1, whose chunks for this lane
// start at k_chunk and v_chunk, kv_stride elements per key: each group's online softmax over the
// keys it visits, merged over the groups (every lane ends with the row's max, sum and weighted v).
// Shared by the causal kernels here (key_count = t + 1) and the blockwise ones (ring_attention.cuh).
template <typename T>
__device__ __forceinline__ AttentionOnlineSoftmax<Vec128<T>::size> attention_row_softmax(
    const float q[Vec128<T>::size], const T* k_chunk, const T* v_chunk, size_t kv_stride, int key_count,
    const AttentionLane& lane, float scale) {
  constexpr int V = Vec128<T>::size;
  AttentionOnlineSoftmax<V> softmax;
  // The trip count is the same for every lane (shuffles need the whole warp); a group past the last key idles.
  for (int step = 0; step < key_count; step += lane.groups) {
    int s = step + lane.group;
    bool key_valid = s < key_count;
    float k[V];
    attention_load_floats<T>(k, k_chunk + s * kv_stride, key_valid && lane.owns_chunk);
    float score = attention_group_sum(attention_dot<V>(q, k), lane.group_lanes) * scale;
    if (key_valid) {
      float v[V];
      attention_load_floats<T>(v, v_chunk + s * kv_stride, lane.owns_chunk);
      softmax.add(score, v);
    }
  }
  softmax.merge_groups(lane.group_lanes);
  return softmax;
}

// D_t = dout_t · out_t of one row (every lane of a group gets it).
template <int V>
__device__ __forceinline__ float attention_row_delta(const float dout_t[V], const float out_t[V], int group_lanes) {
  float partial_delta = 0.0f;
  for (int i = 0; i < V; ++i) partial_delta += dout_t[i] * out_t[i];
  return attention_group_sum(partial_delta, group_lanes);
}

// dq = sum_{s < key_count} P_ts (dout_t · v_s - D_t) k_s for one query row (without the scale),
// summed over the groups: every lane ends with its chunk's sum. Keys as in attention_row_softmax;
// row_lse is the row's log-sum-exp over all the keys it sees, so P is the row's final softmax.
template <typename T>
__device__ __forceinline__ void attention_row_dq(float dq[Vec128<T>::size], const float q[Vec128<T>::size],
                                                 const float dout_t[Vec128<T>::size], float row_lse, float row_delta,
                                                 const T* k_chunk, const T* v_chunk, size_t kv_stride, int key_count,
                                                 const AttentionLane& lane, float scale) {
  constexpr int V = Vec128<T>::size;
  for (int i = 0; i < V; ++i) dq[i] = 0.0f;
  for (int step = 0; step < key_count; step += lane.groups) {
    int s = step + lane.group;
    bool key_valid = s < key_count;
    float k[V], v[V];
    attention_load_floats<T>(k, k_chunk + s * kv_stride, key_valid && lane.owns_chunk);
    attention_load_floats<T>(v, v_chunk + s * kv_stride, key_valid && lane.owns_chunk);
    float score = attention_group_sum(attention_dot<V>(q, k), lane.group_lanes) * scale;
    float dp = attention_group_sum(attention_dot<V>(dout_t, v), lane.group_lanes);
    if (key_valid) {
      float ds = expf(score - row_lse) * (dp - row_delta);
      for (int i = 0; i < V; ++i) dq[i] += ds * k[i];
    }
  }
  for (int i = 0; i < V; ++i) dq[i] = attention_across_groups_sum(dq[i], lane.group_lanes);
}

// One key row (k, v: this lane's chunks) and one query head: adds sum_t P_ts dout_t to dv and
// sum_t P_ts (dout_t · v_s - D_t) q_t to dk (without the scale) over the queries
// first_query .. query_count-1, whose chunks start at q_chunk (q_stride elements per row) and
// dout_chunk (dout_stride), with their lse and D in lse_row and delta_row. Each group's partial sums
// run on across calls; the caller merges the groups once at the end.
template <typename T>
__device__ __forceinline__ void attention_key_value_accumulate(
    float dk[Vec128<T>::size], float dv[Vec128<T>::size], const float k[Vec128<T>::size],
    const float v[Vec128<T>::size], const T* q_chunk, size_t q_stride, const T* dout_chunk, size_t dout_stride,
    const float* lse_row, const float* delta_row, int first_query, int query_count, const AttentionLane& lane,
    float scale) {
  constexpr int V = Vec128<T>::size;
  for (int step = first_query; step < query_count; step += lane.groups) {
    int t = step + lane.group;
    bool query_valid = t < query_count;
    float q[V], dout_t[V];
    attention_load_floats<T>(q, q_chunk + t * q_stride, query_valid && lane.owns_chunk);
    attention_load_floats<T>(dout_t, dout_chunk + t * dout_stride, query_valid && lane.owns_chunk);
    float score = attention_group_sum(attention_dot<V>(k, q), lane.group_lanes) * scale;
    float dp = attention_group_sum(attention_dot<V>(v, dout_t), lane.group_lanes);
    if (query_valid) {
      float p = expf(score - lse_row[t]);
      float ds = p * (dp - delta_row[t]);
      for (int i = 0; i < V; ++i) {
        dv[i] += p * dout_t[i];
        dk[i] += ds * q[i];
      }
    }
  }
}

// One warp per (b, h, t): online softmax over keys s <= t. Each group keeps its own running
// max, sum and weighted sum of v over the keys it visited; the groups are merged at the end.
template <typename T>
__global__ void attention_forward_kernel(T* out, float* lse, const T* qkv, int B, int seq_len, int NH, int NKV,
                                         int head_size, float scale) {
  constexpr int V = Vec128<T>::size;
  int warp = blockIdx.x * kAttentionWarpsPerBlock + static_cast<int>(threadIdx.x) / 32;
  if (warp >= B * NH * seq_len) return;  // whole warps only: the grid is rounded up in warps
  // Long causal prefixes first, so the slowest rows do not form the tail of the launch.
  int t = seq_len - 1 - warp % seq_len;
  int h = (warp / seq_len) % NH, b = warp / seq_len / NH;
  int C = NH * head_size, kv_C = NKV * head_size;
  size_t row_stride = static_cast<size_t>(C) + 2 * kv_C;
  AttentionLane lane = attention_lane(head_size, V);

  const T* b_chunk = qkv + static_cast<size_t>(b) * seq_len * row_stride + lane.chunk * V;
  const T* q_chunk = b_chunk + h * head_size;
  const T* k_chunk = b_chunk + C + h / (NH / NKV) * head_size;
  const T* v_chunk = k_chunk + kv_C;
  float q[V];
  attention_load_floats<T>(q, q_chunk + t * row_stride, lane.owns_chunk);

  AttentionOnlineSoftmax<V> softmax = attention_row_softmax<T>(q, k_chunk, v_chunk, row_stride, t + 1, lane, scale);

  if (lane.group == 0 && lane.owns_chunk)
    store128(out + (static_cast<size_t>(b) * seq_len + t) * C + h * head_size + lane.chunk * V, softmax.template output<T>());
  if (threadIdx.x % 32 == 0)
    lse[(static_cast<size_t>(b) * NH + h) * seq_len + t] = softmax.running_max + logf(softmax.running_sum);
}

// One warp per (b, h, t): D_t = dout_t · out_t (saved in delta for the key/value kernel) and
// dQ_t = scale · sum_{s<=t} P_ts (dout_t · v_s - D_t) k_s.
template <typename T>
__global__ void attention_backward_query_kernel(T* dqkv, float* delta, const T* dout, const T* qkv, const T* out,
                                                const float* lse, int B, int seq_len, int NH, int NKV, int head_size,
                                                float scale) {
  constexpr int V = Vec128<T>::size;
  int warp = blockIdx.x * kAttentionWarpsPerBlock + static_cast<int>(threadIdx.x) / 32;
  if (warp >= B * NH * seq_len) return;
  int t = seq_len - 1 - warp % seq_len;  // long prefixes first
  int h = (warp / seq_len) % NH, b = warp / seq_len / NH;
  int C = NH * head_size, kv_C = NKV * head_size;
  size_t row_stride = static_cast<size_t>(C) + 2 * kv_C;
  size_t bh_row = (static_cast<size_t>(b) * NH + h) * seq_len;
  AttentionLane lane = attention_lane(head_size, V);

  size_t head_offset = static_cast<size_t>(h) * head_size + lane.chunk * V;
  const T* b_chunk = qkv + static_cast<size_t>(b) * seq_len * row_stride + lane.chunk * V;
  const T* q_chunk = b_chunk + h * head_size;
  const T* k_chunk = b_chunk + C + h / (NH / NKV) * head_size;
  const T* v_chunk = k_chunk + kv_C;
  size_t out_row = (static_cast<size_t>(b) * seq_len + t) * C + head_offset;
  float q[V], dout_t[V], out_t[V];
  attention_load_floats<T>(q, q_chunk + t * row_stride, lane.owns_chunk);
  attention_load_floats<T>(dout_t, dout + out_row, lane.owns_chunk);
  attention_load_floats<T>(out_t, out + out_row, lane.owns_chunk);
  float row_delta = attention_row_delta<V>(dout_t, out_t, lane.group_lanes);
  if (threadIdx.x % 32 == 0) delta[bh_row + t] = row_delta;

  float dq[V];
  attention_row_dq<T>(dq, q, dout_t, lse[bh_row + t], row_delta, k_chunk, v_chunk, row_stride, t + 1, lane, scale);

  if (lane.group == 0 && lane.owns_chunk) {
    Vec128<T> g;
    for (int i = 0; i < V; ++i) g[i] = from_float<T>(dq[i] * scale);
    store128(dqkv + (static_cast<size_t>(b) * seq_len + t) * row_stride + head_offset, g);
  }
}

// One warp per (b, K/V head, s): dV_s = sum_h sum_{t>=s} P_ts dout_t and
// dK_s = scale · sum_h sum_{t>=s} P_ts (dout_t · v_s - D_t) q_t over the query heads h of the K/V
// head's group, one head after the other in ascending order (each lane group's partial sums run
// on across heads; the groups are merged once at the end): a fixed order, no atomics.
template <typename T>
__global__ void attention_backward_key_value_kernel(T* dqkv, const float* delta, const T* dout, const T* qkv,
                                                    const float* lse, int B, int seq_len, int NH, int NKV,
                                                    int head_size, float scale) {
  constexpr int V = Vec128<T>::size;
  int warp = blockIdx.x * kAttentionWarpsPerBlock + static_cast<int>(threadIdx.x) / 32;
  if (warp >= B * NKV * seq_len) return;
  int s = warp % seq_len;  // early keys see the most queries: they go first
  int kv_h = (warp / seq_len) % NKV, b = warp / seq_len / NKV;
  int C = NH * head_size, kv_C = NKV * head_size, group = NH / NKV;
  size_t row_stride = static_cast<size_t>(C) + 2 * kv_C;
  AttentionLane lane = attention_lane(head_size, V);

  const T* b_chunk = qkv + static_cast<size_t>(b) * seq_len * row_stride + lane.chunk * V;
  const T* k_chunk = b_chunk + C + kv_h * head_size;
  float k[V], v[V];
  attention_load_floats<T>(k, k_chunk + s * row_stride, lane.owns_chunk);
  attention_load_floats<T>(v, k_chunk + kv_C + s * row_stride, lane.owns_chunk);

  float dk[V], dv[V];
  for (int i = 0; i < V; ++i) dk[i] = dv[i] = 0.0f;
  for (int h = kv_h * group; h < (kv_h + 1) * group; ++h) {
    size_t bh_row = (static_cast<size_t>(b) * NH + h) * seq_len;
    const T* q_chunk = b_chunk + h * head_size;
    const T* dout_chunk = dout + static_cast<size_t>(b) * seq_len * C + h * head_size + lane.chunk * V;
    attention_key_value_accumulate<T>(dk, dv, k, v, q_chunk, row_stride, dout_chunk, C, lse + bh_row,
                                      delta + bh_row, s, seq_len, lane, scale);
  }
  for (int i = 0; i < V; ++i) {
    dk[i] = attention_across_groups_sum(dk[i], lane.group_lanes);
    dv[i] = attention_across_groups_sum(dv[i], lane.group_lanes);
  }

  if (lane.group == 0 && lane.owns_chunk) {
    Vec128<T> gk, gv;
    for (int i = 0; i < V; ++i) {
      gk[i] = from_float<T>(dk[i] * scale);
      gv[i] = from_float<T>(dv[i]);
    }
    T* dk_row = dqkv + (static_cast<size_t>(b) * seq_len + s) * row_stride + C + kv_h * head_size + lane.chunk * V;
    store128(dk_row, gk);
    store128(dk_row + kv_C, gv);
  }
}

// Validates the shape and alignment shared by forward and backward; returns HS.
int attention_check(const char* who, int B, int seq_len, int C, int NH, int NKV,
                    std::initializer_list<const void*> tensors) {
  if (B < 1 || seq_len < 1 || NH < 1 || C < 1 || C % NH != 0 || NKV < 1 || NH % NKV != 0) {
    throw_errorf("%s: need B, T, NH, NKV >= 1, C divisible by NH and NH by NKV; got B=%d T=%d C=%d NH=%d NKV=%d",
                 who, B, seq_len, C, NH, NKV);
  }
  int head_size = C / NH;
  if (head_size % 8 != 0 || head_size > 128) {
    throw_errorf("%s: head size C/NH = %d/%d = %d must be a multiple of 8 and at most 128", who, C, NH,
                 head_size);
  }
  for (const void* p : tensors) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) {
      throw_errorf("%s: tensor %p is not 16-byte aligned (128-bit accesses)", who, p);
    }
  }
  return head_size;
}

// One warp per (b, head, row) for `heads` heads.
dim3 attention_grid(int B, int seq_len, int heads) {
  return dim3(static_cast<unsigned>(ceil_div(B * heads * seq_len, kAttentionWarpsPerBlock)));
}

// out (B, T, C) and lse (B, NH, T) from qkv (B, T, C + 2·NKV·C/NH); see the top of this file.
template <typename T>
void attention_forward(T* out, float* lse, const T* qkv, int B, int seq_len, int C, int NH, int NKV,
                       cudaStream_t stream) {
  int head_size = attention_check("attention_forward", B, seq_len, C, NH, NKV, {out, qkv});
  float scale = 1.0f / sqrtf(static_cast<float>(head_size));
  launch(attention_forward_kernel<T>, attention_grid(B, seq_len, NH), dim3(32 * kAttentionWarpsPerBlock), 0, stream,
         out, lse, qkv, B, seq_len, NH, NKV, head_size, scale);
  CUDA_CHECK(cudaGetLastError());
}

// Scratch for attention_backward: D_t = dout_t · out_t per (b, h, t), fp32.
size_t attention_backward_scratch_bytes(int B, int seq_len, int NH) {
  return static_cast<size_t>(B) * NH * seq_len * sizeof(float);
}

// dqkv (qkv's shape) is overwritten with dL/dqkv given dout = dL/dout, the forward's inputs and
// outputs (qkv, out, lse) and scratch of attention_backward_scratch_bytes(B, T, NH) bytes.
template <typename T>
void attention_backward(T* dqkv, float* scratch, const T* dout, const T* qkv, const T* out, const float* lse, int B,
                        int seq_len, int C, int NH, int NKV, cudaStream_t stream) {
  int head_size = attention_check("attention_backward", B, seq_len, C, NH, NKV, {dqkv, dout, qkv, out});
  float scale = 1.0f / sqrtf(static_cast<float>(head_size));
  dim3 block(32 * kAttentionWarpsPerBlock);
  // The key/value pass reads D_t of every later row, so it runs after the query pass wrote them all.
  launch(attention_backward_query_kernel<T>, attention_grid(B, seq_len, NH), block, 0, stream, dqkv, scratch, dout,
         qkv, out, lse, B, seq_len, NH, NKV, head_size, scale);
  CUDA_CHECK(cudaGetLastError());
  launch(attention_backward_key_value_kernel<T>, attention_grid(B, seq_len, NKV), block, 0, stream, dqkv, scratch,
         dout, qkv, lse, B, seq_len, NH, NKV, head_size, scale);
  CUDA_CHECK(cudaGetLastError());
}
