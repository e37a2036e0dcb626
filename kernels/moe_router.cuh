// moe_router.cuh — the router of a mixture-of-experts block, in fp32: its logits, the two
// routings (Mixtral's softmax top-k renormalised over the k chosen; DeepSeek-V3's sigmoid scores
// with a selection-only expert bias), the statistics the load-balancing loss and the bias update
// are built from, the routings' backward passes, the input and weight gradients of the logits'
// product, and the aux-loss-free bias update.
//
// Layouts (row-major): x (N, C) and w (E, C) in T; logits, probs/scores, dlogits (N, E) fp32;
// expert (N, K) int, gate and dgate (N, K) fp32, entry k of row n being the row's k-th choice;
// bias, dprob_aux, prob_sums (E) fp32, counts (E) int. N rows (tokens), C channels, E experts,
// K experts per token, 1 <= K <= E <= kMoeMaxExperts. C is a positive multiple of 16 / sizeof(T)
// (128-bit accesses). A row's K experts are distinct and in [0, E) (the routings' are).
//
// Deterministic: every sum has an order fixed by the shapes alone (a lane's chunks in increasing
// order, then warp_sum's butterfly; the weight gradient's rows in increasing order within fixed
// row groups, then the groups in increasing order; the statistics' column sums in
// block_column_sum's order); no float atomics. Ties in the selection go to the lower expert
// index. The routing kernels hold a row's E values in registers (E / 32 per lane), so E is capped
// at kMoeMaxExperts.
#pragma once
#include "common.cuh"

constexpr int kMoeMaxExperts = 256;
constexpr int kMoeLaneExperts = kMoeMaxExperts / 32;  // a lane's experts: lane, lane + 32, ...
constexpr int kMoeRouterWarps = 8;                    // rows per block of the row kernels (one per warp)
constexpr int kMoeLogitExperts = 4;                   // experts whose dots a warp carries per pass over x
constexpr int kMoeGradRows = 8;                       // rows per block of the input gradient
constexpr int kMoeGradChunks = 128;                   // 128-bit column chunks per block of the gradients
constexpr int kMoeGradExperts = 4;                    // experts per thread of the weight gradient
constexpr int kMoeStatsThreads = kColumnSumWidth * kColumnSumWarps;

// How a routing picks a row's K experts: the top K of its keys, or, to time a perfectly balanced
// step against real routing (--moe-balanced-routing), expert (n·K + k) mod E for row n's k-th
// choice whatever the keys, every expert getting N·K/E rows (± 1). The gates are the chosen
// experts' values renormalised either way, so the backward passes are the same.
enum class MoeChoice { top_k, balanced };

// logits[n][e] = Σ_c x[n][c]·w[e][c]: one warp per row; lane l adds its chunks l, l + 32, ... in
// increasing order, then warp_sum. The block's 8 rows share w through the L1 cache.
template <typename T>
__global__ void moe_router_logits_kernel(float* logits, const T* x, const T* w, int N, int C, int E) {
  constexpr int kVec = Vec128<T>::size;
  const int row = blockIdx.x * kMoeRouterWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;  // whole warps leave together
  const T* xr = x + static_cast<size_t>(row) * C;
  for (int e0 = 0; e0 < E; e0 += kMoeLogitExperts) {
    float acc[kMoeLogitExperts];
    UNROLL for (int t = 0; t < kMoeLogitExperts; ++t) acc[t] = 0.0f;
    for (int j = lane; j < C / kVec; j += 32) {
      const Vec128<T> xv = load128(xr + j * kVec);
      UNROLL for (int t = 0; t < kMoeLogitExperts; ++t) {
        if (e0 + t >= E) continue;
        const Vec128<T> wv = load128(w + static_cast<size_t>(e0 + t) * C + j * kVec);
        UNROLL for (int i = 0; i < kVec; ++i) acc[t] += to_float(xv[i]) * to_float(wv[i]);
      }
    }
    UNROLL for (int t = 0; t < kMoeLogitExperts; ++t) {
      const float sum = warp_sum(acc[t]);
      if (lane == 0 && e0 + t < E) logits[static_cast<size_t>(row) * E + e0 + t] = sum;
    }
  }
}

// Whether (key a, expert ea) is chosen before (key b, expert eb): the larger key, then the lower index.
__device__ __forceinline__ bool moe_chosen_before(float a, int ea, float b, int eb) {
  return a > b || (a == b && ea < eb);
}

