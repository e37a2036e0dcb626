// gpt2_bpe.cpp — the GPT-2 tokenizer: vocabulary loading and checking, pre-tokenization, BPE merges, decoding.
#include "src/tokenizer/gpt2_bpe.h"

#include "src/tokenizer/sha256.h"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <functional>
#include <queue>
#include <sstream>
#include <stdexcept>

namespace {

// tiktoken's "gpt2" pattern is
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// where \s is Unicode White_Space (Rust regex). PCRE2's \s under UCP also matches U+180E
// (it adds \h, which still lists that former space), so \s is spelled out here as
// White_Space = \p{Z} + U+0009..U+000D + U+0085, and \S as its complement.
constexpr const char* kPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\t-\r\x{85}\p{Z}\p{L}\p{N}]+)"
    R"(|[\t-\r\x{85}\p{Z}]+(?![^\t-\r\x{85}\p{Z}])|[\t-\r\x{85}\p{Z}]+)";

// Pieces up to this length are merged by rescanning an array (cheap for words); longer ones
// (long runs of spaces, digits, symbols) use a heap so they stay O(n log n).
constexpr size_t kShortPiece = 128;
// Only pieces this short are cached: long pieces rarely repeat.
constexpr size_t kCachedPiece = 32;
constexpr size_t kCacheEntries = 1 << 18;

// The vocabulary files are not in the repository: a fresh clone gets them from the install script.
std::string read_whole_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw std::runtime_error("cannot read " + path + ": " + std::strerror(errno) +
                             " (scripts/install_deps.sh fetches the GPT-2 vocabulary)");
  std::ostringstream content;
  content << in.rdbuf();
  if (in.bad()) throw std::runtime_error("error reading " + path);
  return content.str();
}

uint64_t hash_bytes(std::string_view bytes) {  // FNV-1a
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : bytes) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

uint64_t hash_pair(uint64_t key) { return key * 0x9e3779b97f4a7c15ull; }

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

std::string check_sha256(const std::string& path, const char* expected) {
  std::string content = read_whole_file(path);
  std::string actual = sha256_hex(content);
  if (actual != expected)
    throw std::runtime_error(path + " has sha256 " + actual + ", expected " + expected +
                             ": not the standard GPT-2 file (scripts/install_deps.sh fetches it)");
  return content;
}

}  // namespace

Gpt2Bpe::Gpt2Bpe(const std::string& vocab_dir) {
  load_encoder_json(vocab_dir + "/encoder.json");
  build_token_index();
  load_vocab_bpe(vocab_dir + "/vocab.bpe");
  build_merge_table();
  compile_regex();
}

Gpt2Bpe::~Gpt2Bpe() { pcre2_code_free(regex_); }

void Gpt2Bpe::load_encoder_json(const std::string& path) {
  std::string content = check_sha256(path, kEncoderJsonSha256);
  nlohmann::json encoder = nlohmann::json::parse(content, nullptr, false);
  if (!encoder.is_object() || encoder.size() != size_t(kGpt2VocabSize))
    throw std::runtime_error(path + ": expected a JSON object of " +
                             std::to_string(kGpt2VocabSize) + " tokens");
  std::vector<int> char_to_byte = char_to_byte_table();
  token_bytes_.assign(kGpt2VocabSize, std::string());
  std::string bytes;
  for (const auto& [text, id_json] : encoder.items()) {
    if (!id_json.is_number_integer() || id_json.get<long long>() < 0 ||
        id_json.get<long long>() >= kGpt2VocabSize)
      throw std::runtime_error(path + ": token \"" + text + "\" has an id outside 0..50256");
    auto id = id_json.get<size_t>();
    if (!token_bytes_[id].empty())
      throw std::runtime_error(path + ": id " + std::to_string(id) + " appears twice");
    if (!decode_vocab_string(text, char_to_byte, bytes))
      throw std::runtime_error(path + ": token \"" + text + "\" is not in GPT-2's byte encoding");
    token_bytes_[id] = bytes;
  }
  if (token_bytes_[kEndOfText] != "<|endoftext|>")
    throw std::runtime_error(path + ": id 50256 is not <|endoftext|>");
}

void Gpt2Bpe::build_token_index() {
  size_t slots = 1;
  while (slots < 4 * token_bytes_.size()) slots <<= 1;
  token_slots_.assign(slots, kNone);
  for (uint32_t id = 0; id < kEndOfText; ++id) {  // the special token is never a text piece
    size_t slot = hash_bytes(token_bytes_[id]) & (slots - 1);
    while (token_slots_[slot] != kNone) {
      if (token_bytes_[token_slots_[slot]] == token_bytes_[id])
        throw std::runtime_error("encoder.json: two ids share the bytes of id " + std::to_string(id));
      slot = (slot + 1) & (slots - 1);
    }
    token_slots_[slot] = id;
  }
  for (int b = 0; b < 256; ++b) {
    byte_token_[b] = find_token(std::string(1, static_cast<char>(b)));
    if (byte_token_[b] == kNone)
      throw std::runtime_error("encoder.json: no token for byte " + std::to_string(b));
  }
}

