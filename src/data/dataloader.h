// dataloader.h — token shards (docs/FORMATS.md, "Token shard") → (inputs, targets) micro-batches.
//
// Files: every path matching a glob pattern, sorted bytewise so all ranks agree on the
// order. Each header and file size is validated at construction, so a corrupt or too-small
// shard fails before training starts. Token ids are validated a whole shard at a time, when
// the reader first reads from it (on the prefetch thread, while the caller uses the batch
// before): a bad id anywhere in a shard stops the loader at the shard's first batch, before
// any of its batches is handed out. Such an error, found mid-run, is a ShardDataError.
//
// Order. G = R·B·T tokens form one global batch. A shard of N tokens holds (N-1)/G sample
// slots; slot j covers tokens [j·G, j·G + G + 1) and rank r reads its B·T + 1 tokens at
// j·G + r·B·T (inputs = the first B·T, targets = the last B·T). Without shuffling, step k
// reads slot k of the current shard — exactly the docs/FORMATS.md rule — then the next shard,
// wrapping to the first (epoch + 1). With shuffling, each epoch visits the shards in a
// seeded permutation and each shard's slots in a seeded permutation; every rank derives the
// same permutations from the seed, so the ranks stay disjoint and together read exactly the
// unshuffled epoch's data. Permutations are a pure function of (seed, epoch, shard), so a
// position restores without replaying anything.
//
// Prefetch: a background thread reads the next batch while the caller uses the current one.
// The position is advanced by the caller's thread only, so results never depend on timing.
//
// Validation: construct a second loader with shuffle = false and call reset() before each
// evaluation; it then yields the first batches of the validation shards in order.
#pragma once
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

// Shard headers and bodies are little-endian and read by memcpy.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "token shards are read on little-endian hosts only");

// Where the NEXT batch comes from, plus what is needed to check that it is restored into a
// loader reading the same data the same way. Plain uint64 fields: save it as raw bytes.
struct LoaderPosition {
  uint64_t epoch = 0, shard = 0, sample = 0;  // shard: index in this epoch's visiting order; sample: slot index in
                                              // this shard's visiting order
  uint64_t seed = 0;                          // the permutation seed (the whole RNG state; restore adopts it)
  uint64_t shuffle = 0;                       // 1 if shard and sample order are shuffled
  uint64_t global_batch_tokens = 0;           // R·B·T the position was taken with
  uint64_t num_shards = 0;                    // number of files the position was taken with
};
static_assert(std::is_trivially_copyable<LoaderPosition>::value, "LoaderPosition is saved as raw bytes");

