// byte_bpe.cpp — tiktoken's byte-level BPE for any vocabulary: token index and merges, split
// pattern, piece merging, and the checked reading of vocabulary files.
#include "src/tokenizer/byte_bpe.h"

#include "src/tokenizer/sha256.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <functional>
#include <queue>
#include <sstream>
#include <stdexcept>

namespace {

// Pieces up to this length are merged by rescanning an array (cheap for words); longer ones
// (long runs of spaces, digits, symbols) use a heap so they stay O(n log n).
constexpr size_t kShortPiece = 128;
// Only pieces this short are cached: long pieces rarely repeat.
constexpr size_t kCachedPiece = 32;
constexpr size_t kCacheEntries = 1 << 18;

// FNV-1a, which extends byte by byte: the hash of a token grows into the hash of it and the next.
constexpr uint64_t kFnvEmpty = 0xcbf29ce484222325ull;
uint64_t hash_extend(uint64_t h, unsigned char c) { return (h ^ c) * 0x100000001b3ull; }
uint64_t hash_bytes(std::string_view bytes) {
  uint64_t h = kFnvEmpty;
  for (unsigned char c : bytes) h = hash_extend(h, c);
  return h;
}

bool is_ascii_graphic(char c) { return c > ' ' && c < 0x7F; }

}  // namespace

// The vocabulary files are not in the repository: a fresh clone gets them from the install script.
std::string read_checked_vocabulary_file(const std::string& path, const char* sha256,
                                         const std::string& install_hint) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw std::runtime_error("cannot read " + path + ": " + std::strerror(errno) + " (" + install_hint + ")");
  std::ostringstream content;
  content << in.rdbuf();
  if (in.bad()) throw std::runtime_error("error reading " + path);
  std::string actual = sha256_hex(content.str());
  if (actual != sha256)
    throw std::runtime_error(path + " has sha256 " + actual + ", expected " + sha256 +
                             ": not the standard file (" + install_hint + ")");
  return content.str();
}

ByteBpe::ByteBpe(BpeVocabulary vocabulary) : vocabulary_(std::move(vocabulary)) {
  for (unsigned char c : vocabulary_.cut_before) cut_before_[c] = true;
  build_token_index();
  compile_regex();
}

ByteBpe::~ByteBpe() { pcre2_code_free(regex_); }

void ByteBpe::build_token_index() {
  const auto& tokens = vocabulary_.token_bytes;
  size_t slots = 1;
  while (slots < 4 * tokens.size()) slots <<= 1;
  token_slots_.assign(slots, kNone);
  token_hash_.resize(vocabulary_.ordinary);
  for (uint32_t id = 0; id < vocabulary_.ordinary; ++id) {  // special tokens are never text pieces
    token_hash_[id] = hash_bytes(tokens[id]);
    size_t slot = token_hash_[id] & (slots - 1);
    while (token_slots_[slot] != kNone) {
      if (tokens[token_slots_[slot]] == tokens[id])
        throw std::runtime_error(vocabulary_.source + ": two ids share the bytes of id " +
                                 std::to_string(id));
      slot = (slot + 1) & (slots - 1);
    }
    token_slots_[slot] = id;
  }
  for (int b = 0; b < 256; ++b) {
    byte_token_[b] = find_token(std::string(1, static_cast<char>(b)));
    if (byte_token_[b] == kNone)
      throw std::runtime_error(vocabulary_.source + ": no token for byte " + std::to_string(b));
  }
}

uint32_t ByteBpe::find_token(std::string_view bytes) const {
  size_t mask = token_slots_.size() - 1;
  for (size_t slot = hash_bytes(bytes) & mask;; slot = (slot + 1) & mask) {
    uint32_t id = token_slots_[slot];
    if (id == kNone || vocabulary_.token_bytes[id] == bytes) return id;
  }
}

// tiktoken joins two adjacent parts when their concatenation is a ranked token, whichever way
// that token was originally built: so the merge of (left, right) is the token whose bytes are
// left's then right's, found by extending left's hash over right's bytes (no table of merges to
// build at start-up).
uint32_t ByteBpe::find_merge(uint32_t left, uint32_t right) const {
  const std::string& head = vocabulary_.token_bytes[left];
  const std::string& tail = vocabulary_.token_bytes[right];
  uint64_t hash = token_hash_[left];
  for (unsigned char c : tail) hash = hash_extend(hash, c);
  size_t mask = token_slots_.size() - 1;
  for (size_t slot = hash & mask;; slot = (slot + 1) & mask) {
    uint32_t id = token_slots_[slot];
    if (id == kNone) return kNone;
    const std::string& bytes = vocabulary_.token_bytes[id];
    if (bytes.size() == head.size() + tail.size() && bytes.compare(0, head.size(), head) == 0 &&
        bytes.compare(head.size(), tail.size(), tail) == 0)
      return id;
  }
}

