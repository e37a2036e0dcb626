#include "shards.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "shards are little-endian and are written straight from memory");

namespace {

std::runtime_error io_error(const std::string& what, const std::string& path) {
  return std::runtime_error(what + " " + path + ": " + std::strerror(errno));
}

void write_header(AtomicFileWriter& file, int32_t magic, int32_t version, int32_t value2, int32_t value3) {
  int32_t header[kHeaderInts] = {magic, version, value2, value3};
  file.write(header, sizeof header);
}

std::string read_file_bytes(const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) throw io_error("cannot open", path);
  std::string content;
  char buffer[1 << 16];
  size_t got;
  while ((got = std::fread(buffer, 1, sizeof buffer, file)) > 0) content.append(buffer, got);
  bool failed = std::ferror(file) != 0;
  std::fclose(file);
  if (failed) throw io_error("cannot read", path);
  return content;
}

}  // namespace

ShardWriter::ShardWriter(StagedOutput& output, std::string dir, std::string prefix, ShardFormat format,
                         int64_t val_tokens, int64_t shard_tokens)
    : output_(output), dir_(std::move(dir)), prefix_(std::move(prefix)), format_(format), val_limit_(val_tokens),
      shard_limit_(shard_tokens) {}

void ShardWriter::open_next() {
  in_val_ = val_written_ < val_limit_;
  char name[64];
  std::snprintf(name, sizeof name, "_%s_%06d.bin", in_val_ ? "val" : "train",
                in_val_ ? val_shards_ : train_shards_);
  file_ = &output_.create(dir_ + "/" + prefix_ + name);
  written_.push_back(file_->path());
  in_file_ = 0;
  write_header(*file_, format_.magic, format_.version, 0, 0);  // count patched on close
}

void ShardWriter::close_current() {
  const int32_t count = static_cast<int32_t>(in_file_);
  file_->patch(2 * sizeof(int32_t), &count, sizeof count);
  file_->close_synced();
  file_ = nullptr;
  if (in_val_) ++val_shards_;
  else ++train_shards_;
}

void ShardWriter::write(const uint32_t* tokens, size_t count) {
  std::vector<uint16_t> narrow;  // GPT-2's shards hold uint16
  while (count > 0) {
    if (file_ == nullptr) open_next();
    int64_t capacity = in_val_ ? std::min(shard_limit_, val_limit_ - val_written_ + in_file_)
                               : shard_limit_;
    auto take = static_cast<size_t>(std::min<int64_t>(static_cast<int64_t>(count), capacity - in_file_));
    if (format_.token_size == sizeof(uint16_t)) {
      narrow.assign(tokens, tokens + take);
      file_->write(narrow.data(), take * sizeof(uint16_t));
    } else {
      file_->write(tokens, take * sizeof(uint32_t));
    }
    in_file_ += static_cast<int64_t>(take);
    (in_val_ ? val_written_ : train_written_) += static_cast<int64_t>(take);
    tokens += take;
    count -= take;
    if (in_file_ == capacity) close_current();
  }
}

std::vector<std::string> ShardWriter::finish() {
  if (file_ != nullptr) close_current();
  return written_;
}

Shard read_shard(const std::string& path) {
  std::string content = read_file_bytes(path);
  int32_t header[kHeaderInts] = {};
  if (content.size() < sizeof header)
    throw std::runtime_error(path + ": " + std::to_string(content.size()) +
                             " bytes, shorter than the 1024-byte shard header");
  std::memcpy(header, content.data(), sizeof header);
  Shard shard{};
  if (header[0] == kGpt2Shards.magic && header[1] == kGpt2Shards.version)
    shard.format = kGpt2Shards;
  else if (header[0] == kLlama3Shards.magic && header[1] == kLlama3Shards.version)
    shard.format = kLlama3Shards;
  else
    throw std::runtime_error(path + ": header starts " + std::to_string(header[0]) + " " +
                             std::to_string(header[1]) +
                             ", expected a token shard (20240520 1: GPT-2, or 20240801 7: Llama 3)");
  if (header[2] < 0) throw std::runtime_error(path + ": negative token count " + std::to_string(header[2]));
  size_t token_size = shard.format.token_size;
  size_t expected = sizeof header + token_size * size_t(header[2]);
  if (content.size() != expected)
    throw std::runtime_error(path + ": header says " + std::to_string(header[2]) + " tokens, so " +
                             std::to_string(expected) + " bytes, but the file has " +
                             std::to_string(content.size()));
  shard.tokens.resize(static_cast<size_t>(header[2]));
  const char* body = content.data() + sizeof header;
  if (token_size == sizeof(uint32_t)) {
    std::memcpy(shard.tokens.data(), body, sizeof(uint32_t) * shard.tokens.size());
  } else {
    std::vector<uint16_t> narrow(shard.tokens.size());
    std::memcpy(narrow.data(), body, sizeof(uint16_t) * narrow.size());
    shard.tokens.assign(narrow.begin(), narrow.end());
  }
  return shard;
}

void write_tokenizer_file(AtomicFileWriter& file, const std::vector<std::string>& token_bytes, int end_of_text) {
  write_header(file, kTokenizerMagic, kTokenizerVersion, static_cast<int32_t>(token_bytes.size()), end_of_text);
  for (const auto& bytes : token_bytes) {
    if (bytes.empty() || bytes.size() > 255)
      throw std::runtime_error(file.path() + ": a token of " + std::to_string(bytes.size()) +
                               " bytes does not fit the format's length byte");
    auto length = static_cast<unsigned char>(bytes.size());
    file.write(&length, 1);
    file.write(bytes.data(), bytes.size());
  }
}

std::vector<std::string> read_tokenizer_file(const std::string& path) {
  std::string content = read_file_bytes(path);
  int32_t header[kHeaderInts] = {};
  if (content.size() < sizeof header)
    throw std::runtime_error(path + ": shorter than the 1024-byte tokenizer header");
  std::memcpy(header, content.data(), sizeof header);
  if (header[0] != kTokenizerMagic || header[1] != kTokenizerVersion || header[2] <= 0)
    throw std::runtime_error(path + ": header starts " + std::to_string(header[0]) + " " +
                             std::to_string(header[1]) + ", expected a tokenizer file (20240328 2)");
  std::vector<std::string> token_bytes(static_cast<size_t>(header[2]));
  size_t pos = sizeof header;
  for (auto& bytes : token_bytes) {
    if (pos >= content.size()) throw std::runtime_error(path + ": ends before its last token");
    size_t length = static_cast<unsigned char>(content[pos++]);
    if (length == 0 || pos + length > content.size())
      throw std::runtime_error(path + ": token entry with bad length at byte " + std::to_string(pos - 1));
    bytes.assign(content, pos, length);
    pos += length;
  }
  if (pos != content.size())
    throw std::runtime_error(path + ": " + std::to_string(content.size() - pos) +
                             " bytes after the last token");
  return token_bytes;
}