// One warp per row: the row's probabilities (softmax over all E, max-subtracted) or scores
// (sigmoid) written; then K rounds of a warp argmax over the keys (the probabilities, or scores +
// bias), each winner struck from its lane's set; gate[k] = value_k / Σ_k' value_k', the sum taken
// in k order. Every lane ends each round with the same winner: the order is total. balanced: round
// k's winner is expert (row·K + k) mod E instead, whatever the keys (MoeChoice::balanced).
template <bool kSigmoid, typename B>
__global__ void moe_route_topk_kernel(float* values, int* expert, float* gate, const float* logits,
                                      const B* bias, int N, int E, int K, bool balanced) {
  const int row = blockIdx.x * kMoeRouterWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const float* lr = logits + static_cast<size_t>(row) * E;
  float* vr = values + static_cast<size_t>(row) * E;
  float value[kMoeLaneExperts], key[kMoeLaneExperts];
  unsigned struck = 0;  // bit i: expert lane + 32·i is chosen already, or does not exist
  UNROLL for (int i = 0; i < kMoeLaneExperts; ++i) {
    const int e = lane + 32 * i;
    value[i] = e < E ? lr[e] : -INFINITY;
    if (e >= E) struck |= 1u << i;
  }
  if (kSigmoid) {
    UNROLL for (int i = 0; i < kMoeLaneExperts; ++i) {
      const int e = lane + 32 * i;
      value[i] = e < E ? 1.0f / (1.0f + expf(-value[i])) : 0.0f;
      key[i] = e < E ? value[i] + (bias != nullptr ? to_float(bias[e]) : 0.0f) : 0.0f;
    }
  } else {
    float row_max = -INFINITY;
    UNROLL for (int i = 0; i < kMoeLaneExperts; ++i) row_max = fmaxf(row_max, value[i]);
    row_max = warp_max(row_max);
    float sum = 0.0f;
    UNROLL for (int i = 0; i < kMoeLaneExperts; ++i) {
      value[i] = lane + 32 * i < E ? expf(value[i] - row_max) : 0.0f;
      sum += value[i];
    }
    sum = warp_sum(sum);
    UNROLL for (int i = 0; i < kMoeLaneExperts; ++i) {
      value[i] = value[i] / sum;
      key[i] = value[i];
    }
  }
  UNROLL for (int i = 0; i < kMoeLaneExperts; ++i)
    if (lane + 32 * i < E) vr[lane + 32 * i] = value[i];

  // Round k's winner is kept by lane k % 32 in slot k / 32, so the outputs are written coalesced.
  float chosen_value[kMoeLaneExperts];
  int chosen_expert[kMoeLaneExperts];
  UNROLL for (int i = 0; i < kMoeLaneExperts; ++i) {
    chosen_value[i] = 0.0f;
    chosen_expert[i] = 0;
  }
  float total = 0.0f;
  for (int k = 0; k < K; ++k) {
    float best_key = 0.0f, best_value = 0.0f;
    int best = -1;  // none yet
    if (balanced) {
      best = static_cast<int>((static_cast<long long>(row) * K + k) % E);
      float held = 0.0f;  // the value of `best` if this lane holds it
      UNROLL for (int i = 0; i < kMoeLaneExperts; ++i)
        if (i == best / 32) held = value[i];
      best_value = __shfl_sync(0xffffffffu, held, best % 32);
    } else {
      UNROLL for (int i = 0; i < kMoeLaneExperts; ++i) {
        const int e = lane + 32 * i;
        if (!((struck >> i) & 1u) && (best < 0 || moe_chosen_before(key[i], e, best_key, best))) {
          best_key = key[i];
          best_value = value[i];
          best = e;
        }
      }
      for (int offset = 16; offset > 0; offset >>= 1) {
        const float other_key = __shfl_xor_sync(0xffffffffu, best_key, offset);
        const float other_value = __shfl_xor_sync(0xffffffffu, best_value, offset);
        const int other = __shfl_xor_sync(0xffffffffu, best, offset);
        if (other >= 0 && (best < 0 || moe_chosen_before(other_key, other, best_key, best))) {
          best_key = other_key;
          best_value = other_value;
          best = other;
        }
      }
    }
    if (best % 32 == lane) struck |= 1u << (best / 32);
    total += best_value;
    UNROLL for (int i = 0; i < kMoeLaneExperts; ++i)
      if (k == lane + 32 * i) {
        chosen_value[i] = best_value;
        chosen_expert[i] = best;
      }
  }
  UNROLL for (int i = 0; i < kMoeLaneExperts; ++i) {
    const int k = lane + 32 * i;
    if (k >= K) continue;
    expert[static_cast<size_t>(row) * K + k] = chosen_expert[i];
    gate[static_cast<size_t>(row) * K + k] = chosen_value[i] / total;
  }
}

