// DataLoader vs. the docs/FORMATS.md reading rule written out here: exact unshuffled order, shard
// switching and epoch wrap, rank disjointness and epoch coverage with and without shuffling,
// seeds, position save/restore, prefetch independence, and every file error by message.
#include "test/test_util.h"
#include "src/data/dataloader.h"
#include "test/shard_files.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace {

constexpr int kVocab = 65536;

// Token at position p of shard s: unique across the test corpus, so a token tells where it
// was read from (shard = token / 4096, position = token % 4096).
std::vector<uint16_t> pattern_tokens(int shard, int n) {
  std::vector<uint16_t> t(n);
  for (int p = 0; p < n; ++p) t[p] = static_cast<uint16_t>(shard * 4096 + p);
  return t;
}

// A corpus of 4 shards of uneven sizes, written in non-sorted order, plus a file the pattern
// must not match.
struct Corpus {
  TempDir dir;
  std::vector<std::vector<uint16_t>> shards;  // in sorted file-name order
  std::vector<std::string> paths;
  Corpus() {
    const int sizes[4] = {301, 97, 250, 413};
    const int write_order[4] = {2, 0, 3, 1};
    shards.resize(4);
    paths.resize(4);
    for (int s : write_order) {
      shards[s] = pattern_tokens(s, sizes[s]);
      paths[s] = dir.file("train_" + std::to_string(s) + ".bin");
      write_shard(paths[s], shards[s]);
    }
    write_shard(dir.file("val_0.bin"), pattern_tokens(9, 50));
  }
  std::string pattern() const { return dir.file("train_*.bin"); }
};

struct Batch {
  std::vector<int> inputs, targets;
  uint64_t epoch, shard, sample;  // position() before the batch was read
  bool operator==(const Batch& o) const { return inputs == o.inputs && targets == o.targets; }
  bool operator<(const Batch& o) const { return inputs < o.inputs || (inputs == o.inputs && targets < o.targets); }
};

std::vector<Batch> take(DataLoader& loader, int B, int T, size_t steps) {
  std::vector<Batch> out;
  for (size_t k = 0; k < steps; ++k) {
    Batch b;
    const LoaderPosition p = loader.position();
    b.epoch = p.epoch;
    b.shard = p.shard;
    b.sample = p.sample;
    b.inputs.assign(static_cast<size_t>(B) * T, -1);
    b.targets.assign(static_cast<size_t>(B) * T, -1);
    loader.next_batch(b.inputs.data(), b.targets.data());
    out.push_back(std::move(b));
  }
  return out;
}

// One epoch for one rank by the docs/FORMATS.md rule: step k reads B*T+1 tokens at k*R*B*T + r*B*T
// of the current shard while at least R*B*T+1 tokens remain from k*R*B*T on.
std::vector<Batch> reference_epoch(const Corpus& c, int B, int T, int rank, int R, uint64_t epoch) {
  std::vector<Batch> out;
  const size_t local = static_cast<size_t>(B) * T, global = local * R;
  for (size_t s = 0; s < c.shards.size(); ++s) {
    const std::vector<uint16_t>& tok = c.shards[s];
    for (size_t k = 0; tok.size() - k * global >= global + 1; ++k) {
      Batch b;
      b.epoch = epoch;
      b.shard = s;
      b.sample = k;
      const size_t start = k * global + rank * local;
      for (size_t i = 0; i < local; ++i) {
        b.inputs.push_back(tok[start + i]);
        b.targets.push_back(tok[start + i + 1]);
      }
      out.push_back(std::move(b));
    }
  }
  return out;
}

struct Shape {
  int B, T, R;
};
const Shape kShapes[] = {{3, 5, 1}, {1, 1, 1}, {2, 7, 2}, {1, 1, 4}, {3, 5, 4}, {5, 3, 2}};

}  // namespace

using Catch::Matchers::Contains;

TEST_CASE("dataloader finds the shards sorted and counts their tokens", "[dataloader]") {
  Corpus c;
  DataLoader loader(c.pattern(), 2, 3, 0, 1, false, 0, kVocab);
  CHECK(loader.files() == c.paths);
  CHECK(loader.num_shards() == 4);
  CHECK(loader.tokens_in_shards() == 301u + 97 + 250 + 413);
  // (N - 1) / (R*B*T) batches per shard, R*B*T = 6: 50 + 16 + 41 + 68
  CHECK(loader.batches_per_epoch() == 175u);
  CHECK(DataLoader(c.pattern(), 2, 3, 1, 2, false, 0, kVocab).batches_per_epoch() == 25u + 8 + 20 + 34);
  for (const Shape& s : kShapes)
    CHECK(DataLoader(c.pattern(), s.B, s.T, 0, s.R, false, 0, kVocab).batches_per_epoch() ==
          reference_epoch(c, s.B, s.T, 0, s.R, 0).size());
}

