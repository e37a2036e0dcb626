// vocab_parallel_classifier.cuh — the loss head of fused_classifier (classifier.cuh) for a
// vocabulary-parallel LM head: each tensor-parallel rank holds a slice of the logits columns,
// and softmax cross-entropy is formed in three launches with two all-reduces between them
// (Megatron's vocab-parallel cross-entropy):
//
//   vocab_parallel_classifier_max     row_max[i] = max over the slice's real columns
//   (caller: all-reduce row_max with max over the tp group)
//   vocab_parallel_classifier_sums    row_sums[2i] = Σ exp(x - row_max[i]), row_sums[2i+1] = target logit or 0
//   (caller: all-reduce row_sums, 2·rows floats, with sum over the tp group)
//   vocab_parallel_classifier_finish  losses, and the slice's dlogits in place
//
// Layout: a rank's logits are (rows, Vl) row-major, column j being global token vocab_begin + j;
// a column is real iff vocab_begin + j < V, the rest is vocabulary padding (no probability, zero
// gradient). A slice may hold no real column at all (the last ranks of a small vocabulary).
// Every row is read with 128-bit accesses, so Vl % (16 / sizeof(T)) == 0 and logits is 16-byte
// aligned (the launchers check); V and vocab_begin are arbitrary, the vector holding the last
// real column is masked element by element. Reductions inside a row use classifier.cuh's
// block reduction: a fixed order, the same bits every run.
#pragma once
#include "classifier.cuh"

#include <algorithm>
#include <cfloat>

// Threads per row: a warp per 32 vectors of the slice, at most kClassifierThreads. Depends on
// Vl alone, so every launch over one slice shape reduces in the same order.
template <typename T>
inline int vocab_parallel_classifier_threads(int Vl) {
  const int vectors = Vl / Vec128<T>::size;
  return std::min(kClassifierThreads, std::max(32, ceil_div(vectors, 32) * 32));
}

// Real columns of a slice: [0, real) with real = clamp(V - vocab_begin, 0, Vl).
__host__ __device__ inline int vocab_parallel_real_columns(int vocab_begin, int V, int Vl) {
  return V - vocab_begin <= 0 ? 0 : (V - vocab_begin < Vl ? V - vocab_begin : Vl);
}

// One block per row: row_max[row] = max of its real columns (-FLT_MAX when none).
template <typename T>
__global__ void vocab_parallel_classifier_max_kernel(float* row_max, const T* logits, int real, int Vl) {
  constexpr int W = Vec128<T>::size;
  const T* row = logits + static_cast<size_t>(blockIdx.x) * Vl;
  float m = -FLT_MAX;
  const int real_vectors = ceil_div(real, W);
  for (int vi = threadIdx.x; vi < real_vectors; vi += blockDim.x) {
    const Vec128<T> x = load128(row + vi * W);
    for (int k = 0; k < W; ++k) {
      if (vi * W + k < real) m = fmaxf(m, to_float(x[k]));
    }
  }
  // Statistics with an empty sum: the block reduction's max is the row's (exact in any order).
  const ClassifierStats stats = classifier_block_stats({m, 0.0f});
  if (threadIdx.x == 0) row_max[blockIdx.x] = stats.max;
}