// counts[e] += #{(n, k): expert[n][k] == e}; prob_sums[e] += Σ_n probs[n][e] in
// block_column_sum's order. Block b owns experts [32·b, 32·b + 32): it counts their pairs in
// shared memory (integer atomics: the count is the same in any order) and sums their columns.
__global__ void __launch_bounds__(kMoeStatsThreads)
moe_router_stats_kernel(int* counts, float* prob_sums, const int* expert, const float* probs, int N, int E, int K) {
  LAUNCH_BOUNDS_GUARD(kMoeStatsThreads);
  __shared__ int block_counts[kColumnSumWidth];
  const int tid = threadIdx.y * kColumnSumWidth + threadIdx.x;
  const int first = blockIdx.x * kColumnSumWidth;
  if (tid < kColumnSumWidth) block_counts[tid] = 0;
  __syncthreads();
  const size_t pairs = static_cast<size_t>(N) * K;
  for (size_t i = tid; i < pairs; i += kMoeStatsThreads) {
    const int local = expert[i] - first;
    if (local >= 0 && local < kColumnSumWidth) atomicAdd(&block_counts[local], 1);
  }
  const float sum = block_column_sum(probs, N, E);  // its __syncthreads also orders the counts
  const int e = first + threadIdx.x;
  if (threadIdx.y != 0 || e >= E) return;
  counts[e] += block_counts[threadIdx.x];
  prob_sums[e] += sum;
}

// One warp per row, through the renormalisation over the chosen (g_k = v_k / S, S = Σ_k v_k):
//   dv_j = (dgate_j − Σ_k dgate_k·g_k) / S for a chosen j, 0 otherwise,
// then softmax (plus dprob_aux[e] in every row, then dlogit = p ⊙ (dp − Σ_e p·dp)) or sigmoid
// (dlogit = dv·s·(1 − s)). The row's dv is gathered in shared memory, scattered to by expert.
template <bool kSigmoid>
__global__ void moe_router_backward_kernel(float* dlogits, const float* dgate, const float* values, const int* expert,
                                           const float* gate, const float* dprob_aux, int N, int E, int K) {
  __shared__ float dvalue_rows[kMoeRouterWarps][kMoeMaxExperts];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row = blockIdx.x * kMoeRouterWarps + warp;
  if (row >= N) return;  // only __syncwarp below
  float* dv = dvalue_rows[warp];
  const float* vr = values + static_cast<size_t>(row) * E;
  const size_t first_pair = static_cast<size_t>(row) * K;
  float lane_total = 0.0f, lane_dot = 0.0f;
  for (int k = lane; k < K; k += 32) {
    lane_total += vr[expert[first_pair + k]];
    lane_dot += dgate[first_pair + k] * gate[first_pair + k];
  }
  const float total = warp_sum(lane_total), dot = warp_sum(lane_dot);
  for (int e = lane; e < E; e += 32) dv[e] = dprob_aux != nullptr ? dprob_aux[e] : 0.0f;
  __syncwarp();
  for (int k = lane; k < K; k += 32) dv[expert[first_pair + k]] += (dgate[first_pair + k] - dot) / total;
  __syncwarp();
  float* out = dlogits + static_cast<size_t>(row) * E;
  if (kSigmoid) {
    for (int e = lane; e < E; e += 32) out[e] = dv[e] * vr[e] * (1.0f - vr[e]);
  } else {
    float lane_pdp = 0.0f;
    for (int e = lane; e < E; e += 32) lane_pdp += vr[e] * dv[e];
    const float pdp = warp_sum(lane_pdp);
    for (int e = lane; e < E; e += 32) out[e] = vr[e] * (dv[e] - pdp);
  }
}