uint32_t Gpt2Bpe::find_token(std::string_view bytes) const {
  size_t mask = token_slots_.size() - 1;
  for (size_t slot = hash_bytes(bytes) & mask;; slot = (slot + 1) & mask) {
    uint32_t id = token_slots_[slot];
    if (id == kNone || token_bytes_[id] == bytes) return id;
  }
}

// vocab.bpe lists the merges by priority ("#version" line, then "left right" per line). Each
// merge's result must be a vocabulary token; its line number becomes that token's rank.
void Gpt2Bpe::load_vocab_bpe(const std::string& path) {
  std::string content = check_sha256(path, kVocabBpeSha256);
  std::vector<int> char_to_byte = char_to_byte_table();
  rank_.assign(kGpt2VocabSize, kNone);
  std::istringstream lines(content);
  std::string line, left, right;
  std::getline(lines, line);
  if (line.rfind("#version", 0) != 0) throw std::runtime_error(path + ": missing #version line");
  uint32_t rank = 0;
  while (std::getline(lines, line)) {
    if (line.empty()) continue;
    size_t space = line.find(' ');
    if (space == std::string::npos ||
        !decode_vocab_string(line.substr(0, space), char_to_byte, left) ||
        !decode_vocab_string(line.substr(space + 1), char_to_byte, right))
      throw std::runtime_error(path + ": malformed merge line " + std::to_string(rank + 2));
    uint32_t merged = find_token(left + right);
    if (merged == kNone || rank_[merged] != kNone)
      throw std::runtime_error(path + ": merge line " + std::to_string(rank + 2) +
                               " does not make a new encoder.json token");
    rank_[merged] = rank++;
  }
  if (rank != kGpt2Merges)
    throw std::runtime_error(path + ": " + std::to_string(rank) + " merges, expected 50000");
}

// tiktoken joins two adjacent parts when their concatenation is a ranked token, whichever way
// that token was originally built; so every split of every merged token into two tokens is an
// entry (left, right) → token.
void Gpt2Bpe::build_merge_table() {
  std::vector<std::pair<uint64_t, uint32_t>> entries;
  for (uint32_t id = 0; id < kEndOfText; ++id) {
    if (rank_[id] == kNone) continue;
    std::string_view bytes = token_bytes_[id];
    for (size_t cut = 1; cut < bytes.size(); ++cut) {
      uint32_t left = find_token(bytes.substr(0, cut));
      uint32_t right = find_token(bytes.substr(cut));
      if (left != kNone && right != kNone) entries.push_back({uint64_t(left) << 32 | right, id});
    }
  }
  size_t slots = 1;
  while (slots < 2 * entries.size()) slots <<= 1;
  merge_keys_.assign(slots, ~0ull);
  merge_values_.assign(slots, kNone);
  for (const auto& [key, id] : entries) {
    size_t slot = hash_pair(key) >> 32 & (slots - 1);
    while (merge_keys_[slot] != ~0ull) slot = (slot + 1) & (slots - 1);
    merge_keys_[slot] = key;
    merge_values_[slot] = id;
  }
}

uint32_t Gpt2Bpe::find_merge(uint32_t left, uint32_t right) const {
  uint64_t key = uint64_t(left) << 32 | right;
  size_t mask = merge_keys_.size() - 1;
  for (size_t slot = hash_pair(key) >> 32 & mask;; slot = (slot + 1) & mask) {
    if (merge_keys_[slot] == key) return merge_values_[slot];
    if (merge_keys_[slot] == ~0ull) return kNone;
  }
}

void Gpt2Bpe::compile_regex() {
  int error = 0;
  PCRE2_SIZE error_offset = 0;
  // MATCH_INVALID_UTF: invalid UTF-8 in the subject matches nothing instead of failing the
  // whole match, which is what lets arbitrary bytes through (see the header).
  regex_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kPattern), PCRE2_ZERO_TERMINATED,
                         PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error, &error_offset,
                         nullptr);
  if (regex_ == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof message);
    throw std::runtime_error(std::string("PCRE2 rejects the GPT-2 pattern: ") +
                             reinterpret_cast<char*>(message));
  }
  // Without JIT support (some platforms) the interpreter gives the same matches, slower.
  jit_ = pcre2_jit_compile(regex_, PCRE2_JIT_COMPLETE) == 0;
}

PieceEncoder::PieceEncoder(const Gpt2Bpe& bpe) : bpe_(bpe) {
  match_data_ = pcre2_match_data_create_from_pattern(bpe.regex_, nullptr);
  if (match_data_ == nullptr) throw std::bad_alloc();
}

PieceEncoder::~PieceEncoder() { pcre2_match_data_free(match_data_); }