namespace dataloader_detail {

// Seed of the stream for one (purpose, seed, epoch, shard) tuple; chaining through the
// generator keeps nearby tuples uncorrelated.
inline uint64_t stream_seed(uint64_t purpose, uint64_t seed, uint64_t epoch, uint64_t shard) {
  SplitMix64 g{purpose};
  g.state ^= g.next() ^ seed;
  g.state ^= g.next() ^ epoch;
  g.state ^= g.next() ^ shard;
  return g.next();
}

// Fisher–Yates shuffle of [0, n) drawn from the given stream.
inline std::vector<uint32_t> permutation(uint32_t n, uint64_t stream) {
  std::vector<uint32_t> p(n);
  for (uint32_t i = 0; i < n; ++i) p[i] = i;
  SplitMix64 g{stream};
  for (uint32_t i = n; i > 1; --i) std::swap(p[i - 1], p[g.below(i)]);
  return p;
}

inline std::runtime_error file_error(const std::string& path, const std::string& what) {
  return std::runtime_error(path + ": " + what);
}

constexpr size_t kScanTokens = size_t(1) << 20;  // tokens per read while a shard's ids are checked

struct ShardInfo {
  std::string path;
  uint64_t num_tokens = 0;
  uint32_t num_slots = 0;  // global batches in this shard: (num_tokens - 1) / G
};

// Reads the header and size of one shard; throws naming the file on any mismatch.
inline uint64_t validated_token_count(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
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
  if (header[0] != kShardMagic)
    throw file_error(path, "not a token shard: header magic is " + std::to_string(header[0]) + ", expected " +
                               std::to_string(kShardMagic));
  if (header[1] != kShardVersion)
    throw file_error(path, "unsupported token shard version " + std::to_string(header[1]) + ", expected " +
                               std::to_string(kShardVersion));
  if (header[2] < 0)
    throw file_error(path, "header token count is " + std::to_string(header[2]) + ", expected >= 0");
  const uint64_t num_tokens = static_cast<uint64_t>(header[2]);
  const uint64_t expected = kHeaderBytes + 2 * num_tokens;
  if (size != expected)
    throw file_error(path, "file size is " + std::to_string(size) + " bytes, expected 1024 + 2*" +
                               std::to_string(num_tokens) + " = " + std::to_string(expected) +
                               " bytes for the header's token count (truncated or corrupt shard)");
  return num_tokens;
}

// Sorted glob matches; throws naming the pattern when nothing matches.
inline std::vector<std::string> matching_files(const std::string& pattern) {
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

// A shard's content found bad while reading it (a token id outside the vocabulary, a read that
// fails): unlike the errors of construction, this one can surface mid-run, after steps were
// trained on earlier shards.
class ShardDataError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class DataLoader {
 public:
  // Reads micro-batches of B×T for `rank` of `world_size`; token ids must be < vocab_size.
  // prefetch = false reads synchronously inside next_batch (same results).
  DataLoader(const std::string& pattern, int B, int seq_len, int rank, int world_size, bool shuffle, uint64_t seed,
             int vocab_size, bool prefetch = true)
      : B_(B), seq_len_(seq_len), rank_(rank), vocab_size_(vocab_size), shuffle_(shuffle),
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
      info.num_tokens = dataloader_detail::validated_token_count(path);
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
    try {
      staging_.resize(local + 1);
    } catch (const std::bad_alloc&) {
      throw std::runtime_error("cannot allocate " + std::to_string((local + 1) * sizeof(uint16_t)) +
                               " bytes of host memory for a batch of B x T = " + std::to_string(B) + " x " +
                               std::to_string(seq_len) + " tokens");
    }
    ids_checked_.assign(shards_.size(), false);
    if (prefetch_) worker_ = std::thread([this] { prefetch_loop(); });
    reset();
  }
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  ~DataLoader() {
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

  // Fills host arrays of B*T: inputs = tokens[p, p+B*T), targets = tokens[p+1, p+B*T+1).
  // Throws ShardDataError "PATH: token id ... " when the batch's shard holds an id >= vocab_size
  // anywhere; the position then stays put.
  void next_batch(int* inputs, int* targets) {
    if (prefetch_) {
      std::unique_lock<std::mutex> lock(mutex_);
      done_.wait(lock, [this] { return ready_; });
      if (error_) std::rethrow_exception(error_);
    } else {
      read(request_);
    }
    const size_t n = staging_.size() - 1;
    for (size_t i = 0; i < n; ++i) {
      inputs[i] = staging_[i];
      targets[i] = staging_[i + 1];
    }
    advance();
    request_read();
  }

  // Back to epoch 0, first shard, first sample.
  void reset() {
    pos_ = LoaderPosition{};
    pos_.seed = seed_;
    pos_.shuffle = shuffle_ ? 1 : 0;
    pos_.global_batch_tokens = global_batch_tokens_;
    pos_.num_shards = shards_.size();
    shard_order_ = shard_order(seed_, pos_.epoch);
    slot_order_ = slot_order(seed_, pos_.epoch, current_file());
    request_read();
  }

  LoaderPosition position() const { return pos_; }

  // Continues exactly from a position taken by position(), also from another loader over the
  // same files with the same shuffle flag and R·B·T; adopts the position's seed.
  void restore(const LoaderPosition& pos) {
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

  size_t num_shards() const { return shards_.size(); }
  uint64_t tokens_in_shards() const { return tokens_in_shards_; }
  // Global batches in one epoch: how many distinct batches the files hold before they repeat.
  uint64_t batches_per_epoch() const {
    uint64_t n = 0;
    for (const dataloader_detail::ShardInfo& shard : shards_) n += shard.num_slots;
    return n;
  }
  const std::vector<std::string>& files() const { return paths_; }

 private:
  struct ReadRequest {
    size_t file = 0;
    uint64_t offset = 0;  // first token of this rank's B*T+1 tokens within the shard body
  };

  // Visiting order of the shards in an epoch; empty (meaning identity) without shuffling.
  std::vector<uint32_t> shard_order(uint64_t seed, uint64_t epoch) const {
    if (!shuffle_) return {};
    return dataloader_detail::permutation(static_cast<uint32_t>(shards_.size()),
                                          dataloader_detail::stream_seed(1, seed, epoch, 0));
  }
  // Visiting order of one file's slots in an epoch; empty (meaning identity) without shuffling.
  std::vector<uint32_t> slot_order(uint64_t seed, uint64_t epoch, size_t file) const {
    if (!shuffle_) return {};
    return dataloader_detail::permutation(shards_[file].num_slots,
                                          dataloader_detail::stream_seed(2, seed, epoch, file));
  }
  size_t current_file() const { return shuffle_ ? shard_order_[pos_.shard] : pos_.shard; }

  void advance() {
    if (++pos_.sample < shards_[current_file()].num_slots) return;
    pos_.sample = 0;
    if (++pos_.shard == shards_.size()) {
      pos_.shard = 0;
      ++pos_.epoch;
      shard_order_ = shard_order(seed_, pos_.epoch);
    }
    slot_order_ = slot_order(seed_, pos_.epoch, current_file());
  }

  // Hands the read of the batch at pos_ to the prefetch thread (or keeps it for next_batch).
  void request_read() {
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

  void prefetch_loop() {
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

  // Reads B*T+1 tokens into staging_, after checking every token id of their shard the first time
  // it is read from. Runs on one thread at a time.
  void read(const ReadRequest& r) {
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
    read_tokens(shard, r.offset, staging_.data(), staging_.size());
  }

  // Reads `count` tokens from token position `offset` of the open shard.
  void read_tokens(const dataloader_detail::ShardInfo& shard, uint64_t offset, uint16_t* out, size_t count) {
    char* dst = reinterpret_cast<char*>(out);
    const size_t bytes = count * sizeof(uint16_t);
    size_t done = 0;
    while (done < bytes) {
      const ssize_t got = ::pread(open_fd_, dst + done, bytes - done,
                                  static_cast<off_t>(kHeaderBytes + 2 * offset + done));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0)
        throw ShardDataError(shard.path + ": cannot read tokens at position " + std::to_string(offset) + ": " +
                             (got < 0 ? std::strerror(errno) : "file is shorter than when it was validated"));
      done += static_cast<size_t>(got);
    }
  }

  // Every token id of the open shard against the vocabulary; the first bad one is the error.
  void check_token_ids(const dataloader_detail::ShardInfo& shard) {
    std::vector<uint16_t> chunk(static_cast<size_t>(std::min<uint64_t>(shard.num_tokens, dataloader_detail::kScanTokens)));
    for (uint64_t start = 0; start < shard.num_tokens; start += chunk.size()) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(chunk.size(), shard.num_tokens - start));
      read_tokens(shard, start, chunk.data(), n);
      for (size_t i = 0; i < n; ++i)
        if (chunk[i] >= vocab_size_)
          throw ShardDataError(shard.path + ": token id " + std::to_string(chunk[i]) + " at token position " +
                               std::to_string(start + i) + " is >= the vocab size " + std::to_string(vocab_size_));
    }
  }

  const int B_, seq_len_, rank_, vocab_size_;
  const bool shuffle_, prefetch_;
  uint64_t seed_;
  uint64_t global_batch_tokens_ = 0;
  uint64_t tokens_in_shards_ = 0;
  std::vector<dataloader_detail::ShardInfo> shards_;
  std::vector<std::string> paths_;

  // Cursor, owned by the caller's thread.
  LoaderPosition pos_;
  std::vector<uint32_t> shard_order_, slot_order_;

  // Reader state: touched by whichever thread runs read(), never two at once.
  std::vector<uint16_t> staging_;
  int open_fd_ = -1;
  size_t open_file_ = 0;
  std::vector<bool> ids_checked_;  // per shard: every token id was found < vocab_size

  // Prefetch handshake, guarded by mutex_.
  std::thread worker_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  ReadRequest request_;
  bool pending_ = false, busy_ = false, ready_ = false, stop_ = false;
  std::exception_ptr error_;
};
