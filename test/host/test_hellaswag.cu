// read_choice_eval_file on both eval-file versions (docs/FORMATS.md, "Evaluation file"): llm.c's
// version 1 (uint16 values, start marker 65535) and version 2 (uint32 values, marker 0xFFFFFFFF,
// for Llama 3's ids) give the same examples; ids above 65535 survive version 2; a file of one
// tokenizer's kind for a model of the other's vocabulary is refused; damaged version-2 files are
// refused by message, a huge stated token count before anything is allocated for it.
#include "test/test_util.h"
#include "src/data/hellaswag.h"
#include "test/shard_files.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace {

struct Example {
  uint32_t label;
  std::vector<uint32_t> context;
  std::vector<std::vector<uint32_t>> completions;
};

// The file as docs/FORMATS.md states it, every body value `width` bytes (2: version 1, 4: version 2).
std::vector<unsigned char> eval_file(const std::vector<Example>& examples, int width, int32_t version) {
  std::vector<uint32_t> stream;
  uint32_t longest = 0;
  const uint32_t marker = width == 2 ? 0xFFFFu : 0xFFFFFFFFu;
  for (size_t i = 0; i < examples.size(); ++i) {
    const Example& ex = examples[i];
    std::vector<uint32_t> v = {marker, 0, static_cast<uint32_t>(i), ex.label,
                               static_cast<uint32_t>(ex.completions.size()), static_cast<uint32_t>(ex.context.size())};
    v.insert(v.end(), ex.context.begin(), ex.context.end());
    for (const auto& c : ex.completions) {
      v.push_back(static_cast<uint32_t>(c.size()));
      v.insert(v.end(), c.begin(), c.end());
    }
    v[1] = static_cast<uint32_t>(width * v.size());
    longest = std::max(longest, v[1]);
    stream.insert(stream.end(), v.begin(), v.end());
  }
  int32_t header[256] = {};
  header[0] = 20240522;
  header[1] = version;
  header[2] = static_cast<int32_t>(examples.size());
  header[3] = static_cast<int32_t>(longest);
  std::vector<unsigned char> bytes(reinterpret_cast<unsigned char*>(header), reinterpret_cast<unsigned char*>(header) + 1024);
  for (uint32_t value : stream)
    for (int b = 0; b < width; ++b) bytes.push_back(static_cast<unsigned char>((value >> (8 * b)) & 0xFF));
  return bytes;
}

struct TempFile {
  std::string path;
  explicit TempFile(const std::vector<unsigned char>& bytes) {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/test_hellaswag_XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    const int fd = mkstemp(buf.data());
    REQUIRE(fd >= 0);
    ::close(fd);
    path = buf.data();
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    REQUIRE(out.good());
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  ~TempFile() { std::remove(path.c_str()); }
};

std::vector<int> as_int(const std::vector<uint32_t>& v) { return std::vector<int>(v.begin(), v.end()); }

// Three examples of 2 to 4 completions; `offset` is added to every id.
std::vector<Example> examples_from(uint32_t offset) {
  std::vector<Example> ex = {{1, {5, 6, 7}, {{8}, {9, 10}}},
                             {3, {11}, {{12, 13}, {14}, {15, 16, 17}, {18}}},
                             {0, {19, 20}, {{21}, {22}, {23}}}};
  for (Example& e : ex) {
    for (uint32_t& t : e.context) t += offset;
    for (auto& c : e.completions)
      for (uint32_t& t : c) t += offset;
  }
  return ex;
}

void check_same(const ChoiceEvalSet& got, const std::vector<Example>& want) {
  REQUIRE(got.examples.size() == want.size());
  size_t completions = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    INFO("example " << i);
    CHECK(got.examples[i].label == static_cast<int>(want[i].label));
    CHECK(got.examples[i].context == as_int(want[i].context));
    REQUIRE(got.examples[i].completions.size() == want[i].completions.size());
    for (size_t k = 0; k < want[i].completions.size(); ++k) CHECK(got.examples[i].completions[k] == as_int(want[i].completions[k]));
    completions += want[i].completions.size();
  }
  CHECK(got.completions == completions);
}

}  // namespace

