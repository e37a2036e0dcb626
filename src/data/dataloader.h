// dataloader.h — token shards (docs/FORMATS.md, "Token shard") → (inputs, targets) micro-batches.
//
// Files: every path matching a glob pattern, sorted bytewise so all ranks agree on the
// order. Each header and file size is validated at construction, so a corrupt or too-small
// shard fails before training starts. Both of llm.c's shard kinds are read (GPT-2's uint16 ids,
// Llama 3's uint32 ids; token_kind.h), one kind per pattern: a pattern matching both is refused.
// Token ids are validated a whole shard at a time, when the reader first reads from it (on the
// prefetch thread, while the caller uses the batch before): a bad id anywhere in a shard stops
// the loader at the shard's first batch, before any of its batches is handed out. Such an error,
// found mid-run, is a ShardDataError.
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
// Prefetch: a background thread reads the next batch while the caller uses the current one, and
// runs the consumer's own preparation of it (set_prepare: the model's encoder buckets), so the
// trainer's step boundary holds no per-batch host work. The position is advanced by the caller's
// thread only, and preparation is a function of the tokens alone, so results never depend on timing.
//
// Validation: construct a second loader with shuffle = false and call reset() before each
// evaluation; it then yields the first batches of the validation shards in order.
#pragma once
#include "src/base/file_formats.h"
#include "src/base/rng.h"
#include "src/data/token_kind.h"

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
#include <functional>
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
uint64_t stream_seed(uint64_t purpose, uint64_t seed, uint64_t epoch, uint64_t shard);

// Fisher–Yates shuffle of [0, n) drawn from the given stream.
std::vector<uint32_t> permutation(uint32_t n, uint64_t stream);

std::runtime_error file_error(const std::string& path, const std::string& what);

constexpr size_t kScanTokens = size_t(1) << 20;  // tokens per read while a shard's ids are checked

struct ShardInfo {
  std::string path;
  uint64_t num_tokens = 0;
  uint32_t num_slots = 0;  // global batches in this shard: (num_tokens - 1) / G
};

struct ShardHeader {
  TokenShardKind kind = TokenShardKind::gpt2_uint16;
  uint64_t num_tokens = 0;
};

// Reads the header and size of one shard (1024 + 2·N bytes for GPT-2's kind, 1024 + 4·N for
// Llama 3's); throws naming the file on any mismatch.
ShardHeader validated_shard_header(const std::string& path);

// Sorted glob matches; throws naming the pattern when nothing matches.
std::vector<std::string> matching_files(const std::string& pattern);

}  // namespace dataloader_detail

// A shard's content found bad while reading it (a token id outside the vocabulary, a read that
// fails): unlike the errors of construction, this one can surface mid-run, after steps were
// trained on earlier shards.
class ShardDataError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// One micro-batch as a consumer takes it: B·T input and target ids, the bound they were checked
// against, and what the consumer's preparation (DataLoader::set_prepare) added on the loader thread.
struct TokenBatch {
  std::vector<int> inputs, targets;
  int ids_below = 0;            // every id is in [0, ids_below) (0: not checked)
  std::vector<int> buckets;     // prepared encoder-backward buckets (kernels/encoder.cuh's layout)
  int bucket_segments = 0;      // encoder_backward_build_buckets' count (0: none prepared)
};

class DataLoader {
 public:
  // Reads micro-batches of B×T for `rank` of `world_size`; token ids must be < vocab_size.
  // prefetch = false reads synchronously inside next_batch (same results).
  DataLoader(const std::string& pattern, int B, int seq_len, int rank, int world_size, bool shuffle, uint64_t seed,
             int vocab_size, bool prefetch = true);
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  ~DataLoader();

  // Fills host arrays of B*T: inputs = tokens[p, p+B*T), targets = tokens[p+1, p+B*T+1).
  // Throws ShardDataError "PATH: token id ... " when the batch's shard holds an id >= vocab_size
  // anywhere; the position then stays put.
  void next_batch(int* inputs, int* targets);
  // The same batch as a TokenBatch, swapped out of the loader (no copy): ids checked against
  // vocab_size (ids_below), prepared by set_prepare's function when one is set.
  void next_batch(TokenBatch& batch);

  // `prepare` runs on each batch after it is read (on the prefetch thread), before next_batch hands
  // it out; it must depend on the batch's tokens only. Set once, before the first next_batch that
  // needs it (the batch already read is read and prepared again).
  void set_prepare(std::function<void(TokenBatch&)> prepare);

  // Back to epoch 0, first shard, first sample.
  void reset();

  LoaderPosition position() const { return pos_; }

  // Continues exactly from a position taken by position(), also from another loader over the
  // same files with the same shuffle flag and R·B·T; adopts the position's seed.
  void restore(const LoaderPosition& pos);

  size_t num_shards() const { return shards_.size(); }
  uint64_t tokens_in_shards() const { return tokens_in_shards_; }
  // Global batches in one epoch: how many distinct batches the files hold before they repeat.
  uint64_t batches_per_epoch() const;
  const std::vector<std::string>& files() const { return paths_; }
  // Which tokenizer's ids the shards hold (all of them: one kind per pattern); check it against the
  // model with check_shard_vocabulary(files()[0], token_kind(), V).
  TokenShardKind token_kind() const { return kind_; }

 private:
  struct ReadRequest {
    size_t file = 0;
    uint64_t offset = 0;  // first token of this rank's B*T+1 tokens within the shard body
  };

  // Visiting order of the shards in an epoch; empty (meaning identity) without shuffling.
  std::vector<uint32_t> shard_order(uint64_t seed, uint64_t epoch) const;
  // Visiting order of one file's slots in an epoch; empty (meaning identity) without shuffling.
  std::vector<uint32_t> slot_order(uint64_t seed, uint64_t epoch, size_t file) const;
  size_t current_file() const { return shuffle_ ? shard_order_[pos_.shard] : pos_.shard; }

  void advance();

  // Hands the read of the batch at pos_ to the prefetch thread (or keeps it for next_batch).
  void request_read();

  void prefetch_loop();

  // Waits for the batch at pos_ (reads it without prefetch); rethrows its read's error.
  void wait_for_batch();

  // Reads B*T+1 tokens into batch_ (via staging_: the shard's raw ids, widened to int), after
  // checking every token id of their shard the first time it is read from, then prepares it.
  // Runs on one thread at a time.
  void read(const ReadRequest& r);

  // Reads `count` tokens' raw bytes (id_bytes_ each) from token position `offset` of the open shard.
  void read_tokens(const dataloader_detail::ShardInfo& shard, uint64_t offset, unsigned char* out, size_t count);

  // Every token id of the open shard against the vocabulary; the first bad one is the error.
  void check_token_ids(const dataloader_detail::ShardInfo& shard);

  const int B_, seq_len_, rank_, vocab_size_;
  const bool shuffle_, prefetch_;
  uint64_t seed_;
  TokenShardKind kind_ = TokenShardKind::gpt2_uint16;
  size_t id_bytes_ = 2;  // token_id_bytes(kind_)
  uint64_t global_batch_tokens_ = 0;
  uint64_t tokens_in_shards_ = 0;
  std::vector<dataloader_detail::ShardInfo> shards_;
  std::vector<std::string> paths_;

  // Cursor, owned by the caller's thread.
  LoaderPosition pos_;
  std::vector<uint32_t> shard_order_, slot_order_;

  // Reader state: touched by whichever thread runs read(), never two at once.
  std::vector<unsigned char> staging_;  // B*T+1 raw ids
  TokenBatch batch_;
  std::function<void(TokenBatch&)> prepare_;
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
