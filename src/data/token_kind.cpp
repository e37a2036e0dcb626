// token_kind.cpp — the two kinds of token file (GPT-2's uint16 ids, Llama 3's uint32) described, and
// refused for a model of the other vocabulary
#include "src/data/token_kind.h"

#include "src/base/file_formats.h"

#include <stdexcept>
#include <string>

namespace {

constexpr int kGpt2Vocab = 50257;
constexpr int kLlama3Vocab = 128256;

}  // namespace

const char* token_kind_tokenizer(TokenShardKind kind) {
  return kind == TokenShardKind::gpt2_uint16 ? "GPT-2" : "Llama 3";
}

std::string token_vocab_mismatch(TokenShardKind kind, int vocab_size) {
  if (token_kind_for_vocab(vocab_size) == kind) return "";
  const std::string v = "(V=" + std::to_string(vocab_size) + ")";
  if (vocab_size == kLlama3Vocab) return "the model has Llama 3's vocabulary " + v;
  if (vocab_size == kGpt2Vocab) return "the model has GPT-2's vocabulary " + v;
  return kind == TokenShardKind::gpt2_uint16
             ? "the model's vocabulary " + v + " is larger than uint16 ids hold (" + std::to_string(kLargestUint16Vocab) + ")"
             : "the model's vocabulary " + v + " fits uint16 ids, GPT-2's kind";
}

std::string describe_token_shard(TokenShardKind kind) {
  return kind == TokenShardKind::gpt2_uint16
             ? "a GPT-2 token shard (magic " + std::to_string(kShardMagic) + ", uint16 ids)"
             : "a Llama 3 token shard (magic " + std::to_string(kLlamaShardMagic) + ", uint32 ids)";
}

void check_shard_vocabulary(const std::string& path, TokenShardKind kind, int vocab_size) {
  const std::string mismatch = token_vocab_mismatch(kind, vocab_size);
  if (mismatch.empty()) return;
  throw std::runtime_error(path + ": " + describe_token_shard(kind) + "; " + mismatch +
                           ": tokenize with --encoding " +
                           (kind == TokenShardKind::gpt2_uint16 ? "llama3" : "gpt2"));
}
