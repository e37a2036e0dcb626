// shards.h — llm.c-compatible token shards and tokenizer file (layouts in docs/FORMATS.md).
// Every function throws std::runtime_error with a one-line message naming the file.
#pragma once
#include "src/base/file_formats.h"
#include "staged_output.h"

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

constexpr int64_t kMaxShardTokens = 2147483647;  // header[2] is an int32

// llm.c's two shard formats: GPT-2's (uint16 tokens) and Llama 3's (uint32 tokens).
struct ShardFormat {
  int32_t magic, version;
  size_t token_size;  // bytes per token
};
constexpr ShardFormat kGpt2Shards{kShardMagic, kShardVersion, 2};
constexpr ShardFormat kLlama3Shards{kLlamaShardMagic, kLlamaShardVersion, 4};

// Writes a token stream as DIR/PREFIX_val_%06d.bin (the first val_tokens tokens) then
// DIR/PREFIX_train_%06d.bin, each shard holding at most shard_tokens tokens, as files of `output`
// (they appear when it publishes).
class ShardWriter {
 public:
  ShardWriter(StagedOutput& output, std::string dir, std::string prefix, ShardFormat format,
              int64_t val_tokens, int64_t shard_tokens);
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  // Tokens must fit the format's width (GPT-2's ids do fit 16 bits).
  void write(const uint32_t* tokens, size_t count);
  // Completes the open shard (its header gets the final count); returns every shard's path.
  std::vector<std::string> finish();

  int64_t val_tokens_written() const { return val_written_; }
  int64_t train_tokens_written() const { return train_written_; }
  int val_shards() const { return val_shards_; }
  int train_shards() const { return train_shards_; }

 private:
  void open_next();
  void close_current();

  StagedOutput& output_;
  std::string dir_, prefix_;
  ShardFormat format_;
  int64_t val_limit_, shard_limit_;
  int64_t val_written_ = 0, train_written_ = 0;
  int val_shards_ = 0, train_shards_ = 0;
  AtomicFileWriter* file_ = nullptr;
  int64_t in_file_ = 0;  // tokens in the open shard
  bool in_val_ = false;
  std::vector<std::string> written_;
};

// Reads a shard of either format, checking magic, version and that the file size is exactly
// 1024 + N·(token size).
struct Shard {
  ShardFormat format;
  std::vector<uint32_t> tokens;
};
Shard read_shard(const std::string& path);

// Tokenizer file: header then, per id, a length byte and the token's bytes (`file`: a staged
// file, DIR/gpt2_tokenizer.bin or DIR/llama3_tokenizer.bin).
void write_tokenizer_file(AtomicFileWriter& file, const std::vector<std::string>& token_bytes, int end_of_text);
std::vector<std::string> read_tokenizer_file(const std::string& path);
