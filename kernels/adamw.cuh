// adamw.cuh — the AdamW parameter update, element-wise over one tensor (or any contiguous
// range), with an optional fp32 master copy whose value is written back to the T parameters
// by seeded stochastic rounding when T is bf16.
#pragma once
#include "common.cuh"

#include <cmath>

constexpr int kAdamWThreads = 256;

// Scalars shared by every element of one update.
struct AdamWHyper {
  float lr, beta1, beta2, eps, weight_decay, grad_scale;
  float bias_correction1, bias_correction2;  // 1 - beta^step, computed on the host
};

// One AdamW step on one element: moments updated in place, the new parameter returned.
__device__ __forceinline__ float adamw_step(float p, float grad, float& m, float& v, const AdamWHyper& h) {
  const float g = grad * h.grad_scale;
  m = h.beta1 * m + (1.0f - h.beta1) * g;
  v = h.beta2 * v + (1.0f - h.beta2) * g * g;
  const float m_hat = m / h.bias_correction1;
  const float v_hat = v / h.bias_correction2;
  return p - h.lr * (m_hat / (sqrtf(v_hat) + h.eps) + h.weight_decay * p);
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

// Units of work: `head` scalar elements up to the first 16-byte boundary, `vectors` chunks of
// W = 16 / sizeof(T) elements moved with 128-bit accesses, then the scalar tail. One unit per
// thread. The launcher passes vectors = 0 when the arrays are not mutually aligned.
template <typename T>
__global__ void adamw_kernel(T* params, float* master, const T* grads, float* m, float* v, size_t n, size_t head,
                             size_t vectors, AdamWHyper h, unsigned seed, size_t index_offset) {
  constexpr int W = Vec128<T>::size;
  constexpr int F = W / Vec128<float>::size;  // fp32 vectors per chunk
  const size_t u = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  const size_t units = n - vectors * (W - 1);
  if (u >= units) return;

  if (u < head || u >= head + vectors) {
    const size_t i = u < head ? u : u + vectors * (W - 1);
    const float p = master ? master[i] : to_float(params[i]);
    const float updated = adamw_step(p, to_float(grads[i]), m[i], v[i], h);
    if (master) master[i] = updated;
    params[i] = adamw_store_value<T>(updated, seed, index_offset + i);
    return;
  }

  const size_t base = head + (u - head) * W;
  float p[W], mo[W], ve[W];
  const Vec128<T> g = load128(grads + base);
  if (master) {
    for (int f = 0; f < F; ++f) {
      const Vec128<float> x = load128cs(master + base + 4 * f);
      for (int k = 0; k < 4; ++k) p[4 * f + k] = x[k];
    }
  } else {
    const Vec128<T> x = load128(params + base);
    for (int k = 0; k < W; ++k) p[k] = to_float(x[k]);
  }
  for (int f = 0; f < F; ++f) {
    const Vec128<float> mf = load128cs(m + base + 4 * f), vf = load128cs(v + base + 4 * f);
    for (int k = 0; k < 4; ++k) {
      mo[4 * f + k] = mf[k];
      ve[4 * f + k] = vf[k];
    }
  }
  for (int k = 0; k < W; ++k) p[k] = adamw_step(p[k], to_float(g[k]), mo[k], ve[k], h);
  for (int f = 0; f < F; ++f) {
    Vec128<float> mf, vf, pf;
    for (int k = 0; k < 4; ++k) {
      mf[k] = mo[4 * f + k];
      vf[k] = ve[4 * f + k];
      pf[k] = p[4 * f + k];
    }
    store128cs(m + base + 4 * f, mf);
    store128cs(v + base + 4 * f, vf);
    if (master) store128cs(master + base + 4 * f, pf);
  }
  Vec128<T> out;
  for (int k = 0; k < W; ++k) out[k] = adamw_store_value<T>(p[k], seed, index_offset + base + k);
  store128(params + base, out);
}

// Whether ptr + head elements of `bytes_per_element` lands on a 16-byte boundary.
inline bool adamw_aligned_after(const void* ptr, size_t head, size_t bytes_per_element) {
  return (reinterpret_cast<uintptr_t>(ptr) + head * bytes_per_element) % 16 == 0;
}

// One AdamW step (step >= 1, 1-based) over n elements, index i in [0, n):
//   g = grads[i] * grad_scale
//   m[i] = beta1 m[i] + (1 - beta1) g;   v[i] = beta2 v[i] + (1 - beta2) g^2
//   p -= lr * (m[i] / (1 - beta1^step) / (sqrtf(v[i] / (1 - beta2^step)) + eps) + weight_decay * p)
// The bias corrections 1 - beta^step are computed once on the host (double, then fp32).
// With master != nullptr, p is master[i] (fp32, updated in place) and params[i] receives it
// rounded to T: exact for float, stochastically rounded for bf16 with random bits from
// (seed, index_offset + i) — give each tensor and step its own seed; index_offset is where this
// call's range starts within the tensor, so updating a tensor in pieces (a ZeRO shard ending
// inside it) rounds every element exactly as one call over the whole tensor would.
// With master == nullptr, p is params[i] itself (fp32 mode; for bf16 the write-back is the
// same stochastic rounding). Weight decay is whatever the caller passes: it calls once per
// tensor with weight_decay for 2-D weights and 0 for biases and LayerNorm parameters.
// grad_scale carries gradient clipping (clip / norm when norm > clip, else 1).
// Pointers may start at any element offset: when all arrays reach a 16-byte boundary at the
// same element, the body moves with 128-bit accesses and only the head/tail are scalar;
// otherwise every element is scalar. Results are identical either way.
template <typename T>
void adamw_update(T* params, float* master, const T* grads, float* m, float* v, size_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, float grad_scale, int step, unsigned seed,
                  size_t index_offset, cudaStream_t stream) {
  if (step < 1) {
    throw_errorf("adamw_update: step must be >= 1 (1-based, for bias correction), got %d", step);
  }
  if (n == 0) return;
  constexpr size_t W = Vec128<T>::size;
  AdamWHyper h;
  h.lr = lr;
  h.beta1 = beta1;
  h.beta2 = beta2;
  h.eps = eps;
  h.weight_decay = weight_decay;
  h.grad_scale = grad_scale;
  h.bias_correction1 = static_cast<float>(1.0 - std::pow(static_cast<double>(beta1), step));
  h.bias_correction2 = static_cast<float>(1.0 - std::pow(static_cast<double>(beta2), step));

  const size_t to_boundary = (16 - reinterpret_cast<uintptr_t>(params) % 16) % 16 / sizeof(T);
  size_t head = to_boundary < n ? to_boundary : n;
  const bool mutually_aligned = adamw_aligned_after(grads, head, sizeof(T)) && adamw_aligned_after(m, head, 4) &&
                                adamw_aligned_after(v, head, 4) &&
                                (master == nullptr || adamw_aligned_after(master, head, 4));
  if (!mutually_aligned) head = n;
  const size_t vectors = (n - head) / W;
  const size_t units = n - vectors * (W - 1);
  const size_t blocks = ceil_div(units, static_cast<size_t>(kAdamWThreads));
  launch(adamw_kernel<T>, dim3(static_cast<unsigned>(blocks)), dim3(kAdamWThreads), 0, stream, params, master, grads,
         m, v, n, head, vectors, h, seed, index_offset);
  CUDA_CHECK(cudaGetLastError());
}
