// gpt2_bpe.cpp — GPT-2's vocabulary: reading and checking encoder.json and vocab.bpe, and its
// split pattern.
#include "src/tokenizer/gpt2_bpe.h"

#include <nlohmann/json.hpp>

#include <sstream>
#include <stdexcept>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace {

// tiktoken's "gpt2" pattern is
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// where \s is Unicode White_Space (Rust regex). PCRE2's \s under UCP also matches U+180E
// (it adds \h, which still lists that former space), so \s is spelled out here as
// White_Space = \p{Z} + U+0009..U+000D + U+0085, and \S as its complement.
constexpr const char* kPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\t-\r\x{85}\p{Z}\p{L}\p{N}]+)"
    R"(|[\t-\r\x{85}\p{Z}]+(?![^\t-\r\x{85}\p{Z}])|[\t-\r\x{85}\p{Z}]+)";

constexpr const char* kInstallHint = "scripts/install_deps.sh fetches the GPT-2 vocabulary";

// GPT-2 writes each byte as one printable character: bytes that are printable Latin-1
// ('!'..'~', '¡'..'¬', '®'..'ÿ') stand for themselves, the other 68 bytes (in increasing
// order) become U+0100, U+0101, …  Returns the byte for each such character, -1 otherwise.
std::vector<int> char_to_byte_table() {
  std::vector<int> table(256 + 68, -1);
  int next_substitute = 256;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    table[printable ? b : next_substitute++] = b;
  }
  return table;
}

// Decodes a vocabulary string (UTF-8 of the byte-standing characters) into raw bytes.
bool decode_vocab_string(const std::string& text, const std::vector<int>& char_to_byte,
                         std::string& bytes) {
  bytes.clear();
  for (size_t i = 0; i < text.size();) {
    auto c = static_cast<unsigned char>(text[i]);
    uint32_t cp;
    if (c < 0x80) {
      cp = c;
      i += 1;
    } else if ((c & 0xE0) == 0xC0 && i + 1 < text.size()) {
      cp = (c & 0x1Fu) << 6 | (static_cast<unsigned char>(text[i + 1]) & 0x3Fu);
      i += 2;
    } else {
      return false;  // every byte-standing character is below U+0800
    }
    if (cp >= char_to_byte.size() || char_to_byte[cp] < 0) return false;
    bytes.push_back(static_cast<char>(char_to_byte[cp]));
  }
  return !bytes.empty();
}

}  // namespace


namespace {

std::vector<std::string> load_encoder_json(const std::string& path) {
  std::string content = read_checked_vocabulary_file(path, kEncoderJsonSha256, kInstallHint);
  nlohmann::json encoder = nlohmann::json::parse(content, nullptr, false);
  if (!encoder.is_object() || encoder.size() != size_t(kGpt2VocabSize))
    throw std::runtime_error(path + ": expected a JSON object of " +
                             std::to_string(kGpt2VocabSize) + " tokens");
  std::vector<int> char_to_byte = char_to_byte_table();
  std::vector<std::string> token_bytes(kGpt2VocabSize);
  std::string bytes;
  for (const auto& [text, id_json] : encoder.items()) {
    if (!id_json.is_number_integer() || id_json.get<long long>() < 0 ||
        id_json.get<long long>() >= kGpt2VocabSize)
      throw std::runtime_error(path + ": token \"" + text + "\" has an id outside 0..50256");
    auto id = id_json.get<size_t>();
    if (!token_bytes[id].empty())
      throw std::runtime_error(path + ": id " + std::to_string(id) + " appears twice");
    if (!decode_vocab_string(text, char_to_byte, bytes))
      throw std::runtime_error(path + ": token \"" + text + "\" is not in GPT-2's byte encoding");
    token_bytes[id] = bytes;
  }
  if (token_bytes[kEndOfText] != "<|endoftext|>")
    throw std::runtime_error(path + ": id 50256 is not <|endoftext|>");
  return token_bytes;
}

// vocab.bpe lists the merges by priority ("#version" line, then "left right" per line). Each
// merge's result must be a vocabulary token; its line number becomes that token's rank.
std::vector<uint32_t> load_vocab_bpe(const std::string& path, const std::vector<std::string>& token_bytes) {
  std::string content = read_checked_vocabulary_file(path, kVocabBpeSha256, kInstallHint);
  std::unordered_map<std::string_view, uint32_t> id_of;
  for (uint32_t id = 0; id < kEndOfText; ++id) id_of.emplace(token_bytes[id], id);
  std::vector<int> char_to_byte = char_to_byte_table();
  std::vector<uint32_t> rank(kEndOfText, ByteBpe::kNone);
  std::istringstream lines(content);
  std::string line, left, right;
  std::getline(lines, line);
  if (line.rfind("#version", 0) != 0) throw std::runtime_error(path + ": missing #version line");
  uint32_t merges = 0;
  while (std::getline(lines, line)) {
    if (line.empty()) continue;
    size_t space = line.find(' ');
    if (space == std::string::npos ||
        !decode_vocab_string(line.substr(0, space), char_to_byte, left) ||
        !decode_vocab_string(line.substr(space + 1), char_to_byte, right))
      throw std::runtime_error(path + ": malformed merge line " + std::to_string(merges + 2));
    auto merged = id_of.find(left + right);
    if (merged == id_of.end() || rank[merged->second] != ByteBpe::kNone)
      throw std::runtime_error(path + ": merge line " + std::to_string(merges + 2) +
                               " does not make a new encoder.json token");
    rank[merged->second] = merges++;
  }
  if (merges != kGpt2Merges)
    throw std::runtime_error(path + ": " + std::to_string(merges) + " merges, expected 50000");
  return rank;
}

}  // namespace

BpeVocabulary read_gpt2_vocabulary(const std::string& vocab_dir) {
  BpeVocabulary vocabulary;
  vocabulary.name = "GPT-2";
  vocabulary.source = vocab_dir + "/encoder.json";
  vocabulary.token_bytes = load_encoder_json(vocabulary.source);
  vocabulary.ordinary = kEndOfText;
  vocabulary.rank = load_vocab_bpe(vocab_dir + "/vocab.bpe", vocabulary.token_bytes);
  vocabulary.pattern = kPattern;
  // No alternative of kPattern matches an ASCII graphic byte followed by whitespace; it has no
  // lookbehind, so the piece starting at the cut ignores what precedes it; and its one lookahead,
  // (?!\S), follows whitespace, so the piece ending at the cut (non-space) ends there whatever
  // follows.
  vocabulary.cut_before = " \t\n\v\f\r";
  return vocabulary;
}