TEST_CASE("dataloader without shuffling reads exactly the docs/FORMATS.md order, wrapping epochs", "[dataloader]") {
  Corpus c;
  for (const Shape& s : kShapes) {
    for (int rank = 0; rank < s.R; ++rank) {
      INFO("B=" << s.B << " T=" << s.T << " R=" << s.R << " rank=" << rank);
      std::vector<Batch> want;
      for (uint64_t e = 0; e < 3; ++e) {
        const std::vector<Batch> epoch = reference_epoch(c, s.B, s.T, rank, s.R, e);
        want.insert(want.end(), epoch.begin(), epoch.end());
      }
      DataLoader loader(c.pattern(), s.B, s.T, rank, s.R, false, 123, kVocab);
      const std::vector<Batch> got = take(loader, s.B, s.T, want.size());
      for (size_t k = 0; k < want.size(); ++k) {
        INFO("step " << k);
        REQUIRE(got[k].inputs == want[k].inputs);
        REQUIRE(got[k].targets == want[k].targets);
        REQUIRE(got[k].epoch == want[k].epoch);
        REQUIRE(got[k].shard == want[k].shard);
        REQUIRE(got[k].sample == want[k].sample);
      }
      const LoaderPosition p = loader.position();
      CHECK(p.epoch == 3);
      CHECK(p.shard == 0);
      CHECK(p.sample == 0);
    }
  }
}

TEST_CASE("dataloader ranks are disjoint and together read the unshuffled epoch", "[dataloader]") {
  Corpus c;
  const Shape shapes[] = {{3, 5, 1}, {2, 7, 2}, {1, 1, 4}, {3, 5, 4}};
  for (const Shape& s : shapes) {
    for (bool shuffle : {false, true}) {
      INFO("B=" << s.B << " T=" << s.T << " R=" << s.R << " shuffle=" << shuffle);
      const int local = s.B * s.T;
      std::vector<std::vector<Batch>> per_rank;
      std::vector<Batch> all, all_reference;
      for (int rank = 0; rank < s.R; ++rank) {
        const std::vector<Batch> ref = reference_epoch(c, s.B, s.T, rank, s.R, 0);
        all_reference.insert(all_reference.end(), ref.begin(), ref.end());
        DataLoader loader(c.pattern(), s.B, s.T, rank, s.R, shuffle, 42, kVocab);
        per_rank.push_back(take(loader, s.B, s.T, ref.size()));
        all.insert(all.end(), per_rank.back().begin(), per_rank.back().end());
        const LoaderPosition p = loader.position();
        CHECK(p.epoch == 1);
        CHECK(p.shard == 0);
        CHECK(p.sample == 0);
        if (shuffle) {
          bool same_order = true;
          for (size_t k = 0; k < ref.size(); ++k) same_order = same_order && per_rank.back()[k] == ref[k];
          CHECK_FALSE(same_order);
        }
      }
      // Each batch is one contiguous run of a shard, and at every step the ranks read the
      // consecutive B*T parts of the same global batch slot.
      for (size_t k = 0; k < per_rank[0].size(); ++k) {
        const int slot_start = per_rank[0][k].inputs[0];
        for (int rank = 0; rank < s.R; ++rank) {
          const Batch& b = per_rank[rank][k];
          REQUIRE(b.inputs[0] == slot_start + rank * local);
          for (int i = 0; i < local; ++i) {
            REQUIRE(b.inputs[i] == b.inputs[0] + i);
            REQUIRE(b.targets[i] == b.inputs[i] + 1);
          }
        }
      }
      // Disjoint: no input token (= shard position) is read twice; union: the same batches
      // as the unshuffled epoch.
      std::vector<int> inputs;
      for (const Batch& b : all) inputs.insert(inputs.end(), b.inputs.begin(), b.inputs.end());
      std::sort(inputs.begin(), inputs.end());
      CHECK(std::adjacent_find(inputs.begin(), inputs.end()) == inputs.end());
      std::sort(all.begin(), all.end());
      std::sort(all_reference.begin(), all_reference.end());
      CHECK(all == all_reference);
    }
  }
}