using Catch::Matchers::Contains;

TEST_CASE("eval file: version 1 (uint16) and version 2 (uint32) read to the same examples", "[hellaswag]") {
  const TempFile v1(eval_file(examples_from(0), 2, 1));
  const TempFile v2(eval_file(examples_from(0), 4, 2));
  check_same(read_choice_eval_file(v1.path, 300, 16), examples_from(0));
  // A version-2 file needs a vocabulary that uint16 cannot hold.
  check_same(read_choice_eval_file(v2.path, 128256, 16), examples_from(0));
  // Llama 3's ids, above 65535, kept whole.
  const TempFile wide(eval_file(examples_from(128000), 4, 2));
  check_same(read_choice_eval_file(wide.path, 128256, 16), examples_from(128000));
}

TEST_CASE("eval file: a file of one tokenizer's kind for a model of the other's vocabulary is refused", "[hellaswag]") {
  const TempFile v1(eval_file(examples_from(0), 2, 1));
  const TempFile v2(eval_file(examples_from(0), 4, 2));
  CHECK(error_of([&] { read_choice_eval_file(v1.path, 128256, 16); }) ==
        v1.path + ": a GPT-2 eval file (version 1, uint16 ids); the model has Llama 3's vocabulary (V=128256): "
                  "make it with data/hellaswag.sh --encoding llama3");
  CHECK(error_of([&] { read_choice_eval_file(v2.path, 50257, 16); }) ==
        v2.path + ": a Llama 3 eval file (version 2, uint32 ids); the model has GPT-2's vocabulary (V=50257): "
                  "make it with data/hellaswag.sh --encoding gpt2");
}

TEST_CASE("eval file: damaged version-2 files are refused by message", "[hellaswag]") {
  const std::vector<unsigned char> good = eval_file(examples_from(128000), 4, 2);
  const auto error_for = [&](const std::vector<unsigned char>& bytes) {
    const TempFile f(bytes);
    return error_of([&] { read_choice_eval_file(f.path, 128256, 16); });
  };
  SECTION("version 3") {
    std::vector<unsigned char> bad = good;
    bad[4] = 3;
    CHECK_THAT(error_for(bad), Contains("version 3, expected 1 (uint16 ids) or 2 (uint32 ids)"));
  }
  SECTION("a version-1 marker in a version-2 file") {
    std::vector<unsigned char> bad = good;
    bad[1024 + 2] = bad[1024 + 3] = 0;  // 0x0000FFFF
    CHECK_THAT(error_for(bad), Contains("example 0 (byte 1024): no start marker 4294967295"));
  }
  SECTION("a version-2 body under a version-1 header") {
    std::vector<unsigned char> bad = good;
    bad[4] = 1;
    const TempFile f(bad);
    CHECK_THAT(error_of([&] { read_choice_eval_file(f.path, 300, 16); }), Contains(f.path + ": example 0"));
  }
  SECTION("an id >= V") {
    std::vector<unsigned char> bad = good;
    const uint32_t id = 128256;
    std::memcpy(&bad[1024 + 6 * 4], &id, 4);  // the first context token
    CHECK_THAT(error_for(bad), Contains("token 128256 of its context") && Contains("vocabulary of 128256"));
  }
  SECTION("a context stated at 2^31 - 1 tokens: refused before it is allocated") {
    std::vector<unsigned char> bad = good;
    const uint32_t n = 0x7FFFFFFFu;
    std::memcpy(&bad[1024 + 5 * 4], &n, 4);
    CHECK_THAT(error_for(bad), Contains("its context of 2147483647 tokens lies beyond its stated byte length"));
  }
  SECTION("cut short") {
    std::vector<unsigned char> bad(good.begin(), good.end() - 4);
    CHECK_THAT(error_for(bad), Contains("truncated"));
  }
}
