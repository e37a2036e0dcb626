// DataLoader over both of llm.c's shard kinds (docs/FORMATS.md, "Token shard"): Llama 3's uint32
// shards read to the same batches as the reading rule written out here, GPT-2's unchanged; each
// kind's exact size and version checks; a pattern mixing kinds refused naming both files; ids >= V
// refused in 32-bit shards; and check_shard_vocabulary's refusal of a shard for the other vocabulary.
#include "test/test_util.h"
#include "src/data/dataloader.h"
#include "src/data/token_kind.h"
#include "test/shard_files.h"

#include <fstream>
#include <string>
#include <vector>

namespace {

constexpr int kLlamaVocab = 128256, kGpt2Vocab = 50257;

void write_llama_shard(const std::string& path, const std::vector<uint32_t>& ids, long extra_bytes = 0) {
  write_shard(path, ids, 20240801, 7, 4, extra_bytes);
}
void write_gpt2_shard(const std::string& path, const std::vector<uint32_t>& ids, long extra_bytes = 0) {
  write_shard(path, ids, 20240520, 1, 2, extra_bytes);
}

// Ids that need all 32 bits' lower 17: position p of shard s is 65536 + 1000·s + p (so a 16-bit
// read, or a read at the wrong offset, shows).
std::vector<uint32_t> wide_ids(int shard, int n) {
  std::vector<uint32_t> ids(static_cast<size_t>(n));
  for (int p = 0; p < n; ++p) ids[static_cast<size_t>(p)] = 65536u + 1000u * static_cast<uint32_t>(shard) + static_cast<uint32_t>(p);
  return ids;
}

// Every batch of one unshuffled epoch of single-shard or multi-shard data by the reading rule:
// step k reads B*T+1 ids at k*R*B*T + r*B*T of the current shard.
void check_epoch(DataLoader& loader, const std::vector<std::vector<uint32_t>>& shards, int B, int T, int rank, int R) {
  const size_t local = static_cast<size_t>(B) * T, global = local * R;
  std::vector<int> in(local), tg(local);
  for (size_t s = 0; s < shards.size(); ++s)
    for (size_t k = 0; shards[s].size() - k * global >= global + 1; ++k) {
      std::fill(in.begin(), in.end(), -1);
      std::fill(tg.begin(), tg.end(), -1);
      loader.next_batch(in.data(), tg.data());
      const size_t start = k * global + static_cast<size_t>(rank) * local;
      for (size_t i = 0; i < local; ++i) {
        INFO("shard " << s << " step " << k << " i " << i);
        REQUIRE(in[i] == static_cast<int>(shards[s][start + i]));
        REQUIRE(tg[i] == static_cast<int>(shards[s][start + i + 1]));
      }
    }
}

}  // namespace

using Catch::Matchers::Contains;

TEST_CASE("token shards: Llama 3's uint32 shards read by the same rule as GPT-2's", "[dataloader]") {
  TempDir dir;
  const std::vector<std::vector<uint32_t>> llama = {wide_ids(0, 301), wide_ids(1, 97), wide_ids(2, 250)};
  for (size_t s = 0; s < llama.size(); ++s) write_llama_shard(dir.file("l_" + std::to_string(s) + ".bin"), llama[s]);
  std::vector<std::vector<uint32_t>> gpt2 = llama;
  for (auto& shard : gpt2)
    for (uint32_t& id : shard) id -= 65536;  // the same positions, in 16 bits
  for (size_t s = 0; s < gpt2.size(); ++s) write_gpt2_shard(dir.file("g_" + std::to_string(s) + ".bin"), gpt2[s]);

  for (bool prefetch : {false, true})
    for (int R : {1, 3}) {
      INFO("prefetch=" << prefetch << " R=" << R);
      for (int rank = 0; rank < R; ++rank) {
        DataLoader l(dir.file("l_*.bin"), 3, 5, rank, R, false, 0, kLlamaVocab, prefetch);
        CHECK(l.token_kind() == TokenShardKind::llama3_uint32);
        CHECK(l.tokens_in_shards() == 301 + 97 + 250);
        check_epoch(l, llama, 3, 5, rank, R);
        DataLoader g(dir.file("g_*.bin"), 3, 5, rank, R, false, 0, kGpt2Vocab, prefetch);
        CHECK(g.token_kind() == TokenShardKind::gpt2_uint16);
        check_epoch(g, gpt2, 3, 5, rank, R);
      }
    }
}

