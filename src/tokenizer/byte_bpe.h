// byte_bpe.h — byte-level BPE as tiktoken applies it, for any vocabulary (GPT-2's in gpt2_bpe.h,
// Llama 3's in llama3_bpe.h): the token index (which also finds merges), the compiled split
// pattern, and the per-thread encoder.
//
// ByteBpe holds the immutable vocabulary; one instance is shared by all threads. Each thread
// encodes through its own PieceEncoder (regex match state + cache).
//
// Encoding rules, in tiktoken's order:
//  1. The text is cut into pieces by the vocabulary's split pattern.
//  2. A piece whose bytes are a token is that token (tiktoken looks the whole piece up first).
//  3. Otherwise the piece starts as single-byte tokens and, repeatedly, the adjacent pair whose
//     concatenation is the lowest-ranked token is joined (leftmost on ties), until none is.
// Ordinary text only: a special token's text in the input is encoded as text, never as its id.
//
// Invalid UTF-8 (tiktoken's Python API cannot receive it; its Rust core works on bytes) never
// fails: an invalid sequence matches no regex item, so the regex cuts around it, and every
// maximal run of bytes left between matches is one more piece encoded by rules 2–3. Every byte
// has a token, so decode(encode(x)) == x for any bytes.
#pragma once
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

// What a vocabulary file loader hands to ByteBpe.
struct BpeVocabulary {
  std::string name;                      // for messages: "GPT-2", "Llama 3"
  std::string source;                    // the file errors name
  std::vector<std::string> token_bytes;  // every id's bytes; special tokens' bytes are their text
  uint32_t ordinary = 0;                 // ids below this are text tokens, the rest special
  std::vector<uint32_t> rank;            // per ordinary id of 2+ bytes: merge priority, lower first
  const char* pattern = nullptr;         // split pattern, PCRE2 syntax (UTF, UCP)
  // ASCII whitespace bytes w such that, for any ASCII graphic byte g, "g|w" is a piece boundary
  // in every context (see last_safe_cut): each vocabulary's loader says why for its pattern.
  std::string cut_before;
};

class ByteBpe {
 public:
  static constexpr uint32_t kNone = 0xFFFFFFFFu;

  // Builds the token index and compiles the pattern. Throws std::runtime_error naming
  // vocabulary.source if two ordinary ids share bytes or a byte has no token.
  explicit ByteBpe(BpeVocabulary vocabulary);
  virtual ~ByteBpe();
  ByteBpe(const ByteBpe&) = delete;
  ByteBpe& operator=(const ByteBpe&) = delete;

  // Raw bytes of each id (special tokens as their text).
  const std::vector<std::string>& token_bytes() const { return vocabulary_.token_bytes; }
  const std::string& name() const { return vocabulary_.name; }

  // The last offset i >= max(from, 1) of `text` where an ASCII graphic byte is followed by one of
  // vocabulary.cut_before (0 if none). Cutting there never changes the pieces, so text on either
  // side encodes exactly as in the whole document, and the cut never splits a UTF-8 sequence.
  size_t last_safe_cut(std::string_view text, size_t from) const;

 private:
  friend class PieceEncoder;

  uint32_t find_token(std::string_view bytes) const;  // ordinary tokens only; kNone if absent
  uint32_t find_merge(uint32_t left, uint32_t right) const;  // merged id; kNone if no merge

  void build_token_index();
  void compile_regex();

  BpeVocabulary vocabulary_;
  uint32_t byte_token_[256];
  bool cut_before_[256] = {};

  std::vector<uint32_t> token_slots_;  // open addressing: hash(bytes) → id
  std::vector<uint64_t> token_hash_;   // per ordinary id: hash(bytes)

  pcre2_code* regex_ = nullptr;
  bool jit_ = false;
};

class PieceEncoder {
 public:
  explicit PieceEncoder(const ByteBpe& bpe);
  ~PieceEncoder();
  PieceEncoder(const PieceEncoder&) = delete;
  PieceEncoder& operator=(const PieceEncoder&) = delete;

  // Appends the ids of `text` to `out` (no special token).
  void encode(std::string_view text, std::vector<uint32_t>& out);

 private:
  void encode_piece(std::string_view piece, std::vector<uint32_t>& out);
  void merge_short(std::string_view piece, std::vector<uint32_t>& out);
  void merge_long(std::string_view piece, std::vector<uint32_t>& out);

  const ByteBpe& bpe_;
  pcre2_match_data* match_data_ = nullptr;
  // Pieces repeat a lot in natural text (words); their BPE result is cached per thread.
  std::unordered_map<std::string, std::u32string> cache_;
  std::vector<uint32_t> parts_, ranks_;  // scratch for merge_short
};

// Reads a vocabulary file whole and checks its sha256. Throws a one-line std::runtime_error naming
// the file and, for a missing or altered file, `install_hint` (how to get the right one).
std::string read_checked_vocabulary_file(const std::string& path, const char* sha256,
                                         const std::string& install_hint);