void PieceEncoder::encode(std::string_view text, std::vector<uint16_t>& out) {
  auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const PCRE2_SIZE* match = pcre2_get_ovector_pointer(match_data_);
  size_t pos = 0;
  while (pos < text.size()) {
    int rc = bpe_.jit_ ? pcre2_jit_match(bpe_.regex_, subject, text.size(), pos, 0, match_data_, nullptr)
                       : pcre2_match(bpe_.regex_, subject, text.size(), pos, 0, match_data_, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) {  // only invalid UTF-8 is left
      encode_piece(text.substr(pos), out);
      return;
    }
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof message);
      throw std::runtime_error(std::string("PCRE2 match failed: ") + reinterpret_cast<char*>(message));
    }
    if (match[0] > pos) encode_piece(text.substr(pos, match[0] - pos), out);  // invalid UTF-8
    encode_piece(text.substr(match[0], match[1] - match[0]), out);
    pos = match[1];
  }
}

void PieceEncoder::encode_piece(std::string_view piece, std::vector<uint16_t>& out) {
  uint32_t whole = bpe_.find_token(piece);
  if (whole != Gpt2Bpe::kNone) {
    out.push_back(static_cast<uint16_t>(whole));
    return;
  }
  if (piece.size() > kCachedPiece) {
    if (piece.size() > kShortPiece) merge_long(piece, out);
    else merge_short(piece, out);
    return;
  }
  std::string key(piece);
  auto hit = cache_.find(key);
  if (hit != cache_.end()) {
    out.insert(out.end(), hit->second.begin(), hit->second.end());
    return;
  }
  size_t first = out.size();
  merge_short(piece, out);
  if (cache_.size() >= kCacheEntries) cache_.clear();
  cache_.emplace(std::move(key), std::u16string(out.begin() + first, out.end()));
}

// parts_[i] are the current tokens; ranks_[i] is the rank of joining parts_[i] and parts_[i+1]
// (kNone when their concatenation is no token). Each round joins the lowest rank, leftmost.
void PieceEncoder::merge_short(std::string_view piece, std::vector<uint16_t>& out) {
  size_t n = piece.size();
  parts_.resize(n);
  ranks_.resize(n);
  for (size_t i = 0; i < n; ++i) parts_[i] = bpe_.byte_token_[static_cast<unsigned char>(piece[i])];
  auto pair_rank = [&](size_t i) {
    uint32_t merged = bpe_.find_merge(parts_[i], parts_[i + 1]);
    return merged == Gpt2Bpe::kNone ? Gpt2Bpe::kNone : bpe_.rank_[merged];
  };
  for (size_t i = 0; i + 1 < n; ++i) ranks_[i] = pair_rank(i);
  while (n > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < n; ++i)
      if (ranks_[i] < ranks_[best]) best = i;
    if (ranks_[best] == Gpt2Bpe::kNone) break;
    parts_[best] = bpe_.find_merge(parts_[best], parts_[best + 1]);
    for (size_t i = best + 1; i + 1 < n; ++i) {
      parts_[i] = parts_[i + 1];
      ranks_[i] = ranks_[i + 1];
    }
    --n;
    if (best + 1 < n) ranks_[best] = pair_rank(best);
    if (best > 0) ranks_[best - 1] = pair_rank(best - 1);
  }
  for (size_t i = 0; i < n; ++i) out.push_back(static_cast<uint16_t>(parts_[i]));
}

// Same rule as merge_short, with a doubly linked list of parts (indexed by their first byte)
// and a min-heap of candidate joins ordered by (rank, position). A candidate is stale when its
// two parts have changed since it was pushed; it is then skipped.
void PieceEncoder::merge_long(std::string_view piece, std::vector<uint16_t>& out) {
  constexpr uint32_t kNone = Gpt2Bpe::kNone;
  struct Part { uint32_t id, prev, next; };
  struct Join {
    uint32_t rank, pos, left, right;
    bool operator>(const Join& other) const {
      return rank != other.rank ? rank > other.rank : pos > other.pos;
    }
  };
  auto n = static_cast<uint32_t>(piece.size());
  std::vector<Part> parts(n);
  for (uint32_t i = 0; i < n; ++i)
    parts[i] = {bpe_.byte_token_[static_cast<unsigned char>(piece[i])], i == 0 ? kNone : i - 1,
                i + 1 == n ? kNone : i + 1};
  std::priority_queue<Join, std::vector<Join>, std::greater<Join>> joins;
  auto push_join = [&](uint32_t pos) {
    if (pos == kNone || parts[pos].next == kNone) return;
    uint32_t left = parts[pos].id, right = parts[parts[pos].next].id;
    uint32_t merged = bpe_.find_merge(left, right);
    if (merged != kNone) joins.push({bpe_.rank_[merged], pos, left, right});
  };
  for (uint32_t i = 0; i + 1 < n; ++i) push_join(i);
  while (!joins.empty()) {
    Join join = joins.top();
    joins.pop();
    Part& left = parts[join.pos];
    if (left.id != join.left || left.next == kNone || parts[left.next].id != join.right) continue;
    uint32_t gone = left.next;
    left.id = bpe_.find_merge(join.left, join.right);
    left.next = parts[gone].next;
    if (left.next != kNone) parts[left.next].prev = join.pos;
    parts[gone].id = kNone;
    push_join(left.prev);
    push_join(join.pos);
  }
  for (uint32_t i = 0; i != kNone; i = parts[i].next) out.push_back(static_cast<uint16_t>(parts[i].id));
}
