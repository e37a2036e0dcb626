// encodings.h — what each `tokenize --encoding` means: its vocabulary, llm.c's shard format for
// it, the token that starts every document (as llm.c's shard writers put it) and the tokenizer
// file written beside the shards.
#pragma once
#include "src/tokenizer/gpt2_bpe.h"
#include "src/tokenizer/llama3_bpe.h"
#include "shards.h"

#include <memory>
#include <string>

struct Encoding {
  const char* name;            // the --encoding value (tiktoken's word for a vocabulary)
  const char* vocab_dir;       // default --bpe-dir: data/<this> beside the program
  ShardFormat shards;
  uint32_t document_start;     // written before every document
  const char* tokenizer_file;  // written beside the shards, read by --decode
  uint32_t end_of_text;        // the tokenizer file's header slot 3
  std::unique_ptr<ByteBpe> (*load)(const std::string& vocab_dir);
};

inline const Encoding kEncodings[] = {
    {"gpt2", "gpt2_bpe", kGpt2Shards, kEndOfText, "gpt2_tokenizer.bin", kEndOfText,
     [](const std::string& dir) -> std::unique_ptr<ByteBpe> { return std::make_unique<Gpt2Bpe>(dir); }},
    {"llama3", "llama3_bpe", kLlama3Shards, kLlama3BeginOfText, "llama3_tokenizer.bin", kLlama3EndOfText,
     [](const std::string& dir) -> std::unique_ptr<ByteBpe> { return std::make_unique<Llama3Bpe>(dir); }},
};