TEST_CASE("dataloader shuffling: same seed same order, other seed or epoch another order", "[dataloader]") {
  Corpus c;
  const int B = 2, T = 3;  // 6-token slots: 50, 16, 41, 68 per shard
  const size_t per_epoch = reference_epoch(c, B, T, 0, 1, 0).size();
  DataLoader a(c.pattern(), B, T, 0, 1, true, 7, kVocab);
  DataLoader b(c.pattern(), B, T, 0, 1, true, 7, kVocab);
  DataLoader other(c.pattern(), B, T, 0, 1, true, 8, kVocab);
  const std::vector<Batch> run_a = take(a, B, T, 2 * per_epoch);
  const std::vector<Batch> run_b = take(b, B, T, 2 * per_epoch);
  const std::vector<Batch> run_other = take(other, B, T, 2 * per_epoch);
  CHECK(run_a == run_b);
  CHECK_FALSE(run_a == run_other);
  // Within every shard (16 or more slots each) the slot order changes with the epoch.
  std::vector<int> slot_starts[2][4];
  for (size_t k = 0; k < run_a.size(); ++k)
    slot_starts[k / per_epoch][run_a[k].inputs[0] / 4096].push_back(run_a[k].inputs[0]);
  for (int shard = 0; shard < 4; ++shard) {
    INFO("shard " << shard);
    CHECK(slot_starts[0][shard].size() == slot_starts[1][shard].size());
    CHECK(slot_starts[0][shard] != slot_starts[1][shard]);
  }
  // The shard visiting order itself changes with the epoch for some seed (4! orders).
  bool shard_order_varies = false;
  for (uint64_t seed = 0; seed < 8 && !shard_order_varies; ++seed) {
    DataLoader l(c.pattern(), B, T, 0, 1, true, seed, kVocab);
    const std::vector<Batch> run = take(l, B, T, 2 * per_epoch);
    std::vector<int> first_shards[2];
    for (size_t k = 0; k < run.size(); ++k) {
      const int shard = run[k].inputs[0] / 4096;
      std::vector<int>& order = first_shards[k / per_epoch];
      if (order.empty() || order.back() != shard) order.push_back(shard);
    }
    shard_order_varies = first_shards[0] != first_shards[1];
  }
  CHECK(shard_order_varies);
}

TEST_CASE("dataloader position save/restore continues with identical batches", "[dataloader]") {
  Corpus c;
  const int B = 3, T = 5, R = 2, rank = 1;
  const size_t per_epoch = reference_epoch(c, B, T, rank, R, 0).size();
  for (bool shuffle : {false, true}) {
    for (size_t skip : {per_epoch / 2 + 1, per_epoch, 2 * per_epoch - 1}) {
      INFO("shuffle=" << shuffle << " skip=" << skip);
      DataLoader a(c.pattern(), B, T, rank, R, shuffle, 5, kVocab);
      take(a, B, T, skip);
      const LoaderPosition saved = a.position();
      const size_t follow = per_epoch + 3;  // crosses the next epoch boundary
      const std::vector<Batch> want = take(a, B, T, follow);

      // Round trip through raw bytes, as a checkpoint stores it.
      unsigned char bytes[sizeof(LoaderPosition)];
      std::memcpy(bytes, &saved, sizeof(bytes));
      LoaderPosition loaded;
      std::memcpy(&loaded, bytes, sizeof(bytes));

      // A fresh loader built with another seed adopts the saved one.
      DataLoader b(c.pattern(), B, T, rank, R, shuffle, 999, kVocab);
      take(b, B, T, 3);  // restore must also discard b's prefetched batch
      b.restore(loaded);
      CHECK(b.position().epoch == saved.epoch);
      CHECK(b.position().shard == saved.shard);
      CHECK(b.position().sample == saved.sample);
      CHECK(take(b, B, T, follow) == want);

      a.restore(saved);  // the same loader, after moving on
      CHECK(take(a, B, T, follow) == want);
    }
  }
}

TEST_CASE("dataloader refuses a position taken with another layout", "[dataloader]") {
  Corpus c;
  const int B = 3, T = 5, R = 2, rank = 1;
  DataLoader a(c.pattern(), B, T, rank, R, true, 5, kVocab);
  take(a, B, T, 4);
  const LoaderPosition saved = a.position();
  DataLoader other_world(c.pattern(), B, T, 0, 4, true, 5, kVocab);
  CHECK_THAT(error_of([&] { other_world.restore(saved); }), Contains("cannot restore"));
  DataLoader unshuffled(c.pattern(), B, T, rank, R, false, 5, kVocab);
  CHECK_THAT(error_of([&] { unshuffled.restore(saved); }), Contains("cannot restore"));
  LoaderPosition beyond = saved;
  beyond.sample = 1000;
  CHECK_THAT(error_of([&] { a.restore(beyond); }), Contains("restored sample 1000"));
  const Batch next = take(a, B, T, 1)[0];  // a failed restore leaves the loader as it was
  CHECK(next.shard == saved.shard);
  CHECK(next.sample == saved.sample);
}