// dx[n][c] += Σ_e dlogits[n][e]·w[e][c], e in increasing order, added to dx once. Block (g, tile)
// owns rows [8g, 8g + 8) and the 128 chunks of columns from chunk 128·tile; thread t one chunk.
template <typename T>
__global__ void moe_router_dx_kernel(T* dx, const float* dlogits, const T* w, int N, int C, int E) {
  constexpr int kVec = Vec128<T>::size;
  __shared__ float dl[kMoeGradRows][kMoeMaxExperts];
  const int first = blockIdx.x * kMoeGradRows;
  const int rows = N - first < kMoeGradRows ? N - first : kMoeGradRows;
  for (int t = threadIdx.x; t < rows * E; t += blockDim.x)
    dl[t / E][t % E] = dlogits[static_cast<size_t>(first) * E + t];
  __syncthreads();
  const int chunk = blockIdx.y * kMoeGradChunks + threadIdx.x;
  if (chunk >= C / kVec) return;
  float acc[kMoeGradRows][kVec];
  UNROLL for (int r = 0; r < kMoeGradRows; ++r) UNROLL for (int i = 0; i < kVec; ++i) acc[r][i] = 0.0f;
  for (int e = 0; e < E; ++e) {
    const Vec128<T> wv = load128(w + static_cast<size_t>(e) * C + chunk * kVec);
    UNROLL for (int r = 0; r < kMoeGradRows; ++r) {
      const float g = r < rows ? dl[r][e] : 0.0f;
      UNROLL for (int i = 0; i < kVec; ++i) acc[r][i] += g * to_float(wv[i]);
    }
  }
  UNROLL for (int r = 0; r < kMoeGradRows; ++r) {
    if (r >= rows) continue;
    T* p = dx + static_cast<size_t>(first + r) * C + chunk * kVec;
    Vec128<T> v = load128(p);
    UNROLL for (int i = 0; i < kVec; ++i) v[i] = from_float<T>(to_float(v[i]) + acc[r][i]);
    store128(p, v);
  }
}

// Weight gradient, first level: partials[g][e][c] = Σ dlogits[n][e]·x[n][c] over row group g's
// rows in increasing order. Block (tile, expert tile, g): thread t owns one chunk of columns and
// kMoeGradExperts experts, reading each x chunk once for all of them.
template <typename T>
__global__ void moe_router_dw_partial_kernel(float* partials, const float* dlogits, const T* x, int N, int C, int E,
                                             int rows_per_group) {
  constexpr int kVec = Vec128<T>::size;
  const int chunk = blockIdx.x * kMoeGradChunks + threadIdx.x;
  if (chunk >= C / kVec) return;
  const int e0 = blockIdx.y * kMoeGradExperts;
  const int first = blockIdx.z * rows_per_group;
  const int end = first + rows_per_group < N ? first + rows_per_group : N;
  float acc[kMoeGradExperts][kVec];
  UNROLL for (int t = 0; t < kMoeGradExperts; ++t) UNROLL for (int i = 0; i < kVec; ++i) acc[t][i] = 0.0f;
  for (int n = first; n < end; ++n) {
    const Vec128<T> xv = load128(x + static_cast<size_t>(n) * C + chunk * kVec);
    UNROLL for (int t = 0; t < kMoeGradExperts; ++t) {
      const float g = e0 + t < E ? dlogits[static_cast<size_t>(n) * E + e0 + t] : 0.0f;
      UNROLL for (int i = 0; i < kVec; ++i) acc[t][i] += g * to_float(xv[i]);
    }
  }
  UNROLL for (int t = 0; t < kMoeGradExperts; ++t) {
    if (e0 + t >= E) continue;
    float* p = partials + (static_cast<size_t>(blockIdx.z) * E + e0 + t) * C + chunk * kVec;
    UNROLL for (int h = 0; h < kVec; h += Vec128<float>::size) {
      Vec128<float> v;
      UNROLL for (int i = 0; i < Vec128<float>::size; ++i) v[i] = acc[t][h + i];
      store128(p + h, v);
    }
  }
}

