// classifier_reference.h — softmax cross-entropy over each row's real columns, in double, from
// the documented formula: the plain CPU reference of the classifier tests (test_classifier.cu,
// test_vocab_parallel_classifier.cu).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

struct ClassifierReference {
  std::vector<double> losses;
  std::vector<double> dlogits;  // (rows, Vp), zero in the padding
};

inline ClassifierReference classifier_reference(const std::vector<float>& logits, const std::vector<int>& targets,
                                                int rows, int V, int Vp, double dloss) {
  ClassifierReference ref{std::vector<double>(rows), std::vector<double>(static_cast<size_t>(rows) * Vp, 0.0)};
  for (int r = 0; r < rows; ++r) {
    const float* x = &logits[static_cast<size_t>(r) * Vp];
    double max = x[0];
    for (int j = 1; j < V; ++j) max = std::max(max, static_cast<double>(x[j]));
    double sum = 0;
    for (int j = 0; j < V; ++j) sum += std::exp(x[j] - max);
    const double log_sum = max + std::log(sum);
    ref.losses[r] = log_sum - x[targets[r]];
    for (int j = 0; j < V; ++j)
      ref.dlogits[static_cast<size_t>(r) * Vp + j] = dloss * (std::exp(x[j] - log_sum) - (j == targets[r] ? 1.0 : 0.0));
  }
  return ref;
}
