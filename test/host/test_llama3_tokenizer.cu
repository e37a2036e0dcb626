// The byte-level BPE of src/tokenizer/ on a hand-built vocabulary whose ids are derived here by
// hand (whole-piece lookup, lowest rank first, leftmost on ties, both merge paths, special text
// as ordinary text, safe cuts), the Llama 3 loader's errors, and Meta's Llama 3 vocabulary:
// "This is a test sentence." with BOS/EOS, ids from tiktoken (npm, WebAssembly) with Meta's ranks
// and pattern, the special tokens, and decode(encode(x)) == x.
// Meta's tokenizer.model is fetched by scripts/install_deps.sh, never committed: where it is
// absent (a bare GPU machine) the cases that need it say so and pass; test/checks/
// tokenizer_llama3.sh fails in that case on the CPU build, unless install_deps.sh could not fetch it.
#include "src/tokenizer/llama3_bpe.h"

#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using Ids = std::vector<uint32_t>;

// Every byte is its own id (0..255); then, with ranks unrelated to the ids:
//   256 "aa" rank 7, 257 "aaaa" rank 8, 258 "ab" rank 10, 259 "bc" rank 5, 260 "cd" rank 1,
//   261 "xyz" rank 3 (no merge builds it: only the whole-piece lookup finds it);
//   262 "<|s|>" special. Pattern: runs of letters, of digits, of anything else.
BpeVocabulary hand_vocabulary() {
  BpeVocabulary vocabulary;
  vocabulary.name = "hand-built";
  vocabulary.source = "hand-built vocabulary";
  for (int b = 0; b < 256; ++b) vocabulary.token_bytes.push_back(std::string(1, static_cast<char>(b)));
  std::vector<std::pair<std::string, uint32_t>> merged = {{"aa", 7}, {"aaaa", 8}, {"ab", 10},
                                                          {"bc", 5},  {"cd", 1},   {"xyz", 3}};
  vocabulary.rank.assign(256, ByteBpe::kNone);
  for (const auto& [bytes, rank] : merged) {
    vocabulary.token_bytes.push_back(bytes);
    vocabulary.rank.push_back(rank);
  }
  vocabulary.ordinary = static_cast<uint32_t>(vocabulary.token_bytes.size());
  vocabulary.token_bytes.push_back("<|s|>");
  vocabulary.pattern = R"(\p{L}+|\p{N}+|[^\p{L}\p{N}]+)";
  vocabulary.cut_before = " ";
  return vocabulary;
}

Ids encode(const ByteBpe& bpe, const std::string& text) {
  Ids ids;
  PieceEncoder(bpe).encode(text, ids);
  return ids;
}

std::string decode(const ByteBpe& bpe, const Ids& ids) {
  std::string text;
  for (uint32_t id : ids) text += bpe.token_bytes().at(id);
  return text;
}

std::string error_of(const std::string& vocab_dir) {
  try {
    Llama3Bpe bpe(vocab_dir);
  } catch (const std::runtime_error& error) {
    return error.what();
  }
  return "";
}

const std::string kVocabDir = "data/llama3_bpe";

bool have_meta_vocabulary() {
  if (std::ifstream(kVocabDir + "/tokenizer.model")) return true;
  WARN("not checked: " << kVocabDir << "/tokenizer.model is missing (scripts/install_deps.sh fetches it)");
  return false;
}

}  // namespace

TEST_CASE("byte-level BPE: whole pieces, lowest rank first, leftmost on ties", "[bpe]") {
  ByteBpe bpe(hand_vocabulary());
  CHECK(encode(bpe, "xyz") == Ids{261});             // a token as a whole, unreachable by merges
  CHECK(encode(bpe, "abc") == Ids{'a', 259});        // bc (5) before ab (10)
  CHECK(encode(bpe, "abcd") == Ids{258, 260});       // cd (1), then ab (10); bc never forms
  CHECK(encode(bpe, "aaa") == Ids{256, 'a'});        // the leftmost of two equal-rank pairs
  CHECK(encode(bpe, "aaaaa") == Ids{257, 'a'});      // aa aa a -> aaaa a
  CHECK(encode(bpe, "ab12cd") == Ids{258, '1', '2', 260});  // no merge across the pattern's pieces
  CHECK(encode(bpe, "").empty());
}

TEST_CASE("byte-level BPE: short and long pieces merge alike", "[bpe]") {
  ByteBpe bpe(hand_vocabulary());
  // 32 bytes and less are cached, up to 128 merged by rescanning, longer ones with a heap.
  for (size_t n : {2, 3, 31, 32, 33, 100, 128, 129, 130, 301, 1000}) {
    Ids expected(n / 4, 257);
    if (n % 4 >= 2) expected.push_back(256);
    if (n % 2 == 1) expected.push_back('a');
    CAPTURE(n);
    CHECK(encode(bpe, std::string(n, 'a')) == expected);
    CHECK(encode(bpe, std::string(n, 'a')) == expected);  // again, from the cache where cached
  }
}

