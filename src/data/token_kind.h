// token_kind.h — which tokenizer's ids a token file holds (GPT-2's, 16 bits wide, or Llama 3's,
// 32 bits wide), and the check that a file of one kind is not fed to a model of the other's
// vocabulary: the token shards (src/data/dataloader.h) and the eval file (src/data/hellaswag.h).
#pragma once
#include <cstddef>
#include <string>

enum class TokenShardKind { gpt2_uint16, llama3_uint32 };

// The largest vocabulary whose ids fit a uint16; larger ones (Llama 3's 128,256) need uint32.
constexpr int kLargestUint16Vocab = 65536;

// Bytes per token id in a file of this kind.
constexpr size_t token_id_bytes(TokenShardKind kind) { return kind == TokenShardKind::gpt2_uint16 ? 2 : 4; }

// The kind of file a model of vocab_size ids reads: uint16 ids while V <= 65536.
constexpr TokenShardKind token_kind_for_vocab(int vocab_size) {
  return vocab_size > kLargestUint16Vocab ? TokenShardKind::llama3_uint32 : TokenShardKind::gpt2_uint16;
}

// "GPT-2" or "Llama 3": whose tokens a file of this kind holds.
const char* token_kind_tokenizer(TokenShardKind kind);

// "" when a file of this kind suits a model of vocab_size ids, else what the model's vocabulary
// is ("the model has Llama 3's vocabulary (V=128256)"), for a caller's one-line error.
std::string token_vocab_mismatch(TokenShardKind kind, int vocab_size);

// A token shard's description: "a GPT-2 token shard (magic 20240520, uint16 ids)".
std::string describe_token_shard(TokenShardKind kind);

// Throws "PATH: a GPT-2 token shard (magic 20240520, uint16 ids); the model has Llama 3's
// vocabulary (V=128256): tokenize with --encoding llama3" (or the converse) when the shard's kind
// is not the one a model of vocab_size ids reads; returns otherwise.
void check_shard_vocabulary(const std::string& path, TokenShardKind kind, int vocab_size);
