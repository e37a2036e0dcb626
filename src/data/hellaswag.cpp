// hellaswag.cpp — multiple-choice eval files read and checked; completions laid out as rows; accuracy
#include "src/data/hellaswag.h"

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

ChoiceEvalSet read_choice_eval_file(const std::string& path, int vocab_size, int seq_len) {
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
  if (header[1] != kEvalVersion && header[1] != kEvalVersionUint32)
    throw fail("version " + std::to_string(header[1]) + ", expected " + std::to_string(kEvalVersion) + " (uint16 ids) or " +
               std::to_string(kEvalVersionUint32) + " (uint32 ids)");
  const TokenShardKind kind = eval_file_kind(header[1]);
  const std::string mismatch = token_vocab_mismatch(kind, vocab_size);
  if (!mismatch.empty())
    throw fail("a " + std::string(token_kind_tokenizer(kind)) + " eval file (version " + std::to_string(header[1]) +
               ", " + (kind == TokenShardKind::gpt2_uint16 ? "uint16" : "uint32") + " ids); " + mismatch +
               ": make it with data/hellaswag.sh --encoding " +
               (kind == TokenShardKind::gpt2_uint16 ? "llama3" : "gpt2"));
  if (header[2] <= 0) throw fail("header says " + std::to_string(header[2]) + " examples, expected at least 1");
  const long long count = header[2], longest = header[3];
  const size_t end = bytes.size();
  const size_t width = token_id_bytes(kind);  // bytes of every value in the body
  const uint32_t start_marker = kind == TokenShardKind::gpt2_uint16 ? kEvalExampleStart : kEvalExampleStartUint32;
  // The smallest example: start marker, byte length, index, label, completion count, a one-token
  // context and two one-token completions, 11 values. A count the file cannot hold is refused
  // before anything is allocated for it.
  const size_t smallest_example_bytes = width * (5 + 2 + 2 * 2);
  const size_t most = (end - kHeaderBytes) / smallest_example_bytes;
  if (static_cast<size_t>(count) > most)
    throw fail("the header says " + std::to_string(count) + " examples, the file's " + std::to_string(end) +
               " bytes hold at most " + std::to_string(most) + " (a damaged header, or a file cut short)");
  ChoiceEvalSet set;
  set.path = path;
  set.examples.reserve(static_cast<size_t>(count));
  size_t pos = kHeaderBytes;
  for (long long i = 0; i < count; ++i) {
    const size_t start = pos;
    const std::string where = "example " + std::to_string(i) + " (byte " + std::to_string(start) + ")";
    size_t example_end = end;  // until the byte length field is read
    const auto next = [&](const char* field) -> long long {
      if (pos + width > example_end)
        throw fail(example_end == end ? "truncated: " + where + " ends before its " + field + " (the header says " +
                                            std::to_string(count) + " examples, the file has " + std::to_string(end) +
                                            " bytes)"
                                      : where + ": its " + field + " lies beyond its stated byte length " +
                                            std::to_string(example_end - start));
      uint32_t value = 0;
      for (size_t b = 0; b < width; ++b) value |= static_cast<uint32_t>(bytes[pos + b]) << (8 * b);
      pos += width;
      return value;
    };
    if (next("start marker") != start_marker)
      throw fail(where + ": no start marker " + std::to_string(start_marker) +
                 " (a damaged file, or one example's stated length is wrong)");
    const long long example_bytes = next("byte length");
    if (example_bytes > longest)
      throw fail(where + ": " + std::to_string(example_bytes) + " bytes, more than the header's longest example (" +
                 std::to_string(longest) + ")");
    if (start + static_cast<size_t>(example_bytes) > end)
      throw fail("truncated: " + where + " has " + std::to_string(example_bytes) + " bytes, the file ends " +
                 std::to_string(end - start) + " bytes after its start");
    example_end = start + static_cast<size_t>(example_bytes);
    next("index");
    ChoiceExample ex;
    const long long label = next("label");
    const long long num_completions = next("completion count");
    if (num_completions < 2) throw fail(where + ": " + std::to_string(num_completions) + " completions, expected at least 2");
    if (label >= num_completions)
      throw fail(where + ": label " + std::to_string(label) + ", expected one of 0.." +
                 std::to_string(num_completions - 1));
    ex.label = static_cast<int>(label);
    const auto read_tokens = [&](const char* what) {
      const long long n = next(what);
      if (n < 1) throw fail(where + ": empty " + what);
      if (static_cast<size_t>(n) > (example_end - pos) / width)
        throw fail(where + ": its " + what + " of " + std::to_string(n) + " tokens lies beyond its stated byte length " +
                   std::to_string(example_end - start));
      std::vector<int> tokens(static_cast<size_t>(n));
      for (int& t : tokens) {
        const size_t at = pos;
        const long long id = next(what);
        if (id >= vocab_size)
          throw fail(where + ": token " + std::to_string(id) + " of its " + what + " at byte " + std::to_string(at) +
                     " is outside the model's vocabulary of " + std::to_string(vocab_size) +
                     " (the file was tokenized for another vocabulary)");
        t = static_cast<int>(id);
      }
      return tokens;
    };
    ex.context = read_tokens("context");
    for (long long k = 0; k < num_completions; ++k) ex.completions.push_back(read_tokens("completion"));
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

std::vector<size_t> completion_offsets(const ChoiceEvalSet& set) {
  std::vector<size_t> offsets;
  size_t at = 0;
  for (const ChoiceExample& ex : set.examples) {
    offsets.push_back(at);
    at += ex.completions.size();
  }
  return offsets;
}

ChoiceResult score_choices(const ChoiceEvalSet& set, const std::vector<double>& sums) {
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