// dw[e][c] += Σ_g partials[g][e][c], g in increasing order, added once: one thread per 128-bit
// chunk of dw (the partials' rows read as fp32 vectors, coalesced across the threads).
template <typename T>
__global__ void moe_router_dw_reduce_kernel(T* dw, const float* partials, int groups, size_t chunks) {
  constexpr int kVec = Vec128<T>::size;
  constexpr int kFloatVec = Vec128<float>::size;
  const size_t chunk = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (chunk >= chunks) return;
  float acc[kVec];
  UNROLL for (int i = 0; i < kVec; ++i) acc[i] = 0.0f;
  for (int g = 0; g < groups; ++g) {
    const float* row = partials + (static_cast<size_t>(g) * chunks + chunk) * kVec;
    UNROLL for (int h = 0; h < kVec; h += kFloatVec) {
      const Vec128<float> v = load128(row + h);
      UNROLL for (int i = 0; i < kFloatVec; ++i) acc[h + i] += v[i];
    }
  }
  Vec128<T> d = load128(dw + chunk * kVec);
  UNROLL for (int i = 0; i < kVec; ++i) d[i] = from_float<T>(to_float(d[i]) + acc[i]);
  store128(dw + chunk * kVec, d);
}

// Element i of a rank's owned range [first, first + count) of the (L, E) bias tensor, i.e. layer
// l = (first + i) / E, expert e = (first + i) % E: delta = rate·sign(mean_e(counts[l]) − counts[l][e]),
// compared exactly (E·counts[l][e] against Σ_e counts[l]; the counts are integers held in double).
// With master (fp32): master[i] += delta, param[i] = round-to-nearest(master[i]); without:
// param[i] += delta.
template <typename T>
__global__ void moe_update_expert_bias_kernel(T* param, float* master, const double* counts, float rate, int E,
                                              size_t first, size_t count) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= count) return;
  const size_t l = (first + i) / E, e = (first + i) % E;
  const double* row = counts + l * E;
  double total = 0.0;
  for (int j = 0; j < E; ++j) total += row[j];
  const double scaled = row[e] * E;
  const float delta = total > scaled ? rate : (total < scaled ? -rate : 0.0f);
  if (master != nullptr) {
    master[i] += delta;
    param[i] = from_float<T>(master[i]);
  } else {
    param[i] = from_float<T>(to_float(param[i]) + delta);
  }
}

// out[i] = counts[i] as double (exact), so the counts can be summed over ranks without overflow.
__global__ void moe_widen_counts_kernel(double* out, const int* counts, size_t n) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = static_cast<double>(counts[i]);
}

inline void moe_router_check(const char* op, int N, int E, int K) {
  if (N < 0 || E < 1 || E > kMoeMaxExperts || K < 1 || K > E)
    throw_errorf("%s: need N>=0 and 1<=K<=E<=%d; got N=%d E=%d K=%d", op, kMoeMaxExperts, N, E, K);
}
template <typename T>
void moe_router_check_width(const char* op, int N, int C, int E) {
  moe_router_check(op, N, E, 1);
  if (C < 1 || C % Vec128<T>::size != 0)
    throw_errorf("%s: need C a positive multiple of %d (128-bit accesses); got C=%d", op, Vec128<T>::size, C);
}

inline unsigned moe_router_row_blocks(int N) { return static_cast<unsigned>(ceil_div(N, kMoeRouterWarps)); }

// Row groups of the weight gradient's first level: at least kMoeGradMinGroupRows rows each, at
// most kMoeGradMaxGroups groups and at most kMoeGradMaxPartials floats of partials in all.
// Functions of N, C and E only, so the summation order never changes with the launch.
constexpr int kMoeGradMinGroupRows = 32;
constexpr int kMoeGradMaxGroups = 256;
constexpr size_t kMoeGradMaxPartials = size_t{1} << 23;  // 32 MB of fp32
inline int moe_router_grad_groups(int N, int C, int E) {
  const size_t fit = kMoeGradMaxPartials / (static_cast<size_t>(C) * E);
  const int cap = fit < 1 ? 1 : (fit > kMoeGradMaxGroups ? kMoeGradMaxGroups : static_cast<int>(fit));
  const int wanted = ceil_div(N > 0 ? N : 1, kMoeGradMinGroupRows);
  return wanted < cap ? wanted : cap;
}
inline int moe_router_grad_group_rows(int N, int C, int E) {
  return ceil_div(N > 0 ? N : 1, moe_router_grad_groups(N, C, E));
}

