// adamw.cuh — the AdamW parameter update, element-wise over a table of segments (contiguous
// ranges of tensors) in one launch, with an optional fp32 master copy whose value is written back
// to the T parameters by seeded stochastic rounding when T is bf16.
#pragma once
#include "common.cuh"

#include <cmath>
#include <vector>

constexpr int kAdamWThreads = 256;

// Scalars shared by every element of one update.
struct AdamWHyper {
  float lr, beta1, beta2, eps, weight_decay, grad_scale;
  float bias_correction1, bias_correction2;  // 1 - beta^step, computed on the host
};

// One AdamW step on one element: moments updated in place, the new parameter returned.
// weight_decay is the element's: h.weight_decay for decayed tensors, 0 for the others.
__device__ __forceinline__ float adamw_step(float p, float grad, float& m, float& v, const AdamWHyper& h,
                                            float weight_decay) {
  const float g = grad * h.grad_scale;
  m = h.beta1 * m + (1.0f - h.beta1) * g;
  v = h.beta2 * v + (1.0f - h.beta2) * g * g;
  const float m_hat = m / h.bias_correction1;
  const float v_hat = v / h.bias_correction2;
  return p - h.lr * (m_hat / (sqrtf(v_hat) + h.eps) + weight_decay * p);
}

// 16 uniformly distributed bits for element `index` under `seed`: a counter-based hash, so
// any element's bits can be recomputed from (seed, index) alone, in any order, on any device.
// x = seed * 0x9E3779B97F4A7C15 + index (mod 2^64), then MurmurHash3's 64-bit finalizer
// (x ^= x >> 33; x *= 0xff51afd7ed558ccd; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53; x ^= x >> 33);
// the result is bits 32..47 of x.
__device__ __forceinline__ uint32_t adamw_random16(unsigned seed, size_t index) {
  uint64_t x = static_cast<uint64_t>(seed) * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(index);
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return static_cast<uint32_t>(x >> 32) & 0xFFFFu;
}

// The value stored into a T parameter. fp32: exact. bf16: stochastic rounding — adding 16
// random bits below the bf16 mantissa and truncating rounds |x| up to the next bf16 with
// probability (dropped bits) / 2^16, so the expected stored value is x. NaN stays NaN.
template <typename T> __device__ __forceinline__ T adamw_store_value(float x, unsigned seed, size_t index);
template <> __device__ __forceinline__ float adamw_store_value<float>(float x, unsigned, size_t) { return x; }
template <> __device__ __forceinline__ bf16 adamw_store_value<bf16>(float x, unsigned seed, size_t index) {
  if (x != x) return __float2bfloat16_rn(x);
  uint32_t bits;
  memcpy(&bits, &x, sizeof(bits));
  bits += adamw_random16(seed, index);
  __nv_bfloat16_raw raw;
  raw.x = static_cast<unsigned short>(bits >> 16);
  return bf16(raw);
}


// One row of the update's segment table: a contiguous range of one tensor, with where its
// parameters, gradients and optimizer state (m, v, master) start in their arrays. Built once per
// model (adamw_plan_segments fills the launch fields), kept in device memory.
struct AdamWSegment {
  size_t param, grad, state, count;
  size_t index;    // the first element's index within its tensor: the stochastic rounding's counter
  size_t head;     // scalar elements before the 128-bit body (count: no body, the arrays are not mutually aligned)
  size_t vectors;  // 128-bit chunks of the body; the rest of count is the scalar tail
  size_t first_block;  // the segment's first block in the launch; its blocks run to the next segment's
  int tensor;          // its rounding seed is AdamWSeeds::of_tensor[tensor]
  int decayed;         // 1: weight decay applies (2-D weights), 0: biases and LayerNorm parameters
};

// The stochastic-rounding seed of each tensor for one step (the tensor index has 5 bits).
constexpr int kAdamWMaxTensors = 32;
struct AdamWSeeds {
  unsigned of_tensor[kAdamWMaxTensors];
};

