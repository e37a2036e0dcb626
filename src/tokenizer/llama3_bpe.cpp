// llama3_bpe.cpp — Llama 3's vocabulary: reading and checking tokenizer.model, the special tokens'
// names, and the split pattern.
#include "src/tokenizer/llama3_bpe.h"

#include <stdexcept>
#include <string_view>
#include <vector>

namespace {

// Meta's pattern (tiktoken, Rust regex) is
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*
//   |\s*[\r\n]+|\s+(?!\S)|\s+
// Spelled for PCRE2 as GPT-2's is (gpt2_bpe.cpp): \s as Unicode White_Space, \p{Z} + U+0009..U+000D
// + U+0085, and \S as its complement; the rest is Meta's text.
constexpr const char* kPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d))"
    R"(|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\t-\r\x{85}\p{Z}\p{L}\p{N}]+[\r\n]*)"
    R"(|[\t-\r\x{85}\p{Z}]*[\r\n]+|[\t-\r\x{85}\p{Z}]+(?![^\t-\r\x{85}\p{Z}])|[\t-\r\x{85}\p{Z}]+)";

constexpr const char* kInstallHint = "scripts/install_deps.sh fetches Llama 3's tokenizer.model";

// Names of ids 128000.. as Meta's Llama 3 tokenizer (and the tokenizer.json it is fetched from)
// gives them; Llama 3.1 gave some reserved ones new names (128004, 128008, 128010, ...), moving none.
std::vector<std::string> special_token_names() {
  std::vector<std::string> names = {"<|begin_of_text|>", "<|end_of_text|>"};
  for (int i = 0; i < 4; ++i) names.push_back("<|reserved_special_token_" + std::to_string(i) + "|>");
  names.insert(names.end(), {"<|start_header_id|>", "<|end_header_id|>", "<|reserved_special_token_4|>",
                             "<|eot_id|>"});
  for (int i = 5; names.size() < size_t(kLlama3VocabSize - kLlama3Ranked); ++i)
    names.push_back("<|reserved_special_token_" + std::to_string(i) + "|>");
  return names;
}

int base64_value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

// Standard base64 with '=' padding; false for anything else.
bool decode_base64(std::string_view text, std::string& bytes) {
  bytes.clear();
  if (text.empty() || text.size() % 4 != 0) return false;
  size_t padding = text.size() - text.find_last_not_of('=') - 1;
  if (padding > 2) return false;
  uint32_t bits = 0;
  for (size_t i = 0; i < text.size() - padding; ++i) {
    int value = base64_value(text[i]);
    if (value < 0) return false;
    bits = bits << 6 | uint32_t(value);
    if (i % 4 == 3) {
      bytes += {char(bits >> 16), char(bits >> 8), char(bits)};
      bits = 0;
    }
  }
  if (padding == 2) bytes += char(bits >> 4);
  if (padding == 1) bytes += {char(bits >> 10), char(bits >> 2)};
  return true;
}

}  // namespace

BpeVocabulary read_llama3_vocabulary(const std::string& vocab_dir) {
  BpeVocabulary vocabulary;
  vocabulary.name = "Llama 3";
  vocabulary.source = vocab_dir + "/tokenizer.model";
  const std::string& path = vocabulary.source;
  std::string content = read_checked_vocabulary_file(path, kLlama3TokenizerModelSha256, kInstallHint);
  // tiktoken's rank is also the id: line N holds the token of rank (and id) N.
  auto& tokens = vocabulary.token_bytes;
  std::string bytes;
  for (size_t start = 0; start < content.size();) {
    size_t end = content.find('\n', start);
    if (end == std::string::npos) end = content.size();
    std::string_view line(content.data() + start, end - start);
    start = end + 1;
    size_t space = line.find(' ');
    std::string expected_rank = std::to_string(tokens.size());
    if (space == std::string_view::npos || line.substr(space + 1) != expected_rank ||
        !decode_base64(line.substr(0, space), bytes))
      throw std::runtime_error(path + ": line " + std::to_string(tokens.size() + 1) +
                               " is not \"BASE64 " + expected_rank + "\"");
    tokens.push_back(bytes);
  }
  if (tokens.size() != kLlama3Ranked)
    throw std::runtime_error(path + ": " + std::to_string(tokens.size()) + " tokens, expected " +
                             std::to_string(kLlama3Ranked));
  vocabulary.ordinary = kLlama3Ranked;
  vocabulary.rank.resize(kLlama3Ranked);
  for (uint32_t id = 0; id < kLlama3Ranked; ++id) vocabulary.rank[id] = id;
  for (auto& name : special_token_names()) tokens.push_back(std::move(name));
  vocabulary.pattern = kPattern;
  // Unlike GPT-2's, this pattern joins punctuation to the newlines after it (" ?[^\s..]+[\r\n]*"),
  // so only a space, tab, VT or FF after an ASCII graphic byte is always a piece boundary: no
  // alternative matches a graphic byte followed by one of them, and the pattern has no
  // lookbehind and looks ahead only after whitespace (as GPT-2's, gpt2_bpe.cpp).
  vocabulary.cut_before = " \t\v\f";
  return vocabulary;
}