// Bytes of fp32 scratch moe_router_input_backward needs: one (E, C) partial per row group.
inline size_t moe_router_input_backward_scratch_bytes(int N, int C, int E) {
  return static_cast<size_t>(moe_router_grad_groups(N, C, E)) * E * C * sizeof(float);
}

// logits (N, E) = x (N, C) · wᵀ, fp32 (written).
template <typename T>
void moe_router_logits(float* logits, const T* x, const T* w, int N, int C, int E, cudaStream_t stream) {
  moe_router_check_width<T>("moe_router_logits", N, C, E);
  if (N == 0) return;
  launch(moe_router_logits_kernel<T>, dim3(moe_router_row_blocks(N)), dim3(32 * kMoeRouterWarps), 0, stream, logits,
         x, w, N, C, E);
  CUDA_CHECK(cudaGetLastError());
}

// Mixtral's routing: probs = softmax(logits) over all E; expert[n][k] = the k-th largest
// probability (ties: the lower index); gate[n][k] = probs[n][expert[n][k]] / Σ_k' of the chosen.
// All written.
inline void moe_route_softmax_topk(float* probs, int* expert, float* gate, const float* logits, int N, int E, int K,
                                   cudaStream_t stream, MoeChoice choice = MoeChoice::top_k) {
  moe_router_check("moe_route_softmax_topk", N, E, K);
  if (N == 0) return;
  launch(moe_route_topk_kernel<false, float>, dim3(moe_router_row_blocks(N)), dim3(32 * kMoeRouterWarps), 0, stream, probs,
         expert, gate, logits, static_cast<const float*>(nullptr), N, E, K, choice == MoeChoice::balanced);
  CUDA_CHECK(cudaGetLastError());
}

// DeepSeek-V3's routing: scores = sigmoid(logits); the top K of scores + bias chosen (ties: the
// lower index; bias nullptr: none); gate[n][k] = scores[n][expert[n][k]] / Σ_k' of the chosen
// (the bias steers the selection only). All written. The bias (E) is read in its storage type B
// (float or bf16: the model's parameter, no copy) and added in fp32.
template <typename B>
void moe_route_sigmoid_topk(float* scores, int* expert, float* gate, const float* logits, const B* bias, int N, int E,
                            int K, cudaStream_t stream, MoeChoice choice = MoeChoice::top_k) {
  moe_router_check("moe_route_sigmoid_topk", N, E, K);
  if (N == 0) return;
  launch(moe_route_topk_kernel<true, B>, dim3(moe_router_row_blocks(N)), dim3(32 * kMoeRouterWarps), 0, stream, scores,
         expert, gate, logits, bias, N, E, K, choice == MoeChoice::balanced);
  CUDA_CHECK(cudaGetLastError());
}

// ACCUMULATES the load-balancing statistics of one layer: counts[e] += the (n, k) routed to e;
// prob_sums[e] += Σ_n probs[n][e] (fixed-order fp32). Zero both before the first layer of a step.
inline void moe_router_stats(int* counts, float* prob_sums, const int* expert, const float* probs, int N, int E, int K,
                             cudaStream_t stream) {
  moe_router_check("moe_router_stats", N, E, K);
  launch(moe_router_stats_kernel, dim3(ceil_div(E, kColumnSumWidth)), dim3(kColumnSumWidth, kColumnSumWarps), 0,
         stream, counts, prob_sums, expert, probs, N, E, K);
  CUDA_CHECK(cudaGetLastError());
}

// dlogits (written) of the softmax routing given dgate (N, K) and, when not nullptr, dprob_aux
// (E): the load-balancing loss's gradient with respect to each probability, the same for every
// row (the caller's: coefficient · E · f_e / R for aux = E · Σ_e f_e · P_e with P_e = Σ_n p / R).
inline void moe_router_backward_softmax(float* dlogits, const float* dgate, const float* probs, const int* expert,
                                        const float* gate, const float* dprob_aux, int N, int E, int K,
                                        cudaStream_t stream) {
  moe_router_check("moe_router_backward_softmax", N, E, K);
  if (N == 0) return;
  launch(moe_router_backward_kernel<false>, dim3(moe_router_row_blocks(N)), dim3(32 * kMoeRouterWarps), 0, stream,
         dlogits, dgate, probs, expert, gate, dprob_aux, N, E, K);
  CUDA_CHECK(cudaGetLastError());
}