// Units of work within a segment: `head` scalar elements up to the first 16-byte boundary,
// `vectors` chunks of W = 16 / sizeof(T) elements moved with 128-bit accesses, then the scalar
// tail. One unit per thread; each block works in one segment (the last block with first_block <=
// blockIdx.x), so the table's blocks tile the grid and every element keeps its own decay and index.
template <typename T>
__global__ void __launch_bounds__(kAdamWThreads)
    adamw_kernel(const AdamWSegment* segments, int num_segments, T* params, float* master, const T* grads, float* m,
                 float* v, AdamWHyper h, AdamWSeeds seeds) {
  LAUNCH_BOUNDS_GUARD(kAdamWThreads);
  constexpr int W = Vec128<T>::size;
  constexpr int F = W / Vec128<float>::size;  // fp32 vectors per chunk
  __shared__ int segment;
  if (threadIdx.x == 0) {
    int lo = 0, hi = num_segments - 1;  // segments[lo].first_block <= blockIdx.x
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (segments[mid].first_block <= blockIdx.x) lo = mid;
      else hi = mid - 1;
    }
    segment = lo;
  }
  __syncthreads();
  const AdamWSegment s = segments[segment];
  const size_t u = (blockIdx.x - s.first_block) * static_cast<size_t>(blockDim.x) + threadIdx.x;
  const size_t units = s.count - s.vectors * (W - 1);
  if (u >= units) return;
  T* p_seg = params + s.param;
  float* master_seg = master ? master + s.state : nullptr;
  const T* g_seg = grads + s.grad;
  float* m_seg = m + s.state;
  float* v_seg = v + s.state;
  const float weight_decay = s.decayed ? h.weight_decay : 0.0f;
  const unsigned seed = seeds.of_tensor[s.tensor];

  if (u < s.head || u >= s.head + s.vectors) {
    const size_t i = u < s.head ? u : u + s.vectors * (W - 1);
    const float p = master_seg ? master_seg[i] : to_float(p_seg[i]);
    const float updated = adamw_step(p, to_float(g_seg[i]), m_seg[i], v_seg[i], h, weight_decay);
    if (master_seg) master_seg[i] = updated;
    p_seg[i] = adamw_store_value<T>(updated, seed, s.index + i);
    return;
  }

  const size_t base = s.head + (u - s.head) * W;
  float p[W], mo[W], ve[W];
  const Vec128<T> g = load128(g_seg + base);
  if (master_seg) {
    for (int f = 0; f < F; ++f) {
      const Vec128<float> x = load128cs(master_seg + base + 4 * f);
      for (int k = 0; k < 4; ++k) p[4 * f + k] = x[k];
    }
  } else {
    const Vec128<T> x = load128(p_seg + base);
    for (int k = 0; k < W; ++k) p[k] = to_float(x[k]);
  }
  for (int f = 0; f < F; ++f) {
    const Vec128<float> mf = load128cs(m_seg + base + 4 * f), vf = load128cs(v_seg + base + 4 * f);
    for (int k = 0; k < 4; ++k) {
      mo[4 * f + k] = mf[k];
      ve[4 * f + k] = vf[k];
    }
  }
  for (int k = 0; k < W; ++k) p[k] = adamw_step(p[k], to_float(g[k]), mo[k], ve[k], h, weight_decay);
  for (int f = 0; f < F; ++f) {
    Vec128<float> mf, vf, pf;
    for (int k = 0; k < 4; ++k) {
      mf[k] = mo[4 * f + k];
      vf[k] = ve[4 * f + k];
      pf[k] = p[4 * f + k];
    }
    store128cs(m_seg + base + 4 * f, mf);
    store128cs(v_seg + base + 4 * f, vf);
    if (master_seg) store128cs(master_seg + base + 4 * f, pf);
  }
  Vec128<T> out;
  for (int k = 0; k < W; ++k) out[k] = adamw_store_value<T>(p[k], seed, s.index + base + k);
  store128(p_seg + base, out);
}

// Whether ptr + head elements of `bytes_per_element` lands on a 16-byte boundary.
inline bool adamw_aligned_after(const void* ptr, size_t head, size_t bytes_per_element) {
  return (reinterpret_cast<uintptr_t>(ptr) + head * bytes_per_element) % 16 == 0;
}

// The scalars of step `step` (1-based): the bias corrections 1 - beta^step are computed here once
// (double, then fp32). grad_scale carries gradient clipping (clip / norm when norm > clip, else 1).
inline AdamWHyper adamw_hyper(float lr, float beta1, float beta2, float eps, float weight_decay, float grad_scale,
                              int step) {
  if (step < 1)
    throw_error("adamw: step must be >= 1 (1-based, for bias correction), got " + std::to_string(step));
  AdamWHyper h;
  h.lr = lr;
  h.beta1 = beta1;
  h.beta2 = beta2;
  h.eps = eps;
  h.weight_decay = weight_decay;
  h.grad_scale = grad_scale;
  h.bias_correction1 = static_cast<float>(1.0 - std::pow(static_cast<double>(beta1), step));
  h.bias_correction2 = static_cast<float>(1.0 - std::pow(static_cast<double>(beta2), step));
  return h;
}

// The launch of a planned table: its blocks, and the elements it updates.
struct AdamWPlan {
  size_t blocks = 0, elements = 0;
};