// One block per row: row_sums[2·row] = Σ exp(x - row_max[row]) over its real columns,
// row_sums[2·row + 1] = the target's logit when the slice holds the target, else 0.
template <typename T>
__global__ void vocab_parallel_classifier_sums_kernel(float* row_sums, const T* logits, const float* row_max,
                                                      const int* targets, int vocab_begin, int real, int Vl) {
  constexpr int W = Vec128<T>::size;
  const T* row = logits + static_cast<size_t>(blockIdx.x) * Vl;
  const float m = row_max[blockIdx.x];
  float sum = 0.0f;
  const int real_vectors = ceil_div(real, W);
  for (int vi = threadIdx.x; vi < real_vectors; vi += blockDim.x) {
    const Vec128<T> x = load128(row + vi * W);
    for (int k = 0; k < W; ++k) {
      if (vi * W + k < real) sum += expf(to_float(x[k]) - m);
    }
  }
  // Every thread's maximum is m, so each rescale factor inside is expf(0) = 1 exactly: the
  // reduction is the warps' butterfly sums added in warp order.
  const ClassifierStats stats = classifier_block_stats({m, sum});
  if (threadIdx.x != 0) return;
  const int local_target = targets[blockIdx.x] - vocab_begin;
  row_sums[2 * blockIdx.x] = stats.sum;
  // Targets lie in [0, V), so a target inside the slice is a real column.
  row_sums[2 * blockIdx.x + 1] = local_target >= 0 && local_target < Vl ? to_float(row[local_target]) : 0.0f;
}

// losses[row] = row_max + log(sum) - target logit, from the all-reduced statistics.
__device__ __forceinline__ float vocab_parallel_classifier_loss(const float* row_max, const float* row_sums,
                                                                int row, float* log_sum) {
  *log_sum = row_max[row] + logf(row_sums[2 * row]);
  return *log_sum - row_sums[2 * row + 1];
}

// One thread per row: the losses alone (finish without dlogits).
__global__ void vocab_parallel_classifier_loss_kernel(float* losses, const float* row_max, const float* row_sums,
                                                      int rows) {
  const int row = blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= rows) return;
  float log_sum;
  losses[row] = vocab_parallel_classifier_loss(row_max, row_sums, row, &log_sum);
}

// One block per row: the loss, and the slice's dlogits over the logits, in place.
template <typename T>
__global__ void vocab_parallel_classifier_finish_kernel(T* logits, float* losses, const float* row_max,
                                                        const float* row_sums, const int* targets, int vocab_begin,
                                                        int real, int Vl, float dloss) {
  constexpr int W = Vec128<T>::size;
  T* row = logits + static_cast<size_t>(blockIdx.x) * Vl;
  float log_sum;
  const float loss = vocab_parallel_classifier_loss(row_max, row_sums, blockIdx.x, &log_sum);
  if (threadIdx.x == 0) losses[blockIdx.x] = loss;
  const int local_target = targets[blockIdx.x] - vocab_begin;  // outside [0, Vl): another rank's

  // exp(x - log_sum) is the probability with the normalization folded into the exponent, as in
  // fused_classifier. Vectors wholly in the padding are written without being read.
  const int all_vectors = Vl / W;
  for (int vi = threadIdx.x; vi < all_vectors; vi += blockDim.x) {
    Vec128<T> grad;
    if (vi * W < real) {
      const Vec128<T> x = load128cs(row + vi * W);
      for (int k = 0; k < W; ++k) {
        const int j = vi * W + k;
        float g = 0.0f;
        if (j < real) {
          const float p = expf(to_float(x[k]) - log_sum);
          g = dloss * (p - (j == local_target ? 1.0f : 0.0f));
        }
        grad[k] = from_float<T>(g);
      }
    } else {
      for (int k = 0; k < W; ++k) grad[k] = from_float<T>(0.0f);
    }
    store128(row + vi * W, grad);
  }
}

// The launchers' shared argument check; op names the launcher in the message.
template <typename T>
void vocab_parallel_classifier_check(const char* op, const T* logits, int rows, int vocab_begin, int V, int Vl) {
  constexpr int W = Vec128<T>::size;
  if (rows < 0 || V < 1 || vocab_begin < 0 || Vl < W || Vl % W != 0 ||
      reinterpret_cast<uintptr_t>(logits) % 16 != 0) {
    throw_errorf("%s: need rows >= 0, V >= 1, vocab_begin >= 0, Vl a positive multiple of %d and 16-byte aligned "
                 "logits (got rows=%d, V=%d, vocab_begin=%d, Vl=%d, logits=%p)",
                 op, W, rows, V, vocab_begin, Vl, static_cast<const void*>(logits));
  }
}