void ByteBpe::compile_regex() {
  int error = 0;
  PCRE2_SIZE error_offset = 0;
  // MATCH_INVALID_UTF: invalid UTF-8 in the subject matches nothing instead of failing the
  // whole match, which is what lets arbitrary bytes through (see the header).
  regex_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(vocabulary_.pattern), PCRE2_ZERO_TERMINATED,
                         PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error, &error_offset,
                         nullptr);
  if (regex_ == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof message);
    throw std::runtime_error("PCRE2 rejects the " + vocabulary_.name + " pattern: " +
                             reinterpret_cast<char*>(message));
  }
  // Without JIT support (some platforms) the interpreter gives the same matches, slower.
  jit_ = pcre2_jit_compile(regex_, PCRE2_JIT_COMPLETE) == 0;
}

size_t ByteBpe::last_safe_cut(std::string_view text, size_t from) const {
  for (size_t i = text.size(); i-- > std::max<size_t>(from, 1);)
    if (cut_before_[static_cast<unsigned char>(text[i])] && is_ascii_graphic(text[i - 1])) return i;
  return 0;
}

PieceEncoder::PieceEncoder(const ByteBpe& bpe) : bpe_(bpe) {
  match_data_ = pcre2_match_data_create_from_pattern(bpe.regex_, nullptr);
  if (match_data_ == nullptr) throw std::bad_alloc();
}

PieceEncoder::~PieceEncoder() { pcre2_match_data_free(match_data_); }

void PieceEncoder::encode(std::string_view text, std::vector<uint32_t>& out) {
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

void PieceEncoder::encode_piece(std::string_view piece, std::vector<uint32_t>& out) {
  uint32_t whole = bpe_.find_token(piece);
  if (whole != ByteBpe::kNone) {
    out.push_back(whole);
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
  cache_.emplace(std::move(key), std::u32string(out.begin() + first, out.end()));
}

// parts_[i] are the current tokens; ranks_[i] is the rank of joining parts_[i] and parts_[i+1]
// (kNone when their concatenation is no token). Each round joins the lowest rank, leftmost.
void PieceEncoder::merge_short(std::string_view piece, std::vector<uint32_t>& out) {
  const auto& rank = bpe_.vocabulary_.rank;
  size_t n = piece.size();
  parts_.resize(n);
  ranks_.resize(n);
  for (size_t i = 0; i < n; ++i) parts_[i] = bpe_.byte_token_[static_cast<unsigned char>(piece[i])];
  auto pair_rank = [&](size_t i) {
    uint32_t merged = bpe_.find_merge(parts_[i], parts_[i + 1]);
    return merged == ByteBpe::kNone ? ByteBpe::kNone : rank[merged];
  };
  for (size_t i = 0; i + 1 < n; ++i) ranks_[i] = pair_rank(i);
  while (n > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < n; ++i)
      if (ranks_[i] < ranks_[best]) best = i;
    if (ranks_[best] == ByteBpe::kNone) break;
    parts_[best] = bpe_.find_merge(parts_[best], parts_[best + 1]);
    for (size_t i = best + 1; i + 1 < n; ++i) {
      parts_[i] = parts_[i + 1];
      ranks_[i] = ranks_[i + 1];
    }
    --n;
    if (best + 1 < n) ranks_[best] = pair_rank(best);
    if (best > 0) ranks_[best - 1] = pair_rank(best - 1);
  }
  out.insert(out.end(), parts_.begin(), parts_.begin() + static_cast<std::ptrdiff_t>(n));
}

// Same rule as merge_short, with a doubly linked list of parts (indexed by their first byte)
// and a min-heap of candidate joins ordered by (rank, position). A candidate is stale when its
// two parts have changed since it was pushed; it is then skipped.
void PieceEncoder::merge_long(std::string_view piece, std::vector<uint32_t>& out) {
  constexpr uint32_t kNone = ByteBpe::kNone;
  const auto& rank = bpe_.vocabulary_.rank;
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
    if (merged != kNone) joins.push({rank[merged], pos, left, right});
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
  for (uint32_t i = 0; i != kNone; i = parts[i].next) out.push_back(parts[i].id);
}
