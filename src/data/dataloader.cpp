// dataloader.cpp — the token-shard loader: shard headers and sizes, per-rank batches, shuffled visiting orders, token-id checks
#include "src/data/dataloader.h"

#include "src/base/file_formats.h"
#include "src/base/rng.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <exception>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

namespace dataloader_detail {

uint64_t stream_seed(uint64_t purpose, uint64_t seed, uint64_t epoch, uint64_t shard) {
  SplitMix64 g{purpose};
  g.state ^= g.next() ^ seed;
  g.state ^= g.next() ^ epoch;
  g.state ^= g.next() ^ shard;
  return g.next();
}

std::vector<uint32_t> permutation(uint32_t n, uint64_t stream) {
  std::vector<uint32_t> p(n);
  for (uint32_t i = 0; i < n; ++i) p[i] = i;
  SplitMix64 g{stream};
  for (uint32_t i = n; i > 1; --i) std::swap(p[i - 1], p[g.below(i)]);
  return p;
}

std::runtime_error file_error(const std::string& path, const std::string& what) {
  return std::runtime_error(path + ": " + what);
}

ShardHeader validated_shard_header(const std::string& path) {
  // O_NONBLOCK: a named pipe opens at once (and is refused below) instead of waiting for a writer.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw file_error(path, std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  const bool stat_ok = ::fstat(fd, &st) == 0;
  const int stat_errno = errno;
  int32_t header[kHeaderInts] = {};
  ssize_t got = -1;
  if (stat_ok && S_ISREG(st.st_mode) && static_cast<uint64_t>(st.st_size) >= kHeaderBytes)
    got = ::pread(fd, header, kHeaderBytes, 0);
  const int read_errno = errno;
  ::close(fd);
  if (!stat_ok) throw file_error(path, std::string("cannot stat: ") + std::strerror(stat_errno));
  if (!S_ISREG(st.st_mode)) throw file_error(path, "not a regular file");
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < kHeaderBytes)
    throw file_error(path, "file is " + std::to_string(size) + " bytes, shorter than the " +
                               std::to_string(kHeaderBytes) + "-byte token shard header");
  if (got != static_cast<ssize_t>(kHeaderBytes))
    throw file_error(path, std::string("cannot read the header: ") +
                               (got < 0 ? std::strerror(read_errno) : "short read"));
  ShardHeader shard;
  int32_t version = 0;
  if (header[0] == kShardMagic) {
    shard.kind = TokenShardKind::gpt2_uint16;
    version = kShardVersion;
  } else if (header[0] == kLlamaShardMagic) {
    shard.kind = TokenShardKind::llama3_uint32;
    version = kLlamaShardVersion;
  } else {
    throw file_error(path, "not a token shard: header magic is " + std::to_string(header[0]) + ", expected " +
                               std::to_string(kShardMagic) + " (GPT-2, uint16 ids) or " +
                               std::to_string(kLlamaShardMagic) + " (Llama 3, uint32 ids)");
  }
  if (header[1] != version)
    throw file_error(path, "unsupported token shard version " + std::to_string(header[1]) + ", expected " +
                               std::to_string(version) + " for magic " + std::to_string(header[0]));
  if (header[2] < 0)
    throw file_error(path, "header token count is " + std::to_string(header[2]) + ", expected >= 0");
  shard.num_tokens = static_cast<uint64_t>(header[2]);
  const uint64_t id_bytes = token_id_bytes(shard.kind);
  const uint64_t expected = kHeaderBytes + id_bytes * shard.num_tokens;
  if (size != expected)
    throw file_error(path, "file size is " + std::to_string(size) + " bytes, expected 1024 + " +
                               std::to_string(id_bytes) + "*" + std::to_string(shard.num_tokens) + " = " +
                               std::to_string(expected) + " bytes for the header's token count (" +
                               describe_token_shard(shard.kind) + "; truncated or corrupt)");
  return shard;
}

