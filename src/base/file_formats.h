// file_formats.h — the constants of llm.c's file formats (docs/FORMATS.md): the 256-int32 header
// every file starts with, and each format's magic number and versions. Readers and writers, in the
// trainer and in the tokenize tool, take them from here.
#pragma once
#include <cstddef>
#include <cstdint>

constexpr size_t kHeaderInts = 256;
constexpr size_t kHeaderBytes = kHeaderInts * sizeof(int32_t);

constexpr int32_t kShardMagic = 20240520;      // token shard (GPT-2: uint16 tokens)
constexpr int32_t kShardVersion = 1;
constexpr int32_t kLlamaShardMagic = 20240801;  // token shard (Llama 3: uint32 tokens)
constexpr int32_t kLlamaShardVersion = 7;
constexpr int32_t kModelMagic = 20240326;      // model file (GPT-2)
constexpr int32_t kLlamaModelMagic = 20240803;  // model file (Llama 3; llm.c's header, train_gpt's extension)
constexpr int kLlamaExtension = 16;  // Llama header slot that is 1 when train_gpt's extension follows
constexpr int32_t kModelVersionFp32 = 3;
constexpr int32_t kModelVersionBf16 = 5;
constexpr int32_t kTokenizerMagic = 20240328;  // tokenizer file
constexpr int32_t kTokenizerVersion = 2;