TEST_CASE("byte-level BPE: special tokens' text is ordinary text; any bytes round-trip", "[bpe]") {
  ByteBpe bpe(hand_vocabulary());
  CHECK(encode(bpe, "<|s|>") == Ids{'<', '|', 's', '|', '>'});
  const char raw[] = "ab\xff\xfe" "cd\xe2\x80 xyz\xc0\xaf\x00!";  // invalid UTF-8, a NUL
  const std::string text(raw, sizeof raw - 1);
  CHECK(decode(bpe, encode(bpe, text)) == text);
}

TEST_CASE("byte-level BPE: last_safe_cut finds an ASCII graphic byte before a cut byte", "[bpe]") {
  ByteBpe bpe(hand_vocabulary());  // cut_before " "
  CHECK(bpe.last_safe_cut("ab cd ef", 0) == 5);
  CHECK(bpe.last_safe_cut("ab cd ef", 6) == 0);   // none at or after 6
  CHECK(bpe.last_safe_cut("ab  cd\n", 0) == 2);   // not inside a run of spaces, not before \n
  CHECK(bpe.last_safe_cut("\xc3\xa9 x", 0) == 0);  // never after a non-ASCII byte
  CHECK(bpe.last_safe_cut(" abc", 0) == 0);
}

TEST_CASE("Llama 3: a missing or altered tokenizer.model names the file and the install step", "[llama3]") {
  CHECK(error_of("/nonexistent/llama3") ==
        "cannot read /nonexistent/llama3/tokenizer.model: No such file or directory "
        "(scripts/install_deps.sh fetches Llama 3's tokenizer.model)");
  char dir_template[] = "/tmp/test_llama3_tokenizer_XXXXXX";
  REQUIRE(mkdtemp(dir_template) != nullptr);
  const std::string dir = dir_template;
  std::ofstream(dir + "/tokenizer.model") << "IQ== 0\n";
  const std::string error = error_of(dir);
  std::remove((dir + "/tokenizer.model").c_str());
  rmdir(dir.c_str());
  CHECK(error.rfind(dir + "/tokenizer.model has sha256 ", 0) == 0);
  CHECK(error.find(std::string("expected ") + kLlama3TokenizerModelSha256) != std::string::npos);
  CHECK(error.find("scripts/install_deps.sh") != std::string::npos);
}

TEST_CASE("Llama 3: Meta's ids, BOS and EOS, special tokens, round trips", "[llama3]") {
  if (!have_meta_vocabulary()) return;
  Llama3Bpe bpe(kVocabDir);
  REQUIRE(bpe.token_bytes().size() == size_t(kLlama3VocabSize));

  Ids sentence = {kLlama3BeginOfText};
  for (uint32_t id : encode(bpe, "This is a test sentence.")) sentence.push_back(id);
  sentence.push_back(kLlama3EndOfText);
  CHECK(sentence == Ids{128000, 2028, 374, 264, 1296, 11914, 13, 128001});

  // tiktoken's ids (npm tiktoken 1.0.22 with Meta's ranks and pattern): contractions fold ASCII
  // case, digits go in threes, punctuation keeps the newlines after it.
  CHECK(encode(bpe, "DON'T") == Ids{85741, 17773});
  CHECK(encode(bpe, "the LORD'S") == Ids{1820, 58477, 13575});
  CHECK(encode(bpe, "x'RE") == Ids{87, 95253});
  CHECK(encode(bpe, "x'Tea") == Ids{87, 17773, 12791});

  CHECK(bpe.token_bytes()[kLlama3BeginOfText] == "<|begin_of_text|>");
  CHECK(bpe.token_bytes()[kLlama3EndOfText] == "<|end_of_text|>");
  CHECK(bpe.token_bytes()[kLlama3EndOfTurn] == "<|eot_id|>");
  CHECK(bpe.token_bytes()[128006] == "<|start_header_id|>");
  CHECK(bpe.token_bytes()[128255] == "<|reserved_special_token_250|>");
  for (const char* special : {"<|begin_of_text|>", "<|eot_id|>", "<|end_of_text|>"}) {
    CAPTURE(special);
    for (uint32_t id : encode(bpe, special)) CHECK(id < kLlama3Ranked);  // text, never the special id
    CHECK(decode(bpe, encode(bpe, special)) == special);
  }

  const std::string text = "Größe 日本語 🎉 x\u0085\u2028 1234567\r\n\r\n\tend.\n\xff\xc0\xaf\xe2\x80 ok";
  CHECK(decode(bpe, encode(bpe, text)) == text);
}