// Fills the launch fields (head, vectors, first_block) of `segments` (param, grad, state, count,
// index, tensor, decayed set by the caller, tensor < kAdamWMaxTensors) for these arrays; returns
// the launch's plan. A segment moves its body with 128-bit accesses when all its arrays reach
// a 16-byte boundary at the same element, else every element is scalar; results are identical.
template <typename T>
AdamWPlan adamw_plan_segments(std::vector<AdamWSegment>& segments, const T* params, const float* master,
                              const T* grads, const float* m, const float* v) {
  constexpr size_t W = Vec128<T>::size;
  size_t blocks = 0, elements = 0;
  for (AdamWSegment& s : segments) {
    if (s.tensor < 0 || s.tensor >= kAdamWMaxTensors)
      throw_error("adamw: tensor index " + std::to_string(s.tensor) + " outside 0.." +
                               std::to_string(kAdamWMaxTensors - 1));
    const T* p = params + s.param;
    const size_t to_boundary = (16 - reinterpret_cast<uintptr_t>(p) % 16) % 16 / sizeof(T);
    s.head = to_boundary < s.count ? to_boundary : s.count;
    const bool mutually_aligned =
        adamw_aligned_after(grads + s.grad, s.head, sizeof(T)) && adamw_aligned_after(m + s.state, s.head, 4) &&
        adamw_aligned_after(v + s.state, s.head, 4) &&
        (master == nullptr || adamw_aligned_after(master + s.state, s.head, 4));
    if (!mutually_aligned) s.head = s.count;
    s.vectors = (s.count - s.head) / W;
    s.first_block = blocks;
    blocks += ceil_div(s.count - s.vectors * (W - 1), static_cast<size_t>(kAdamWThreads));
    elements += s.count;
  }
  if (blocks > 0x7FFFFFFFu) throw_error("adamw: " + std::to_string(blocks) + " blocks exceed the grid");
  return AdamWPlan{blocks, elements};
}

// One AdamW step over every segment of a planned table (device_segments: num_segments rows,
// `plan` from adamw_plan_segments), one launch. For element i of a segment:
//   g = grads[i] * grad_scale
//   m[i] = beta1 m[i] + (1 - beta1) g;   v[i] = beta2 v[i] + (1 - beta2) g^2
//   p -= lr * (m[i] / (1 - beta1^step) / (sqrtf(v[i] / (1 - beta2^step)) + eps) + wd * p)
// with wd = h.weight_decay for decayed segments, else 0. With master != nullptr, p is master[i]
// (fp32, updated in place) and params[i] receives it rounded to T: exact for float,
// stochastically rounded for bf16 with random bits from (seeds.of_tensor[tensor], index + i), so
// a tensor updated in pieces (a ZeRO shard ending inside it) rounds every element exactly as one
// segment over the whole tensor would. With master == nullptr, p is params[i] itself (fp32 mode;
// for bf16 the write-back is the same stochastic rounding).
template <typename T>
void adamw_launch(const AdamWSegment* device_segments, int num_segments, const AdamWPlan& plan, T* params,
                  float* master, const T* grads, float* m, float* v, const AdamWHyper& h, const AdamWSeeds& seeds,
                  cudaStream_t stream) {
  if (plan.blocks == 0) return;
  // --profile: per element, the gradient read, the parameter written (and read without master
  // weights), m and v read and written, the master weight read and written.
  profile_declare(static_cast<double>(plan.elements) * (sizeof(T) * (master ? 2 : 3) + 4.0 * (master ? 6 : 4)));
  launch(adamw_kernel<T>, dim3(static_cast<unsigned>(plan.blocks)), dim3(kAdamWThreads), 0, stream, device_segments,
         num_segments, params, master, grads, m, v, h, seeds);
  CUDA_CHECK(cudaGetLastError());
}

// One AdamW step over one range of n elements (a table of one segment; index_offset: where the
// range starts within its tensor, seed: its rounding seed). Uploads its table and waits for the
// update before freeing it: for tests and one-off updates, not the training step.
template <typename T>
void adamw_update(T* params, float* master, const T* grads, float* m, float* v, size_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, float grad_scale, int step, unsigned seed,
                  size_t index_offset, cudaStream_t stream) {
  const AdamWHyper h = adamw_hyper(lr, beta1, beta2, eps, weight_decay, grad_scale, step);
  if (n == 0) return;
  std::vector<AdamWSegment> table(1);
  table[0] = AdamWSegment{0, 0, 0, n, index_offset, 0, 0, 0, 0, 1};
  const AdamWPlan plan = adamw_plan_segments(table, params, master, grads, m, v);
  AdamWSeeds seeds{};
  seeds.of_tensor[0] = seed;
  AdamWSegment* device_table = nullptr;
  CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&device_table), sizeof(AdamWSegment)));
  CUDA_CHECK(cudaMemcpy(device_table, table.data(), sizeof(AdamWSegment), cudaMemcpyHostToDevice));
  adamw_launch(device_table, 1, plan, params, master, grads, m, v, h, seeds, stream);
  CUDA_CHECK(cudaStreamSynchronize(stream));
  CUDA_CHECK(cudaFree(device_table));
}