std::vector<std::string> matching_files(const std::string& pattern) {
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> paths;
  if (rc == 0)
    for (size_t i = 0; i < g.gl_pathc; ++i) paths.emplace_back(g.gl_pathv[i]);
  ::globfree(&g);
  if (rc == GLOB_NOMATCH || (rc == 0 && paths.empty()))
    throw file_error(pattern, "no file matches this token shard pattern");
  if (rc != 0) throw file_error(pattern, rc == GLOB_NOSPACE ? "glob ran out of memory" : "glob read error");
  std::sort(paths.begin(), paths.end());  // bytewise, independent of the locale glob sorted by
  return paths;
}

}  // namespace dataloader_detail

namespace {

// Token i of a shard's raw little-endian ids (memcpy: the compiler makes it one load).
template <typename Id>
inline Id load_id(const unsigned char* raw, size_t i) {
  Id id;
  std::memcpy(&id, raw + i * sizeof(Id), sizeof(Id));
  return id;
}

// inputs = ids [0, n), targets = ids [1, n + 1), as int (ids are checked < vocab_size first).
template <typename Id>
void widen_batch(const unsigned char* raw, size_t n, int* inputs, int* targets) {
  for (size_t i = 0; i < n; ++i) {
    inputs[i] = static_cast<int>(load_id<Id>(raw, i));
    targets[i] = static_cast<int>(load_id<Id>(raw, i + 1));
  }
}

// Index of the first of n ids that is >= vocab_size, or n.
template <typename Id>
size_t first_id_at_or_above(const unsigned char* raw, size_t n, int vocab_size) {
  for (size_t i = 0; i < n; ++i)
    if (load_id<Id>(raw, i) >= static_cast<uint32_t>(vocab_size)) return i;
  return n;
}

}  // namespace

DataLoader::DataLoader(const std::string& pattern, int B, int seq_len, int rank, int world_size, bool shuffle, uint64_t seed,
           int vocab_size, bool prefetch) : B_(B), seq_len_(seq_len), rank_(rank), vocab_size_(vocab_size), shuffle_(shuffle),
      prefetch_(prefetch), seed_(seed) {
  if (B <= 0 || seq_len <= 0) throw std::runtime_error("DataLoader: B and T must be positive");
  if (world_size <= 0 || rank < 0 || rank >= world_size)
    throw std::runtime_error("DataLoader: rank " + std::to_string(rank) + " is not in [0, world size " +
                             std::to_string(world_size) + ")");
  if (vocab_size <= 0) throw std::runtime_error("DataLoader: vocab_size must be positive");
  const uint64_t local = static_cast<uint64_t>(B) * static_cast<uint64_t>(seq_len);
  global_batch_tokens_ = local * static_cast<uint64_t>(world_size);
  for (const std::string& path : dataloader_detail::matching_files(pattern)) {
    dataloader_detail::ShardInfo info;
    info.path = path;
    const dataloader_detail::ShardHeader header = dataloader_detail::validated_shard_header(path);
    if (paths_.empty()) kind_ = header.kind;
    if (header.kind != kind_)
      throw dataloader_detail::file_error(path, describe_token_shard(header.kind) + ", but " + paths_[0] +
                                                    ", matched by the same pattern, is " + describe_token_shard(kind_) +
                                                    ": one pattern's shards must come from one tokenizer");
    info.num_tokens = header.num_tokens;
    if (info.num_tokens < global_batch_tokens_ + 1)
      throw dataloader_detail::file_error(
          path, "shard holds " + std::to_string(info.num_tokens) + " tokens, fewer than one global batch + 1 = " +
                    std::to_string(world_size) + "*" + std::to_string(B) + "*" + std::to_string(seq_len) + "+1 = " +
                    std::to_string(global_batch_tokens_ + 1) + " tokens (world size * B * T + 1)");
    info.num_slots = static_cast<uint32_t>((info.num_tokens - 1) / global_batch_tokens_);
    tokens_in_shards_ += info.num_tokens;
    shards_.push_back(std::move(info));
    paths_.push_back(path);
  }
  id_bytes_ = token_id_bytes(kind_);
  try {
    staging_.resize((local + 1) * id_bytes_);
  } catch (const std::bad_alloc&) {
    throw std::runtime_error("cannot allocate " + std::to_string((local + 1) * id_bytes_) +
                             " bytes of host memory for a batch of B x T = " + std::to_string(B) + " x " +
                             std::to_string(seq_len) + " tokens");
  }
  ids_checked_.assign(shards_.size(), false);
  if (prefetch_) worker_ = std::thread([this] { prefetch_loop(); });
  reset();
}