TEST_CASE("dataloader prefetch does not change results; reset starts over", "[dataloader]") {
  Corpus c;
  const int B = 2, T = 7, R = 2, rank = 1;
  const size_t per_epoch = reference_epoch(c, B, T, rank, R, 0).size();
  for (bool shuffle : {false, true}) {
    INFO("shuffle=" << shuffle);
    DataLoader direct(c.pattern(), B, T, rank, R, shuffle, 3, kVocab, false);
    DataLoader prefetched(c.pattern(), B, T, rank, R, shuffle, 3, kVocab, true);
    const std::vector<Batch> want = take(direct, B, T, 2 * per_epoch + 5);
    CHECK(take(prefetched, B, T, 2 * per_epoch + 5) == want);
    // reset mid-epoch (a prefetch in flight) gives the first batches again: the validation use.
    for (DataLoader* l : {&direct, &prefetched}) {
      l->reset();
      const LoaderPosition p = l->position();
      CHECK(p.epoch == 0);
      CHECK(p.shard == 0);
      CHECK(p.sample == 0);
      for (int round = 0; round < 2; ++round) {
        CHECK(take(*l, B, T, 4) == std::vector<Batch>(want.begin(), want.begin() + 4));
        l->reset();
      }
    }
  }
}

TEST_CASE("dataloader hands out prepared TokenBatches: the same tokens, prepared once each", "[dataloader]") {
  // The trainer's path: next_batch(TokenBatch&) with a preparation set after the first read (the
  // model exists only after the loader). Every batch is the one next_batch(int*, int*) gives, its
  // ids marked checked against the loader's vocabulary, and prepared from its own tokens.
  Corpus c;
  const int B = 2, T = 7, R = 2, rank = 0;
  const size_t n = 2 * reference_epoch(c, B, T, rank, R, 0).size() + 3;
  for (bool prefetch : {false, true}) {
    INFO("prefetch=" << prefetch);
    DataLoader plain(c.pattern(), B, T, rank, R, true, 5, kVocab, prefetch);
    const std::vector<Batch> want = take(plain, B, T, n);
    DataLoader loader(c.pattern(), B, T, rank, R, true, 5, kVocab, prefetch);
    loader.set_prepare([](TokenBatch& b) {
      b.buckets.assign(1, 0);
      for (int id : b.inputs) b.buckets[0] += id;  // a function of the tokens alone
      b.bucket_segments = 1;
    });
    TokenBatch batch;
    for (size_t k = 0; k < n; ++k) {
      loader.next_batch(batch);
      INFO("batch " << k);
      CHECK(batch.inputs == want[k].inputs);
      CHECK(batch.targets == want[k].targets);
      CHECK(batch.ids_below == kVocab);
      CHECK(batch.bucket_segments == 1);
      int sum = 0;
      for (int id : want[k].inputs) sum += id;
      CHECK(batch.buckets == std::vector<int>{sum});
    }
  }
}

