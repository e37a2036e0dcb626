// gpt2_bpe.h — GPT-2's vocabulary for byte_bpe.h, giving the same ids as tiktoken's "gpt2" encoding:
// read from encoder.json + vocab.bpe (both checked by sha256), with GPT-2's split pattern.
// id 50256 "<|endoftext|>" is the one special token.
#pragma once
#include "src/tokenizer/byte_bpe.h"

#include <cstdint>
#include <string>

constexpr int kGpt2VocabSize = 50257;
constexpr uint32_t kEndOfText = 50256;
constexpr int kGpt2Merges = 50000;

// sha256 of the standard files (see docs/FORMATS.md).
constexpr const char* kEncoderJsonSha256 =
    "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783";
constexpr const char* kVocabBpeSha256 =
    "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5";

// Reads DIR/encoder.json and DIR/vocab.bpe. Throws std::runtime_error with a one-line message
// naming the file for a missing, altered (sha256) or malformed file.
BpeVocabulary read_gpt2_vocabulary(const std::string& vocab_dir);

class Gpt2Bpe : public ByteBpe {
 public:
  explicit Gpt2Bpe(const std::string& vocab_dir) : ByteBpe(read_gpt2_vocabulary(vocab_dir)) {}
};
