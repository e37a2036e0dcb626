// hellaswag.h — multiple-choice evaluation (HellaSwag) from llm.c's eval file (docs/FORMATS.md):
// reading and checking the file, laying each example's completions out as rows of the model's
// micro-batch, and scoring them.
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
constexpr int32_t kEvalVersion = 1;
constexpr uint16_t kEvalExampleStart = 65535;

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

// Reads and checks an eval file against the model's vocabulary and the sequence length T. Errors
// are one line starting with the path: what is wrong, where (example, byte offset), and what was
// expected.
inline ChoiceEvalSet read_choice_eval_file(const std::string& path, int vocab_size, int seq_len) {
  const auto fail = [&](const std::string& what) { return std::runtime_error(path + ": " + what); };
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw fail(std::string("cannot open the file: ") + std::strerror(errno));
  if (S_ISDIR(st.st_mode)) throw fail("is a directory, expected an eval file");
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) throw fail(std::string("cannot open the file: ") + std::strerror(errno));
  std::vector<unsigned char> bytes(static_cast<size_t>(st.st_size));
  const size_t got = std::fread(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
  if (got != bytes.size()) throw fail("cannot read the file");
  if (bytes.size() < kHeaderBytes)
    throw fail("truncated: " + std::to_string(bytes.size()) + " bytes, shorter than the " +
               std::to_string(kHeaderBytes) + "-byte header");
  int32_t header[kHeaderInts];
  std::memcpy(header, bytes.data(), kHeaderBytes);
  if (header[0] != kEvalMagic)
    throw fail("magic number " + std::to_string(header[0]) + ", expected " + std::to_string(kEvalMagic) +
               " (not an eval file; docs/FORMATS.md)");
  if (header[1] != kEvalVersion)
    throw fail("version " + std::to_string(header[1]) + ", expected " + std::to_string(kEvalVersion));
  if (header[2] <= 0) throw fail("header says " + std::to_string(header[2]) + " examples, expected at least 1");
  const long long count = header[2], longest = header[3];
  const size_t end = bytes.size();
  ChoiceEvalSet set;
  set.path = path;
  set.examples.reserve(static_cast<size_t>(count));
  size_t pos = kHeaderBytes;
  for (long long i = 0; i < count; ++i) {
    const size_t start = pos;
    const std::string where = "example " + std::to_string(i) + " (byte " + std::to_string(start) + ")";
    size_t example_end = end;  // until the byte length field is read
    const auto next = [&](const char* field) -> int {
      if (pos + 2 > example_end)
        throw fail(example_end == end ? "truncated: " + where + " ends before its " + field + " (the header says " +
                                            std::to_string(count) + " examples, the file has " + std::to_string(end) +
                                            " bytes)"
                                      : where + ": its " + field + " lies beyond its stated byte length " +
                                            std::to_string(example_end - start));
      const int value = bytes[pos] | (bytes[pos + 1] << 8);
      pos += 2;
      return value;
    };
    if (next("start marker") != kEvalExampleStart)
      throw fail(where + ": no start marker " + std::to_string(kEvalExampleStart) +
                 " (a damaged file, or one example's stated length is wrong)");
    const int example_bytes = next("byte length");
    if (example_bytes > longest)
      throw fail(where + ": " + std::to_string(example_bytes) + " bytes, more than the header's longest example (" +
                 std::to_string(longest) + ")");
    if (start + static_cast<size_t>(example_bytes) > end)
      throw fail("truncated: " + where + " has " + std::to_string(example_bytes) + " bytes, the file ends " +
                 std::to_string(end - start) + " bytes after its start");
    example_end = start + static_cast<size_t>(example_bytes);
    next("index");
    ChoiceExample ex;
    ex.label = next("label");
    const int num_completions = next("completion count");
    if (num_completions < 2) throw fail(where + ": " + std::to_string(num_completions) + " completions, expected at least 2");
    if (ex.label >= num_completions)
      throw fail(where + ": label " + std::to_string(ex.label) + ", expected one of 0.." +
                 std::to_string(num_completions - 1));
    const auto read_tokens = [&](const char* what) {
      const int n = next(what);
      if (n < 1) throw fail(where + ": empty " + what);
      std::vector<int> tokens(static_cast<size_t>(n));
      for (int& t : tokens) {
        const size_t at = pos;
        t = next(what);
        if (t >= vocab_size)
          throw fail(where + ": token " + std::to_string(t) + " of its " + what + " at byte " + std::to_string(at) +
                     " is outside the model's vocabulary of " + std::to_string(vocab_size) +
                     " (the file was tokenized for another vocabulary)");
      }
      return tokens;
    };
    ex.context = read_tokens("context");
    for (int k = 0; k < num_completions; ++k) ex.completions.push_back(read_tokens("completion"));
    if (pos != example_end)
      throw fail(where + ": its fields take " + std::to_string(pos - start) + " bytes, its stated byte length is " +
                 std::to_string(example_bytes));
    size_t longest_completion = 0;
    for (const auto& c : ex.completions) longest_completion = std::max(longest_completion, c.size());
    if (longest_completion > static_cast<size_t>(seq_len))
      throw fail(where + ": a completion of " + std::to_string(longest_completion) +
                 " tokens does not fit --seq-len " + std::to_string(seq_len) + " (raise --seq-len)");
    // context + completion fits in T + 1 tokens (T inputs, the last token only a target).
    const size_t keep = static_cast<size_t>(seq_len) + 1 - longest_completion;
    if (ex.context.size() > keep) {
      ex.context.erase(ex.context.begin(), ex.context.end() - static_cast<std::ptrdiff_t>(keep));
      ++set.truncated;
    }
    set.completions += ex.completions.size();
    set.examples.push_back(std::move(ex));
  }
  if (pos != end)
    throw fail(std::to_string(end - pos) + " bytes after the last of the header's " + std::to_string(count) +
               " examples (the header's example count is wrong, or the file is damaged)");
  return set;
}

// Where completion k of example i sits in the flat per-completion order (examples in file order).
inline std::vector<size_t> completion_offsets(const ChoiceEvalSet& set) {
  std::vector<size_t> offsets;
  size_t at = 0;
  for (const ChoiceExample& ex : set.examples) {
    offsets.push_back(at);
    at += ex.completions.size();
  }
  return offsets;
}

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
  std::vector<int> inputs(static_cast<size_t>(B) * T), targets(inputs.size());
  for (size_t first = 0; first < rows.size(); first += static_cast<size_t>(B)) {
    std::fill(inputs.begin(), inputs.end(), 0);
    std::fill(targets.begin(), targets.end(), 0);
    const size_t n = std::min(rows.size() - first, static_cast<size_t>(B));
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
inline ChoiceResult score_choices(const ChoiceEvalSet& set, const std::vector<double>& sums) {
  ChoiceResult result;
  size_t at = 0;
  for (const ChoiceExample& ex : set.examples) {
    size_t best_mean = 0, best_sum = 0;
    for (size_t k = 1; k < ex.completions.size(); ++k) {
      const auto mean = [&](size_t c) { return sums[at + c] / static_cast<double>(ex.completions[c].size()); };
      if (mean(k) < mean(best_mean)) best_mean = k;
      if (sums[at + k] < sums[at + best_sum]) best_sum = k;
    }
    ++result.examples;
    result.correct_norm += best_mean == static_cast<size_t>(ex.label);
    result.correct_sum += best_sum == static_cast<size_t>(ex.label);
    at += ex.completions.size();
  }
  return result;
}