DataLoader::~DataLoader() {
  if (worker_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    worker_.join();
  }
  if (open_fd_ >= 0) ::close(open_fd_);
}

void DataLoader::wait_for_batch() {
  if (prefetch_) {
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [this] { return ready_; });
    if (error_) std::rethrow_exception(error_);
  } else {
    read(request_);
  }
}

void DataLoader::next_batch(int* inputs, int* targets) {
  wait_for_batch();
  std::copy(batch_.inputs.begin(), batch_.inputs.end(), inputs);
  std::copy(batch_.targets.begin(), batch_.targets.end(), targets);
  advance();
  request_read();
}

void DataLoader::next_batch(TokenBatch& batch) {
  wait_for_batch();
  std::swap(batch, batch_);
  advance();
  request_read();
}

void DataLoader::set_prepare(std::function<void(TokenBatch&)> prepare) {
  if (prefetch_) {
    // The worker reads prepare_ only while busy_, which it sets under the mutex.
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [this] { return !busy_; });
    prepare_ = std::move(prepare);
  } else {
    prepare_ = std::move(prepare);
  }
  request_read();
}

void DataLoader::reset() {
  pos_ = LoaderPosition{};
  pos_.seed = seed_;
  pos_.shuffle = shuffle_ ? 1 : 0;
  pos_.global_batch_tokens = global_batch_tokens_;
  pos_.num_shards = shards_.size();
  shard_order_ = shard_order(seed_, pos_.epoch);
  slot_order_ = slot_order(seed_, pos_.epoch, current_file());
  request_read();
}

void DataLoader::restore(const LoaderPosition& pos) {
  if (pos.shuffle != (shuffle_ ? 1u : 0u) || pos.global_batch_tokens != global_batch_tokens_ ||
      pos.num_shards != shards_.size())
    throw std::runtime_error("DataLoader: cannot restore a position taken with shuffle=" +
                             std::to_string(pos.shuffle) + ", R*B*T=" + std::to_string(pos.global_batch_tokens) +
                             ", " + std::to_string(pos.num_shards) + " shards into a loader with shuffle=" +
                             std::to_string(shuffle_ ? 1 : 0) + ", R*B*T=" + std::to_string(global_batch_tokens_) +
                             ", " + std::to_string(shards_.size()) + " shards");
  if (pos.shard >= shards_.size())
    throw std::runtime_error("DataLoader: restored shard index " + std::to_string(pos.shard) + " is out of range");
  std::vector<uint32_t> order = shard_order(pos.seed, pos.epoch);
  const size_t file = shuffle_ ? order[pos.shard] : pos.shard;
  if (pos.sample >= shards_[file].num_slots)
    throw dataloader_detail::file_error(shards_[file].path, "restored sample " + std::to_string(pos.sample) +
                                                                " is beyond the shard's " +
                                                                std::to_string(shards_[file].num_slots) +
                                                                " global batches");
  seed_ = pos.seed;
  pos_ = pos;
  shard_order_ = std::move(order);
  slot_order_ = slot_order(seed_, pos_.epoch, file);
  request_read();
}

uint64_t DataLoader::batches_per_epoch() const {
  uint64_t n = 0;
  for (const dataloader_detail::ShardInfo& shard : shards_) n += shard.num_slots;
  return n;
}

std::vector<uint32_t> DataLoader::shard_order(uint64_t seed, uint64_t epoch) const {
  if (!shuffle_) return {};
  return dataloader_detail::permutation(static_cast<uint32_t>(shards_.size()),
                                        dataloader_detail::stream_seed(1, seed, epoch, 0));
}

std::vector<uint32_t> DataLoader::slot_order(uint64_t seed, uint64_t epoch, size_t file) const {
  if (!shuffle_) return {};
  return dataloader_detail::permutation(shards_[file].num_slots,
                                        dataloader_detail::stream_seed(2, seed, epoch, file));
}

void DataLoader::advance() {
  if (++pos_.sample < shards_[current_file()].num_slots) return;
  pos_.sample = 0;
  if (++pos_.shard == shards_.size()) {
    pos_.shard = 0;
    ++pos_.epoch;
    shard_order_ = shard_order(seed_, pos_.epoch);
  }
  slot_order_ = slot_order(seed_, pos_.epoch, current_file());
}

