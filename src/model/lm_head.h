// lm_head.h — the tied lm head and the loss: logits = lnf · wteᵀ chunk by chunk of rows, the
// softmax cross-entropy of each row (fused over the whole vocabulary, or vocabulary-parallel over
// a tensor-parallel rank's wte rows), and for training the head's backward: d lnf and the wte
// gradient, summed in fp32 over the chunks and added with one rounding.
#pragma once
#include "kernels/classifier.cuh"
#include "kernels/matmul.cuh"
#include "kernels/vocab_parallel_classifier.cuh"
#include "src/base/device.h"
#include "src/dist/tp_collectives.h"
#include "src/model/activations.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

template <typename Elem>
class LmHead {
 public:
  LmHead() = default;
  // The head of a model with vocabulary V whose rank holds wte rows [vocab_begin, vocab_begin +
  // columns) of `wte_count` elements, over the logits buffer `acts` allocated.
  LmHead(const Activations<Elem>& acts, int V, int vocab_begin, int columns, size_t wte_count)
      : V_(V), vocab_begin_(vocab_begin), columns_(columns),
        wte_grad_fp32_(wte_count, "the lm head's fp32 wte gradient"),
        chunk_rows_(static_cast<int>(acts.logits.count() / columns)), capacity_(chunk_rows_) {}

  // Rows per chunk: the logits buffer's height, or fewer: more chunks, the same results (tested).
  int chunk_rows() const { return chunk_rows_; }
  void set_chunk_rows(int rows) {
    if (rows < 1 || rows > capacity_)
      throw std::runtime_error("set_logits_chunk_rows: " + std::to_string(rows) + " rows, expected 1.." +
                               std::to_string(capacity_));
    chunk_rows_ = rows;
  }
  int columns() const { return columns_; }

  // Over the N rows of a.lnf (every row; C channels) and a.targets. With `losses`, each row's loss
  // into a.losses; with `train`, the classifier leaves dloss·dlogits in the chunk, and the chunk's
  // share of the backward runs at once: its rows of d lnf into work.branch (summed over the TP group
  // at the end: `tp`) and its wte product summed in fp32, then added to dwte with one rounding (so
  // the gradient's precision does not depend on the number of chunks). The logits and classifier
  // statistics are work's too (a pipeline's activation sets share them: activations.h).
  void queue(Activations<Elem>& a, Activations<Elem>& work, const Elem* wte, Elem* dwte, TensorParallelGroup<Elem>& tp,
             int N, int C, bool losses, float dloss, bool train, cudaStream_t s) {
    if (train) cuda_check(cudaMemsetAsync(wte_grad_fp32_.get(), 0, wte_grad_fp32_.bytes(), s),
                          "zeroing the lm head's fp32 wte gradient");
    for (int r = 0; r < N; r += chunk_rows_) {
      const int n = std::min(chunk_rows_, N - r);
      const size_t offset = static_cast<size_t>(r) * C;
      matmul_forward(work.logits.get(), a.lnf.get() + offset, wte, nullptr, n, C, columns_, s);
      if (!losses) continue;
      classify(a, work, tp, n, r, dloss, train, s);
      if (train)
        matmul_backward<Elem, float>(work.branch.get() + offset, wte_grad_fp32_.get(), nullptr, nullptr,
                                     work.logits.get(), a.lnf.get() + offset, wte, nullptr, n, C, columns_, s);
    }
    if (!train) return;
    matmul_add_weight_gradient(dwte, wte_grad_fp32_.get(), wte_grad_fp32_.count(), s);
    tp.reduce(work.branch.get(), C);
  }

 private:
  // The losses of rows [r, r + n) from the chunk's logits (and, with `train`, dloss·dlogits in
  // place). Vocabulary-parallel: each row's maximum, then its sum of exponentials and the
  // target's logit (from the rank that holds it) reduced over the group in between; the logits
  // are never gathered.
  void classify(Activations<Elem>& a, Activations<Elem>& work, TensorParallelGroup<Elem>& tp, int n, int r, float dloss,
                bool train, cudaStream_t s) {
    const int* targets = a.targets.get() + r;
    Elem* logits = work.logits.get();
    if (tp.size() == 1) return fused_classifier(logits, a.losses.get() + r, targets, n, V_, columns_, dloss, train, s);
    float* row_max = work.classifier_stats.get();
    float* row_sums = row_max + work.classifier_stats.count() / 3;
    vocab_parallel_classifier_max(row_max, logits, n, vocab_begin_, V_, columns_, s);
    tp.all_reduce(row_max, n, ncclMax);
    vocab_parallel_classifier_sums(row_sums, logits, row_max, targets, n, vocab_begin_, V_, columns_, s);
    tp.all_reduce(row_sums, 2 * static_cast<size_t>(n), ncclSum);
    vocab_parallel_classifier_finish(logits, a.losses.get() + r, row_max, row_sums, targets, n, vocab_begin_, V_,
                                     columns_, dloss, train, s);
  }

  int V_ = 0, vocab_begin_ = 0, columns_ = 0;
  DeviceArray<float> wte_grad_fp32_;  // this rank's wte rows, (columns, C)
  int chunk_rows_ = 0, capacity_ = 0;
};
