// hellaswag.h — multiple-choice evaluation (HellaSwag) from llm.c's eval file (docs/FORMATS.md;
// and its version 2, uint32 ids, for Llama 3's vocabulary): reading and checking the file, laying
// each example's completions out as rows of the model's micro-batch, and scoring them.
//
// Scoring: completion k of an example follows its context in one row; its loss is the
// cross-entropy of each of its tokens given everything before it. acc_norm picks the completion
// with the lowest mean loss per completion token, acc the lowest summed loss (a tie goes to the
// lower index); each is the fraction of examples whose pick is the labelled one.
// Rows: a row holds one (context + completion) sequence of n tokens as n - 1 inputs and their
// n - 1 next-token targets, the rest padded with token 0 and ignored. Rows fill micro-batches of
// B rows in order, an example's completions may straddle two micro-batches, so any B >= 1 works.
// A sequence longer than T + 1 tokens loses tokens from the left of its context (its completion
// is kept whole, with at least one context token before it); a completion longer than T tokens
// is an error. Ranks: example i is scored by rank i mod R.
#pragma once
#include "src/base/file_formats.h"
#include "src/data/token_kind.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

constexpr int32_t kEvalMagic = 20240522;
constexpr int32_t kEvalVersion = 1;  // llm.c's: every body value a uint16 (GPT-2's ids)
constexpr uint16_t kEvalExampleStart = 65535;
// This project's extension for ids above 65535 (Llama 3's): the same layout, every value a uint32.
constexpr int32_t kEvalVersionUint32 = 2;
constexpr uint32_t kEvalExampleStartUint32 = 0xFFFFFFFFu;

// Whose ids an eval file of this (valid) header version holds.
constexpr TokenShardKind eval_file_kind(int32_t version) {
  return version == kEvalVersionUint32 ? TokenShardKind::llama3_uint32 : TokenShardKind::gpt2_uint16;
}

struct ChoiceExample {
  int label = 0;
  std::vector<int> context;  // already cut from the left when the longest sequence did not fit
  std::vector<std::vector<int>> completions;
};

struct ChoiceEvalSet {
  std::string path;
  std::vector<ChoiceExample> examples;
  long long truncated = 0;  // examples whose context was cut to fit --seq-len
  size_t completions = 0;   // over all examples
};

// Reads and checks an eval file (version 1 or 2) against the model's vocabulary and the sequence
// length T: a file of one tokenizer's kind for a model of the other's vocabulary (token_kind.h) is
// refused before its examples are read. Errors are one line starting with the path: what is wrong,
// where (example, byte offset), and what was expected.
ChoiceEvalSet read_choice_eval_file(const std::string& path, int vocab_size, int seq_len);

// Where completion k of example i sits in the flat per-completion order (examples in file order).
std::vector<size_t> completion_offsets(const ChoiceEvalSet& set);

// The summed loss of every completion this rank scores (rank r: examples i with i mod R == r),
// in the flat order of completion_offsets; other entries are 0, so a sum over ranks gives all.
// forward(inputs, targets) runs the model on one B x T micro-batch and returns its B·T per-position
// losses.
template <typename Forward>
std::vector<double> completion_loss_sums(const ChoiceEvalSet& set, int rank, int world_size, int B, int T,
                                         Forward&& forward) {
  struct Row {
    const std::vector<int>* context;
    const std::vector<int>* completion;
    size_t slot;  // in the flat order
  };
  const std::vector<size_t> offsets = completion_offsets(set);
  std::vector<double> sums(set.completions, 0.0);
  std::vector<Row> rows;
  for (size_t i = static_cast<size_t>(rank); i < set.examples.size(); i += static_cast<size_t>(world_size))
    for (size_t k = 0; k < set.examples[i].completions.size(); ++k)
      rows.push_back({&set.examples[i].context, &set.examples[i].completions[k], offsets[i] + k});
  // Every rank runs as many forward passes as the rank with the most rows (padding rows score
  // nothing): at ZeRO 3 a forward pass is a collective.
  std::vector<size_t> rows_of_rank(static_cast<size_t>(world_size), 0);
  for (size_t i = 0; i < set.examples.size(); ++i)
    rows_of_rank[i % rows_of_rank.size()] += set.examples[i].completions.size();
  const size_t most_rows = *std::max_element(rows_of_rank.begin(), rows_of_rank.end());
  std::vector<int> inputs(static_cast<size_t>(B) * T), targets(inputs.size());
  for (size_t first = 0; first < most_rows; first += static_cast<size_t>(B)) {
    std::fill(inputs.begin(), inputs.end(), 0);
    std::fill(targets.begin(), targets.end(), 0);
    const size_t n = first < rows.size() ? std::min(rows.size() - first, static_cast<size_t>(B)) : 0;
    for (size_t r = 0; r < n; ++r) {
      std::vector<int> sequence = *rows[first + r].context;
      sequence.insert(sequence.end(), rows[first + r].completion->begin(), rows[first + r].completion->end());
      for (size_t p = 0; p + 1 < sequence.size(); ++p) {
        inputs[r * T + p] = sequence[p];
        targets[r * T + p] = sequence[p + 1];
      }
    }
    const std::vector<float> losses = forward(inputs.data(), targets.data());
    for (size_t r = 0; r < n; ++r) {
      const Row& row = rows[first + r];
      // Completion token j is sequence[context + j], the target at position context + j - 1.
      const size_t from = row.context->size() - 1;
      double sum = 0.0;
      for (size_t j = 0; j < row.completion->size(); ++j) sum += losses[r * T + from + j];
      sums[row.slot] = sum;
    }
  }
  return sums;
}

struct ChoiceResult {
  long long examples = 0, correct_norm = 0, correct_sum = 0;
  double acc_norm() const { return static_cast<double>(correct_norm) / static_cast<double>(examples); }
  double acc() const { return static_cast<double>(correct_sum) / static_cast<double>(examples); }
};

// Accuracy from every completion's summed loss (completion_loss_sums, summed over ranks).
ChoiceResult score_choices(const ChoiceEvalSet& set, const std::vector<double>& sums);