// Phase 1. row_max[i] (fp32, written) = max of logits[i, j] over the slice's real columns
// (vocab_begin + j < V); -FLT_MAX when the slice has none. The caller then all-reduces row_max
// (rows floats) with max over the tensor-parallel group.
template <typename T>
void vocab_parallel_classifier_max(float* row_max, const T* logits, int rows, int vocab_begin, int V, int Vl,
                                   cudaStream_t stream) {
  vocab_parallel_classifier_check("vocab_parallel_classifier_max", logits, rows, vocab_begin, V, Vl);
  if (rows == 0) return;
  launch(vocab_parallel_classifier_max_kernel<T>, dim3(rows), dim3(vocab_parallel_classifier_threads<T>(Vl)), 0,
         stream, row_max, logits, vocab_parallel_real_columns(vocab_begin, V, Vl), Vl);
  CUDA_CHECK(cudaGetLastError());
}

// Phase 2, with row_max all-reduced. row_sums (2·rows fp32, written):
//   row_sums[2i]     = Σ exp(logits[i, j] - row_max[i]) over the slice's real columns (0 when none)
//   row_sums[2i + 1] = logits[i, targets[i] - vocab_begin] if targets[i] is in [vocab_begin, vocab_begin + Vl), else 0
// The caller then all-reduces row_sums (2·rows floats) with sum over the tensor-parallel group.
// targets (rows ints) must lie in [0, V), as for fused_classifier.
template <typename T>
void vocab_parallel_classifier_sums(float* row_sums, const T* logits, const float* row_max, const int* targets,
                                    int rows, int vocab_begin, int V, int Vl, cudaStream_t stream) {
  vocab_parallel_classifier_check("vocab_parallel_classifier_sums", logits, rows, vocab_begin, V, Vl);
  if (rows == 0) return;
  launch(vocab_parallel_classifier_sums_kernel<T>, dim3(rows), dim3(vocab_parallel_classifier_threads<T>(Vl)), 0,
         stream, row_sums, logits, row_max, targets, vocab_begin, vocab_parallel_real_columns(vocab_begin, V, Vl),
         Vl);
  CUDA_CHECK(cudaGetLastError());
}

// Phase 3, with row_max and row_sums all-reduced (every rank then computes the same losses).
// losses[i] (fp32, written, not added) = row_max[i] + log(row_sums[2i]) - row_sums[2i+1]: the
// cross-entropy of the whole row. When write_dlogits, the slice's logits[i, j] are overwritten
// with dloss · (softmax_j - [vocab_begin + j == targets[i]]) for real columns and with 0 for the
// padding; otherwise the logits are left untouched (and not read). Together the slices hold
// exactly what fused_classifier writes over the full row.
template <typename T>
void vocab_parallel_classifier_finish(T* logits, float* losses, const float* row_max, const float* row_sums,
                                      const int* targets, int rows, int vocab_begin, int V, int Vl, float dloss,
                                      bool write_dlogits, cudaStream_t stream) {
  vocab_parallel_classifier_check("vocab_parallel_classifier_finish", logits, rows, vocab_begin, V, Vl);
  if (rows == 0) return;
  if (!write_dlogits) {
    constexpr int kLossThreads = 256;
    launch(vocab_parallel_classifier_loss_kernel, dim3(ceil_div(rows, kLossThreads)), dim3(kLossThreads), 0, stream,
           losses, row_max, row_sums, rows);
  } else {
    launch(vocab_parallel_classifier_finish_kernel<T>, dim3(rows), dim3(vocab_parallel_classifier_threads<T>(Vl)), 0,
           stream, logits, losses, row_max, row_sums, targets, vocab_begin,
           vocab_parallel_real_columns(vocab_begin, V, Vl), Vl, dloss);
  }
  CUDA_CHECK(cudaGetLastError());
}