TEST_CASE("token shards: each kind's header and exact size, mixed kinds refused", "[dataloader]") {
  TempDir dir;
  const std::vector<uint32_t> ids = wide_ids(0, 100);
  const auto open = [&](const std::string& pattern) {
    return error_of([&] { DataLoader(pattern, 2, 3, 0, 1, false, 0, kLlamaVocab); });
  };
  SECTION("a Llama 3 shard of 1024 + 4N bytes is read; 2 bytes short or long is refused") {
    write_llama_shard(dir.file("ok.bin"), ids);
    CHECK(open(dir.file("ok.bin")).empty());
    write_llama_shard(dir.file("short.bin"), ids, -2);
    CHECK_THAT(open(dir.file("short.bin")), Contains(dir.file("short.bin")) && Contains("file size is 1422 bytes") &&
                                                Contains("1024 + 4*100 = 1424 bytes") && Contains("magic 20240801"));
    write_llama_shard(dir.file("long.bin"), ids, 2);
    CHECK_THAT(open(dir.file("long.bin")), Contains("file size is 1426 bytes") && Contains("= 1424 bytes"));
  }
  SECTION("a Llama 3 header over a body of uint16 ids (1024 + 2N bytes) is refused") {
    write_gpt2_shard(dir.file("narrow.bin"), std::vector<uint32_t>(100, 7));
    std::fstream f(dir.file("narrow.bin"), std::ios::in | std::ios::out | std::ios::binary);
    const int32_t llama_head[2] = {20240801, 7};
    f.write(reinterpret_cast<const char*>(llama_head), sizeof(llama_head));
    f.close();
    CHECK_THAT(open(dir.file("narrow.bin")), Contains("file size is 1224 bytes") && Contains("1024 + 4*100 = 1424 bytes"));
  }
  SECTION("a GPT-2 shard's size is still 1024 + 2N") {
    write_gpt2_shard(dir.file("g.bin"), std::vector<uint32_t>(100, 7), 2);
    CHECK_THAT(open(dir.file("g.bin")), Contains("file size is 1226 bytes") && Contains("1024 + 2*100 = 1224 bytes"));
  }
  SECTION("each magic takes its own version") {
    write_shard(dir.file("v1.bin"), ids, 20240801, 1, 4);
    CHECK_THAT(open(dir.file("v1.bin")), Contains(dir.file("v1.bin")) && Contains("version 1, expected 7"));
    write_shard(dir.file("v7.bin"), std::vector<uint32_t>(100, 7), 20240520, 7, 2);
    CHECK_THAT(open(dir.file("v7.bin")), Contains("version 7, expected 1"));
    write_shard(dir.file("magic.bin"), ids, 20240802, 7, 4);
    CHECK_THAT(open(dir.file("magic.bin")),
               Contains("magic is 20240802") && Contains("20240520") && Contains("20240801"));
  }
  SECTION("one pattern matching both kinds is refused, naming both files") {
    write_gpt2_shard(dir.file("m_0.bin"), std::vector<uint32_t>(100, 7));
    write_llama_shard(dir.file("m_1.bin"), ids);
    const std::string msg = open(dir.file("m_*.bin"));
    CHECK(msg == dir.file("m_1.bin") + ": a Llama 3 token shard (magic 20240801, uint32 ids), but " +
                     dir.file("m_0.bin") + ", matched by the same pattern, is a GPT-2 token shard (magic 20240520, " +
                     "uint16 ids): one pattern's shards must come from one tokenizer");
  }
}

TEST_CASE("token shards: a 32-bit id >= V is refused with its value", "[dataloader]") {
  TempDir dir;
  for (uint32_t bad : {uint32_t(kLlamaVocab), uint32_t(0x80000000u), uint32_t(0xFFFFFFFFu)}) {
    INFO("bad id " << bad);
    std::vector<uint32_t> ids(40, 128000);
    ids[13] = bad;
    write_llama_shard(dir.file("ids.bin"), ids);
    DataLoader loader(dir.file("ids.bin"), 2, 3, 0, 1, false, 0, kLlamaVocab, false);
    std::vector<int> in(6), tg(6);
    CHECK(error_of([&] { loader.next_batch(in.data(), tg.data()); }) ==
          dir.file("ids.bin") + ": token id " + std::to_string(bad) + " at token position 13 is >= the vocab size 128256");
  }
}

TEST_CASE("check_shard_vocabulary refuses a shard of the other tokenizer's kind", "[dataloader]") {
  const std::string f = "data/x_train_000001.bin";
  CHECK(error_of([&] { check_shard_vocabulary(f, TokenShardKind::gpt2_uint16, kLlamaVocab); }) ==
        f + ": a GPT-2 token shard (magic 20240520, uint16 ids); the model has Llama 3's vocabulary (V=128256): "
            "tokenize with --encoding llama3");
  CHECK(error_of([&] { check_shard_vocabulary(f, TokenShardKind::llama3_uint32, kGpt2Vocab); }) ==
        f + ": a Llama 3 token shard (magic 20240801, uint32 ids); the model has GPT-2's vocabulary (V=50257): "
            "tokenize with --encoding gpt2");
  CHECK(error_of([&] { check_shard_vocabulary(f, TokenShardKind::gpt2_uint16, kGpt2Vocab); }).empty());
  CHECK(error_of([&] { check_shard_vocabulary(f, TokenShardKind::llama3_uint32, kLlamaVocab); }).empty());
  // The boundary: 65536 ids fit uint16, 65537 do not.
  CHECK(error_of([&] { check_shard_vocabulary(f, TokenShardKind::gpt2_uint16, 65536); }).empty());
  CHECK_THAT(error_of([&] { check_shard_vocabulary(f, TokenShardKind::gpt2_uint16, 65537); }),
             Contains("(V=65537)") && Contains("--encoding llama3"));
  CHECK_THAT(error_of([&] { check_shard_vocabulary(f, TokenShardKind::llama3_uint32, 65536); }),
             Contains("(V=65536)") && Contains("--encoding gpt2"));
  CHECK_THAT(error_of([&] { check_shard_vocabulary(f, TokenShardKind::llama3_uint32, 300); }), Contains("(V=300)"));
}

TEST_CASE("check_shard_vocabulary on a loader: a GPT-2 shard's ids all fit Llama's V, the kind does not", "[dataloader]") {
  TempDir dir;
  write_gpt2_shard(dir.file("g.bin"), std::vector<uint32_t>(40, 50256));
  DataLoader loader(dir.file("g.bin"), 2, 3, 0, 1, false, 0, kLlamaVocab);
  std::vector<int> in(6), tg(6);
  loader.next_batch(in.data(), tg.data());  // every id < 128256: the loader alone accepts it
  CHECK_THAT(error_of([&] { check_shard_vocabulary(loader.files()[0], loader.token_kind(), kLlamaVocab); }),
             Contains(dir.file("g.bin") + ": a GPT-2 token shard"));
}