TEST_CASE("dataloader file errors name the file and what was expected", "[dataloader]") {
  TempDir dir;
  const std::vector<uint16_t> good = pattern_tokens(0, 100);

  SECTION("no file matches") {
    const std::string pattern = dir.file("missing_*.bin");
    const std::string msg = error_of([&] { DataLoader(pattern, 2, 3, 0, 1, false, 0, kVocab); });
    CHECK_THAT(msg, Contains(pattern) && Contains("no file matches"));
  }
  SECTION("bad magic") {
    const std::string path = dir.file("magic.bin");
    write_shard(path, good, 12345);
    const std::string msg = error_of([&] { DataLoader(path, 2, 3, 0, 1, false, 0, kVocab); });
    CHECK_THAT(msg, Contains(path) && Contains("magic is 12345") && Contains("expected 20240520"));
  }
  SECTION("bad version") {
    const std::string path = dir.file("version.bin");
    write_shard(path, good, 20240520, 2);
    const std::string msg = error_of([&] { DataLoader(path, 2, 3, 0, 1, false, 0, kVocab); });
    CHECK_THAT(msg, Contains(path) && Contains("version 2") && Contains("expected 1"));
  }
  SECTION("truncated body") {
    const std::string path = dir.file("short.bin");
    write_shard(path, good, 20240520, 1, 2, -3);
    const std::string msg = error_of([&] { DataLoader(path, 2, 3, 0, 1, false, 0, kVocab); });
    CHECK_THAT(msg, Contains(path) && Contains("file size is 1221 bytes") && Contains("= 1224 bytes"));
  }
  SECTION("trailing bytes") {
    const std::string path = dir.file("long.bin");
    write_shard(path, good, 20240520, 1, 2, 2);
    const std::string msg = error_of([&] { DataLoader(path, 2, 3, 0, 1, false, 0, kVocab); });
    CHECK_THAT(msg, Contains(path) && Contains("file size is 1226 bytes") && Contains("= 1224 bytes"));
  }
  SECTION("shorter than the header") {
    const std::string path = dir.file("stub.bin");
    std::ofstream(path, std::ios::binary) << "tiny";
    const std::string msg = error_of([&] { DataLoader(path, 2, 3, 0, 1, false, 0, kVocab); });
    CHECK_THAT(msg, Contains(path) && Contains("4 bytes") && Contains("1024-byte"));
  }
  SECTION("one bad file among good ones fails at construction") {
    write_shard(dir.file("s_0.bin"), good);
    write_shard(dir.file("s_1.bin"), good, 20240520, 1, 2, -1);
    const std::string msg = error_of([&] { DataLoader(dir.file("s_*.bin"), 2, 3, 0, 1, false, 0, kVocab); });
    CHECK_THAT(msg, Contains(dir.file("s_1.bin")));
  }
  SECTION("shard smaller than one global batch + 1") {
    // R*B*T = 2*3*4 = 24: 25 tokens suffice, 24 do not.
    const std::string ok = dir.file("ok.bin"), small = dir.file("small.bin");
    write_shard(ok, pattern_tokens(0, 25));
    write_shard(small, pattern_tokens(0, 24));
    DataLoader fits(ok, 3, 4, 1, 2, false, 0, kVocab);
    const std::string msg = error_of([&] { DataLoader(small, 3, 4, 1, 2, false, 0, kVocab); });
    CHECK_THAT(msg, Contains(small) && Contains("holds 24 tokens") && Contains("= 25 tokens"));
  }
  SECTION("token id >= vocab size") {
    // B*T = 6, R = 1: the bad id at 12 is only batch 1's last target, yet batch 0 already fails:
    // the whole shard is checked before its first batch is handed out.
    for (bool prefetch : {false, true}) {
      INFO("prefetch=" << prefetch);
      const std::string path = dir.file("ids.bin");
      std::vector<uint16_t> tokens(40, 50256);
      tokens[12] = 50257;
      write_shard(path, tokens);
      DataLoader loader(path, 2, 3, 0, 1, false, 0, 50257, prefetch);
      std::vector<int> in(6), tg(6);
      for (int attempt = 0; attempt < 2; ++attempt) {  // the error stays: the shard was not accepted
        const std::string msg = error_of([&] { loader.next_batch(in.data(), tg.data()); });
        CHECK_THAT(msg, Contains(path) && Contains("token id 50257") && Contains("position 12") &&
                            Contains("vocab size 50257"));
        CHECK(loader.position().sample == 0);  // the failed batch was not consumed
      }
    }
  }
  SECTION("a bad token id in a later shard stops the loader at that shard's first batch") {
    // Two shards of 3 batches (B*T = 6): the bad id is in the last batch of the second shard.
    for (bool prefetch : {false, true}) {
      INFO("prefetch=" << prefetch);
      std::vector<uint16_t> tokens(19, 7);
      write_shard(dir.file("later_0.bin"), tokens);
      tokens[17] = 500;
      write_shard(dir.file("later_1.bin"), tokens);
      DataLoader loader(dir.file("later_*.bin"), 2, 3, 0, 1, false, 0, 500, prefetch);
      std::vector<int> in(6), tg(6);
      for (int k = 0; k < 3; ++k) loader.next_batch(in.data(), tg.data());
      try {
        loader.next_batch(in.data(), tg.data());
        FAIL("the first batch of the shard with a bad id was handed out");
      } catch (const ShardDataError& e) {
        CHECK(std::string(e.what()) == dir.file("later_1.bin") + ": token id 500 at token position 17 is >= the vocab size 500");
      }
      CHECK(loader.position().shard == 1);
      CHECK(loader.position().sample == 0);
    }
  }
  SECTION("bad arguments") {
    const std::string path = dir.file("args.bin");
    write_shard(path, good);
    CHECK_THAT(error_of([&] { DataLoader(path, 2, 3, 2, 2, false, 0, kVocab); }), Contains("rank 2"));
    CHECK_THAT(error_of([&] { DataLoader(path, 0, 3, 0, 1, false, 0, kVocab); }), Contains("positive"));
  }
}
