// classifier.cuh — the loss head: softmax over the vocabulary, cross-entropy against the
// target token, and (for training) the gradient of the loss w.r.t. the logits, fused so each
// logits row is read twice (statistics, then gradient) and written once, in place.
//
// Layout: logits (rows, Vp) row-major; columns < V are real tokens, columns V..Vp-1 are the
// vocabulary padding, which receives no probability and a zero gradient.
#pragma once
#include "common.cuh"

#include <cfloat>

constexpr int kClassifierThreads = 1024;
constexpr int kClassifierWarps = kClassifierThreads / 32;

// Running softmax statistics (max, sum of exp(x - max)) of the elements seen so far.
struct ClassifierStats {
  float max;
  float sum;
};

// Folds one value into running statistics, rescaling the sum when the maximum moves.
__device__ __forceinline__ void classifier_stats_add(ClassifierStats& s, float x) {
  if (x > s.max) {
    s.sum = s.sum * expf(s.max - x) + 1.0f;
    s.max = x;
  } else {
    s.sum += expf(x - s.max);
  }
}

// Combines every thread's statistics into the row's; every thread returns the same bits.
// Warps reduce by butterfly (commutative pairwise adds, so all lanes agree), then each
// thread folds the per-warp results in warp order: a fixed order, so the result is
// deterministic. -FLT_MAX (not -inf) as the empty maximum keeps expf(max - max) finite.
__device__ __forceinline__ ClassifierStats classifier_block_stats(ClassifierStats s) {
  alignas(16) __shared__ float max_of_warp[kClassifierWarps];
  alignas(16) __shared__ float sum_of_warp[kClassifierWarps];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;

  float m = warp_max(s.max);
  float sum = warp_sum(s.sum * expf(s.max - m));
  if (lane == 0) {
    max_of_warp[warp] = m;
    sum_of_warp[warp] = sum;
  }
  __syncthreads();
  const int warps = blockDim.x / 32;
  float row_max = max_of_warp[0];
  for (int w = 1; w < warps; ++w) row_max = fmaxf(row_max, max_of_warp[w]);
  float row_sum = 0.0f;
  for (int w = 0; w < warps; ++w) row_sum += sum_of_warp[w] * expf(max_of_warp[w] - row_max);
  return {row_max, row_sum};
}

// One block per row. Requires Vp % (16 / sizeof(T)) == 0 and a 16-byte aligned logits
// pointer (checked by the launcher) so every row is read with 128-bit accesses; V itself is
// arbitrary: the vector holding column V-1 is masked element by element.
template <typename T>
__global__ void fused_classifier_kernel(T* logits, float* losses, const int* targets, int V, int Vp, float dloss,
                                        bool write_dlogits) {
  constexpr int W = Vec128<T>::size;
  T* row = logits + static_cast<size_t>(blockIdx.x) * Vp;
  const int target = targets[blockIdx.x];
  // Read before the barrier inside classifier_block_stats: after it the row is overwritten.
  const float target_logit = threadIdx.x == 0 ? to_float(row[target]) : 0.0f;

  ClassifierStats s = {-FLT_MAX, 0.0f};
  const int real_vectors = ceil_div(V, W);
  for (int vi = threadIdx.x; vi < real_vectors; vi += blockDim.x) {
    const Vec128<T> x = load128(row + vi * W);
    for (int k = 0; k < W; ++k) {
      if (vi * W + k < V) classifier_stats_add(s, to_float(x[k]));
    }
  }
  const ClassifierStats row_stats = classifier_block_stats(s);
  const float log_sum = row_stats.max + logf(row_stats.sum);
  if (threadIdx.x == 0) losses[blockIdx.x] = log_sum - target_logit;
  if (!write_dlogits) return;

  // exp(x - log_sum) is the probability with the normalization folded into the exponent.
  const int all_vectors = Vp / W;
  for (int vi = threadIdx.x; vi < all_vectors; vi += blockDim.x) {
    const Vec128<T> x = load128cs(row + vi * W);
    Vec128<T> grad;
    for (int k = 0; k < W; ++k) {
      const int j = vi * W + k;
      float g = 0.0f;
      if (j < V) {
        const float p = expf(to_float(x[k]) - log_sum);
        g = dloss * (p - (j == target ? 1.0f : 0.0f));
      }
      grad[k] = from_float<T>(g);
    }
    store128(row + vi * W, grad);
  }
}

// losses[i] = logsumexp(logits[i, :V]) - logits[i, targets[i]]   (fp32, written, not added).
// When write_dlogits, logits[i, j] is overwritten with dloss * (softmax(logits[i, :V])_j - [j == targets[i]])
// for j < V and with 0 for V <= j < Vp; otherwise logits are left untouched.
// dloss is the loss scale the caller wants the gradient of (1 / (B*T*grad_accum_steps) for a
// mean). targets must lie in [0, V). Requirements: 1 <= V <= Vp, Vp % (16 / sizeof(T)) == 0,
// logits 16-byte aligned.
template <typename T>
void fused_classifier(T* logits, float* losses, const int* targets, int rows, int V, int Vp, float dloss,
                      bool write_dlogits, cudaStream_t stream) {
  constexpr int W = Vec128<T>::size;
  if (V < 1 || V > Vp || Vp % W != 0 || reinterpret_cast<uintptr_t>(logits) % 16 != 0) {
    throw_errorf("fused_classifier: need 1 <= V <= Vp, Vp a multiple of %d and 16-byte aligned logits "
                 "(got V=%d, Vp=%d, logits=%p)",
                 W, V, Vp, static_cast<const void*>(logits));
  }
  if (rows == 0) return;
  launch(fused_classifier_kernel<T>, dim3(rows), dim3(kClassifierThreads), 0, stream, logits, losses, targets, V, Vp,
         dloss, write_dlogits);
  CUDA_CHECK(cudaGetLastError());
}

// One block: *sum += Σ losses[0..rows) in fp64. Thread t adds rows t, t + kClassifierThreads, ...
// in order, then thread 0 adds the threads' sums in thread order: the same bits every run. A
// step's loss stays on the device until the step's figures are copied to the host once.
__global__ void classifier_loss_sum_kernel(double* sum, const float* losses, int rows) {
  __shared__ double partial[kClassifierThreads];
  double s = 0.0;
  for (int r = threadIdx.x; r < rows; r += kClassifierThreads) s += losses[r];
  partial[threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.x != 0) return;
  double total = 0.0;
  for (int t = 0; t < kClassifierThreads; ++t) total += partial[t];
  *sum += total;
}

inline void classifier_loss_sum(double* sum, const float* losses, int rows, cudaStream_t stream) {
  launch(classifier_loss_sum_kernel, dim3(1), dim3(kClassifierThreads), 0, stream, sum, losses, rows);
  CUDA_CHECK(cudaGetLastError());
}
