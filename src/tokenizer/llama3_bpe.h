// llama3_bpe.h — Llama 3's vocabulary for byte_bpe.h: Meta's tokenizer.model (tiktoken's rank
// format: one "base64(bytes) rank" line per token, checked by sha256), 128,000 ranked tokens then
// 256 special tokens, with Meta's split pattern. Gives the ids of Meta's tokenizer (tiktoken)
// for ordinary text.
#pragma once
#include "src/tokenizer/byte_bpe.h"

#include <cstdint>
#include <string>

constexpr int kLlama3VocabSize = 128256;
constexpr uint32_t kLlama3Ranked = 128000;  // ordinary tokens; the special ones follow
constexpr uint32_t kLlama3BeginOfText = 128000;  // BOS: starts every document
constexpr uint32_t kLlama3EndOfText = 128001;    // EOS
constexpr uint32_t kLlama3EndOfTurn = 128009;    // <|eot_id|>, ends a chat turn

// sha256 of Meta's tokenizer.model (the file scripts/install_deps.sh writes; data/README.md).
constexpr const char* kLlama3TokenizerModelSha256 =
    "82e9d31979e92ab929cd544440f129d9ecd797b69e327f80f17e1c50d5551b55";

// Reads DIR/tokenizer.model. Throws std::runtime_error with a one-line message naming the file
// (and, when it is missing or altered, scripts/install_deps.sh) for a missing, altered or
// malformed file.
BpeVocabulary read_llama3_vocabulary(const std::string& vocab_dir);

class Llama3Bpe : public ByteBpe {
 public:
  explicit Llama3Bpe(const std::string& vocab_dir) : ByteBpe(read_llama3_vocabulary(vocab_dir)) {}
};