// dlogits (written) of the sigmoid routing given dgate: through the renormalisation and the
// sigmoid; the unchosen experts' are 0 (the bias has no gradient).
inline void moe_router_backward_sigmoid(float* dlogits, const float* dgate, const float* scores, const int* expert,
                                        const float* gate, int N, int E, int K, cudaStream_t stream) {
  moe_router_check("moe_router_backward_sigmoid", N, E, K);
  if (N == 0) return;
  launch(moe_router_backward_kernel<true>, dim3(moe_router_row_blocks(N)), dim3(32 * kMoeRouterWarps), 0, stream,
         dlogits, dgate, scores, expert, gate, static_cast<const float*>(nullptr), N, E, K);
  CUDA_CHECK(cudaGetLastError());
}

// Backward of moe_router_logits. Both gradients ACCUMULATE, each rounded to T once per call:
//   dx[n][c] += Σ_e dlogits[n][e]·w[e][c]    dw[e][c] += Σ_n dlogits[n][e]·x[n][c]
// scratch: moe_router_input_backward_scratch_bytes(N, C, E) bytes of device memory (overwritten).
// dx must not alias x or w.
template <typename T>
void moe_router_input_backward(T* dx, T* dw, float* scratch, const float* dlogits, const T* x, const T* w, int N,
                               int C, int E, cudaStream_t stream) {
  moe_router_check_width<T>("moe_router_input_backward", N, C, E);
  if (N == 0) return;
  const unsigned tiles = static_cast<unsigned>(ceil_div(C / Vec128<T>::size, kMoeGradChunks));
  launch(moe_router_dx_kernel<T>, dim3(ceil_div(N, kMoeGradRows), tiles), dim3(kMoeGradChunks), 0, stream, dx,
         dlogits, w, N, C, E);
  CUDA_CHECK(cudaGetLastError());
  const int groups = moe_router_grad_groups(N, C, E);
  launch(moe_router_dw_partial_kernel<T>, dim3(tiles, ceil_div(E, kMoeGradExperts), groups), dim3(kMoeGradChunks), 0,
         stream, scratch, dlogits, x, N, C, E, moe_router_grad_group_rows(N, C, E));
  CUDA_CHECK(cudaGetLastError());
  const size_t chunks = static_cast<size_t>(E) * (C / Vec128<T>::size);
  launch(moe_router_dw_reduce_kernel<T>, dim3(static_cast<unsigned>(ceil_div(chunks, size_t{256}))), dim3(256), 0,
         stream, dw, scratch, groups, chunks);
  CUDA_CHECK(cudaGetLastError());
}

// counts (n, device) as double in out (written): the bias update's counts, ready to be summed
// over the data-parallel ranks.
inline void moe_widen_counts(double* out, const int* counts, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  launch(moe_widen_counts_kernel, dim3(static_cast<unsigned>(ceil_div(n, size_t{256}))), dim3(256), 0, stream, out,
         counts, n);
  CUDA_CHECK(cudaGetLastError());
}

// Aux-loss-free balancing (DeepSeek-V3), outside the gradient, on elements [first, first + count)
// of the (L, E) bias tensor (index within the tensor: a rank's owned segment, param and master
// pointing at its first element): bias[l][e] += rate·sign(mean_e(counts[l]) − counts[l][e]) (0 when
// equal), counts (L, E) the step's rows routed per layer and expert: an under-loaded expert's bias
// rises, an over-loaded one's falls. master (fp32; nullptr: none, the parameters are updated
// themselves): the master moves and the parameter becomes its round-to-nearest.
template <typename T>
void moe_update_expert_bias(T* param, float* master, const double* counts, float rate, int L, int E, size_t first,
                            size_t count, cudaStream_t stream) {
  if (L < 1 || E < 1 || first + count > static_cast<size_t>(L) * E)
    throw_errorf("moe_update_expert_bias: need L>=1, E>=1 and first+count<=L*E; got L=%d E=%d first=%zu count=%zu", L,
                 E, first, count);
  if (count == 0) return;
  launch(moe_update_expert_bias_kernel<T>, dim3(static_cast<unsigned>(ceil_div(count, size_t{256}))), dim3(256), 0,
         stream, param, master, counts, rate, E, first, count);
  CUDA_CHECK(cudaGetLastError());
}