void DataLoader::request_read() {
  const uint64_t slot = shuffle_ ? slot_order_[pos_.sample] : pos_.sample;
  const ReadRequest r{current_file(),
                      slot * global_batch_tokens_ + static_cast<uint64_t>(rank_) * B_ * seq_len_};
  if (!prefetch_) {
    request_ = r;
    return;
  }
  {
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [this] { return !busy_; });  // a read in flight still owns staging_
    request_ = r;
    pending_ = true;
    ready_ = false;
    error_ = nullptr;
  }
  wake_.notify_one();
}

void DataLoader::prefetch_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    wake_.wait(lock, [this] { return pending_ || stop_; });
    if (stop_) return;
    const ReadRequest r = request_;
    pending_ = false;
    busy_ = true;
    lock.unlock();
    std::exception_ptr error;
    try {
      read(r);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    busy_ = false;
    ready_ = true;
    error_ = error;
    done_.notify_all();
  }
}

void DataLoader::read(const ReadRequest& r) {
  const dataloader_detail::ShardInfo& shard = shards_[r.file];
  if (open_file_ != r.file || open_fd_ < 0) {
    if (open_fd_ >= 0) ::close(open_fd_);
    open_fd_ = ::open(shard.path.c_str(), O_RDONLY | O_CLOEXEC);
    open_file_ = r.file;
    if (open_fd_ < 0) throw ShardDataError(shard.path + ": cannot open: " + std::strerror(errno));
  }
  if (!ids_checked_[r.file]) {
    check_token_ids(shard);
    ids_checked_[r.file] = true;
  }
  const size_t n = staging_.size() / id_bytes_ - 1;
  read_tokens(shard, r.offset, staging_.data(), n + 1);
  batch_.inputs.resize(n);
  batch_.targets.resize(n);
  if (kind_ == TokenShardKind::gpt2_uint16)
    widen_batch<uint16_t>(staging_.data(), n, batch_.inputs.data(), batch_.targets.data());
  else
    widen_batch<uint32_t>(staging_.data(), n, batch_.inputs.data(), batch_.targets.data());
  batch_.ids_below = vocab_size_;
  batch_.bucket_segments = 0;
  if (prepare_) prepare_(batch_);
}

void DataLoader::read_tokens(const dataloader_detail::ShardInfo& shard, uint64_t offset, unsigned char* out,
                             size_t count) {
  const size_t bytes = count * id_bytes_;
  size_t done = 0;
  while (done < bytes) {
    const ssize_t got = ::pread(open_fd_, out + done, bytes - done,
                                static_cast<off_t>(kHeaderBytes + id_bytes_ * offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0)
      throw ShardDataError(shard.path + ": cannot read tokens at position " + std::to_string(offset) + ": " +
                           (got < 0 ? std::strerror(errno) : "file is shorter than when it was validated"));
    done += static_cast<size_t>(got);
  }
}

void DataLoader::check_token_ids(const dataloader_detail::ShardInfo& shard) {
  const size_t chunk_tokens = static_cast<size_t>(std::min<uint64_t>(shard.num_tokens, dataloader_detail::kScanTokens));
  std::vector<unsigned char> chunk(chunk_tokens * id_bytes_);
  for (uint64_t start = 0; start < shard.num_tokens; start += chunk_tokens) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(chunk_tokens, shard.num_tokens - start));
    read_tokens(shard, start, chunk.data(), n);
    const size_t bad = kind_ == TokenShardKind::gpt2_uint16 ? first_id_at_or_above<uint16_t>(chunk.data(), n, vocab_size_)
                                                             : first_id_at_or_above<uint32_t>(chunk.data(), n, vocab_size_);
    if (bad == n) continue;
    const uint32_t id = kind_ == TokenShardKind::gpt2_uint16 ? load_id<uint16_t>(chunk.data(), bad)
                                                             : load_id<uint32_t>(chunk.data(), bad);
    throw ShardDataError(shard.path + ": token id " + std::to_string(id) +
                         " at token position " + std::to_string(start + bad) + " is >= the vocab size " +
                         std::to_string(vocab_size_));
  }
}
