// gpt2_bpe.h — GPT-2 byte-level BPE giving the same ids as tiktoken's "gpt2" encoding.
//
// Gpt2Bpe holds the immutable vocabulary (from encoder.json + vocab.bpe, both checked by
// sha256), the merge table and the compiled pre-tokenization regex; one instance is shared by
// all threads. Each thread encodes through its own PieceEncoder (regex match state + cache).
//
// Encoding rules, in tiktoken's order:
//  1. The text is cut into pieces by the GPT-2 regex (kPattern below).
//  2. A piece whose bytes are a token is that token (tiktoken looks the whole piece up first).
//  3. Otherwise the piece starts as single-byte tokens and, repeatedly, the adjacent pair whose
//     concatenation is the lowest-ranked merge is joined (leftmost on ties), until none is.
// Ordinary text only: "<|endoftext|>" in the text is encoded as text, never as id 50256.
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

constexpr int kGpt2VocabSize = 50257;
constexpr uint16_t kEndOfText = 50256;
constexpr int kGpt2Merges = 50000;

// sha256 of the standard files (see docs/FORMATS.md).
constexpr const char* kEncoderJsonSha256 =
    "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783";
constexpr const char* kVocabBpeSha256 =
    "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5";

class Gpt2Bpe {
 public:
  // Reads DIR/encoder.json and DIR/vocab.bpe. Throws std::runtime_error with a one-line
  // message naming the file for a missing, altered (sha256) or malformed file.
  explicit Gpt2Bpe(const std::string& vocab_dir);
  ~Gpt2Bpe();
  Gpt2Bpe(const Gpt2Bpe&) = delete;
  Gpt2Bpe& operator=(const Gpt2Bpe&) = delete;

  // Raw bytes of each id; id 50256 is the text "<|endoftext|>".
  const std::vector<std::string>& token_bytes() const { return token_bytes_; }

 private:
  friend class PieceEncoder;
  static constexpr uint32_t kNone = 0xFFFFFFFFu;

  uint32_t find_token(std::string_view bytes) const;  // ordinary tokens only; kNone if absent
  uint32_t find_merge(uint32_t left, uint32_t right) const;  // merged id; kNone if no merge

  void load_encoder_json(const std::string& path);
  void load_vocab_bpe(const std::string& path);
  void build_token_index();
  void build_merge_table();
  void compile_regex();

  std::vector<std::string> token_bytes_;
  std::vector<uint32_t> rank_;  // merge rank per id (line of vocab.bpe); kNone for byte tokens
  uint32_t byte_token_[256];

  std::vector<uint32_t> token_slots_;  // open addressing: hash(bytes) → id
  std::vector<uint64_t> merge_keys_;   // open addressing: (left << 32 | right) → merged id
  std::vector<uint32_t> merge_values_;

  pcre2_code* regex_ = nullptr;
  bool jit_ = false;
};

class PieceEncoder {
 public:
  explicit PieceEncoder(const Gpt2Bpe& bpe);
  ~PieceEncoder();
  PieceEncoder(const PieceEncoder&) = delete;
  PieceEncoder& operator=(const PieceEncoder&) = delete;

  // Appends the ids of `text` to `out` (no end-of-text token).
  void encode(std::string_view text, std::vector<uint16_t>& out);

 private:
  void encode_piece(std::string_view piece, std::vector<uint16_t>& out);
  void merge_short(std::string_view piece, std::vector<uint16_t>& out);
  void merge_long(std::string_view piece, std::vector<uint16_t>& out);

  const Gpt2Bpe& bpe_;
  pcre2_match_data* match_data_ = nullptr;
  // Pieces repeat a lot in natural text (words); their BPE result is cached per thread.
  std::unordered_map<std::string, std::u16string> cache_;
  std::vector<uint32_t> parts_, ranks_;  // scratch for merge_short
};
