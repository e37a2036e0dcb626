// Tests for src/config/config.h (flags, JSON config), src/config/config_text.h (--help), src/config/config_warnings.h and src/config/lr_schedule.h.
#include "test/test_util.h"

#include "src/config/config.h"
#include "src/config/config_checks.h"
#include "src/config/config_text.h"
#include "src/config/config_warnings.h"
#include "src/config/lr_schedule.h"

#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <string>
#include <unistd.h>
#include <variant>
#include <vector>

namespace {

ParsedArgs parse(std::initializer_list<const char*> flags) {
  std::vector<const char*> argv = {"train_gpt"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  return parse_args(static_cast<int>(argv.size()), argv.data());
}

// The message of the invalid_argument that parsing `flags` throws ("" if it does not throw).
std::string parse_error(std::initializer_list<const char*> flags) {
  try {
    parse(flags);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

// The message of the invalid_argument that validating the parsed `flags` for one rank throws
// ("" if it does not throw).
std::string validation_error(std::initializer_list<const char*> flags) {
  TrainConfig cfg = parse(flags).config;
  try {
    validate_config(cfg, 1);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

// A JSON file in a fresh temporary directory, removed at scope exit.
struct TempJson {
  std::string dir, path;
  explicit TempJson(const std::string& text) {
    char tmpl[] = "/tmp/test_config_XXXXXX";
    REQUIRE(mkdtemp(tmpl) != nullptr);
    dir = tmpl;
    path = dir + "/run.json";
    std::ofstream(path) << text;
  }
  ~TempJson() {
    std::remove(path.c_str());
    rmdir(dir.c_str());
  }
};

std::string json_error(const std::string& text) {
  TempJson file(text);
  try {
    parse({"--config", file.path.c_str()});
  } catch (const std::invalid_argument& e) {
    std::string msg = e.what();
    CHECK(msg.find(file.path) != std::string::npos);  // every config-file error names the file
    return msg;
  }
  return "";
}

bool contains(const std::string& haystack, const std::string& needle) { return haystack.find(needle) != std::string::npos; }

}  // namespace

TEST_CASE("no flags give the documented defaults") {
  ParsedArgs a = parse({});
  CHECK_FALSE(a.help);
  const TrainConfig& c = a.config;
  CHECK(c.train_data == "data/default/*_train_*.bin");
  CHECK(c.val_data == "data/default/*_val_*.bin");
  CHECK(c.model == "d12");
  CHECK(c.dtype == "bf16");
  CHECK(c.init_from.empty());
  CHECK(c.beta1 == 0.9);
  CHECK(c.beta2 == 0.95);
  CHECK(c.adam_eps == 1e-8);
  CHECK(c.grad_clip == 1.0);
  CHECK(c.weight_decay == 0.0);
  CHECK(c.total_batch_tokens == 0);
  CHECK(c.explicitly_set.empty());
}

TEST_CASE("both flag syntaxes") {
  TrainConfig c = parse({"--lr", "1e-3", "--batch-size=16", "--shuffle", "0", "--dtype=fp32"}).config;
  CHECK(c.lr == 1e-3);
  CHECK(c.batch_size == 16);
  CHECK_FALSE(c.shuffle);
  CHECK(c.dtype == "fp32");
  CHECK(c.was_set("lr"));
  CHECK(c.was_set("batch-size"));
  CHECK_FALSE(c.was_set("seq-len"));
  // a value may itself start with dashes only in the --flag=value form
  CHECK(parse({"--out-dir=--weird"}).config.out_dir == "--weird");
  CHECK(parse({"--help"}).help);
  CHECK(parse({"--lr", "1", "-h"}).help);
}

TEST_CASE("a flag given twice is an error naming it and both values, in either syntax") {
  CHECK(parse_error({"--lr", "3e-4", "--batch-size", "2", "--lr", "1e-3"}) ==
        "--lr is given twice ('3e-4', then '1e-3'): give each flag once");
  CHECK(contains(parse_error({"--lr=1", "--lr", "1"}), "--lr is given twice"));
  CHECK(contains(parse_error({"--config", "a.json", "--config=b.json"}), "--config is given twice ('a.json', then 'b.json')"));
}

TEST_CASE("every flag of the table parses its own default text back") {
  const TrainConfig defaults;
  for (const Flag& f : flag_table()) {
    if (f.command_line_only) continue;
    std::string value = config_detail::value_text(defaults, f);
    const bool list = std::holds_alternative<std::vector<int> TrainConfig::*>(f.field);
    if (value.empty()) value = list ? "1,1" : f.choices.empty() ? "x.bin" : f.choices.front();  // no default value
    std::string arg = std::string("--") + f.name + "=" + value;
    INFO(arg);
    TrainConfig c = parse({arg.c_str()}).config;
    CHECK(config_detail::value_text(c, f) == value);
    CHECK(c.was_set(f.name));
  }
}

TEST_CASE("bad command-line values name the flag and the expectation") {
  struct Case { std::vector<const char*> args; std::vector<std::string> words; };
  const std::vector<Case> cases = {
      {{"--bogus", "1"}, {"unknown flag", "--bogus"}},
      {{"--lr"}, {"--lr", "missing value"}},
      {{"--lr", "abc"}, {"--lr", "expected a number", "'abc'"}},
      {{"--lr", "1e-3x"}, {"--lr", "'1e-3x'"}},
      {{"--lr", "nan"}, {"--lr", "expected a number"}},
      {{"--lr", "-1"}, {"--lr", ">= 0"}},
      {{"--lr", "1e39"}, {"--lr", ">= 0 that fits an fp32 (at most 3.402823466e+38)", "'1e39'"}},
      {{"--weight-decay", "4e38"}, {"--weight-decay", "fits an fp32"}},
      {{"--adam-eps", "1e300"}, {"--adam-eps", "> 0 that fits an fp32"}},
      {{"--grad-clip", "1e39"}, {"--grad-clip", "fits an fp32"}},
      {{"--temperature", "1e39"}, {"--temperature", "fits an fp32"}},
      {{"--batch-size", "0"}, {"--batch-size", "an integer in [1, 2147483647]"}},
      {{"--batch-size", "2.5"}, {"--batch-size", "an integer"}},
      {{"--batch-size", "99999999999"}, {"--batch-size", "2147483647"}},
      {{"--seq-len", ""}, {"--seq-len", "an integer"}},
      {{"--max-steps", "-1"}, {"--max-steps", "an integer in [0, 2147483647]"}},
      {{"--save-dtype", "fp16"}, {"--save-dtype", "bf16 fp32", "'fp16'"}},
      {{"--save-dtype", ""}, {"--save-dtype", "bf16 fp32"}},
      {{"--val-steps", "0"}, {"--val-steps"}},
      {{"--warmup-steps", "-5"}, {"--warmup-steps"}},
      {{"--beta1", "1"}, {"--beta1", "[0, 1)"}},
      {{"--beta2", "-0.1"}, {"--beta2", "[0, 1)"}},
      {{"--adam-eps", "0"}, {"--adam-eps", "> 0"}},
      {{"--final-lr-frac", "1.5"}, {"--final-lr-frac", "[0, 1]"}},
      {{"--grad-clip", "-1"}, {"--grad-clip"}},
      {{"--weight-decay", "-0.1"}, {"--weight-decay"}},
      {{"--dtype", "fp16"}, {"--dtype", "bf16 fp32", "'fp16'"}},
      {{"--lr-schedule", "step"}, {"--lr-schedule", "cosine linear constant wsd"}},
      {{"--shuffle", "2"}, {"--shuffle", "0 or 1"}},
      {{"--shuffle", "yes"}, {"--shuffle", "0 or 1"}},
      {{"--seed", "-1"}, {"--seed"}},
      {{"--out-dir", ""}, {"--out-dir", "non-empty"}},
      {{"lr", "1"}, {"unexpected argument 'lr'"}},
  };
  for (const Case& c : cases) {
    std::vector<const char*> argv = {"train_gpt"};
    argv.insert(argv.end(), c.args.begin(), c.args.end());
    std::string msg;
    try {
      parse_args(static_cast<int>(argv.size()), argv.data());
    } catch (const std::invalid_argument& e) {
      msg = e.what();
    }
    INFO("args: " << c.args[0] << (c.args.size() > 1 ? std::string(" ") + c.args[1] : std::string()) << " -> " << msg);
    REQUIRE_FALSE(msg.empty());
    for (const std::string& w : c.words) CHECK(contains(msg, w));
  }
}

TEST_CASE("JSON config sets flags; the command line overrides it") {
  TempJson file(R"({"lr": 0.002, "batch-size": 4, "shuffle": false, "lr-schedule": "wsd", "out-dir": "runs/a",
                    "seq-len": 64, "grad-clip": 0})");
  TrainConfig c = parse({"--config", file.path.c_str(), "--batch-size", "2"}).config;
  CHECK(c.lr == 0.002);
  CHECK(c.batch_size == 2);
  CHECK_FALSE(c.shuffle);
  CHECK(c.lr_schedule == "wsd");
  CHECK(c.out_dir == "runs/a");
  CHECK(c.seq_len == 64);
  CHECK(c.grad_clip == 0.0);
  CHECK(c.config_file == file.path);
  // the flag wins even when --config comes after it
  CHECK(parse({"--lr=0.5", "--config", file.path.c_str()}).config.lr == 0.5);
  // integers are fine where a number is expected, 0/1 where a switch is
  TempJson ints(R"({"lr": 1, "shuffle": 1})");
  TrainConfig d = parse({"--config", ints.path.c_str()}).config;
  CHECK(d.lr == 1.0);
  CHECK(d.shuffle);
}

TEST_CASE("bad JSON config files name the file, the key and the expectation") {
  CHECK(contains(json_error(R"({"lr": "abc"})"), "key \"lr\": expected a number"));
  CHECK(contains(json_error(R"({"batch-size": 2.5})"), "key \"batch-size\": expected an integer"));
  CHECK(contains(json_error(R"({"batch-size": "4"})"), "key \"batch-size\""));
  CHECK(contains(json_error(R"({"shuffle": "yes"})"), "key \"shuffle\": expected 0 or 1"));
  CHECK(contains(json_error(R"({"dtype": "fp8"})"), "key \"dtype\": expected one of: bf16 fp32"));
  CHECK(contains(json_error(R"({"model": 12})"), "key \"model\""));
  CHECK(contains(json_error(R"({"beta2": 1.0})"), "key \"beta2\""));
  CHECK(contains(json_error(R"({"max-steps": 18446744073709551615})"), "key \"max-steps\""));
  CHECK(contains(json_error(R"({"learning-rate": 0.1})"), "unknown key \"learning-rate\""));
  CHECK(contains(json_error(R"({"config": "other.json"})"), "unknown key \"config\""));
  CHECK(contains(json_error(R"([1, 2])"), "expected a JSON object"));
  CHECK(contains(json_error(R"({"lr": 0.1,})"), "not valid JSON"));
  std::string missing = parse_error({"--config", "/nonexistent/run.json"});
  CHECK(contains(missing, "/nonexistent/run.json"));
  CHECK(contains(missing, "cannot open"));
  TempJson file("{}");
  CHECK(parse_error({"--config", file.dir.c_str()}) == "--config " + file.dir + ": is a directory, expected a JSON file");
  // Only a regular file of at most 1 MiB: a device never ends, a named pipe blocks.
  CHECK(parse_error({"--config", "/dev/null"}) == "--config /dev/null: is not a regular file, expected a JSON file");
  const std::string fifo = file.dir + "/pipe.json";
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  CHECK(parse_error({"--config", fifo.c_str()}) == "--config " + fifo + ": is a named pipe, expected a JSON file");
  std::remove(fifo.c_str());
  TempJson big("{\"lr\": 0.1}" + std::string(kMaxConfigBytes, ' '));
  CHECK(contains(parse_error({"--config", big.path.c_str()}), "bytes, more than the 1048576 a file of flag values may have"));
  TempJson at_limit("{\"lr\": 0.1}" + std::string(kMaxConfigBytes - 11, ' '));
  CHECK(parse({"--config", at_limit.path.c_str()}).config.lr == 0.1);
}

TEST_CASE("a NUL character in a string value is refused") {
  CHECK(contains(json_error(R"({"prompt": "one\u0000two"})"), "key \"prompt\": contains a NUL character (\\u0000 at offset 3)"));
  CHECK(contains(json_error(R"({"out-dir": "runs/a\u0000b"})"), "contains a NUL character"));
}

TEST_CASE("a JSON key given twice is an error naming it, however it is spelled") {
  CHECK(contains(json_error(R"({"lr": 0.1, "batch-size": 2, "lr": 0.2})"),
                 "key \"lr\" appears more than once (give each key once)"));
  CHECK(contains(json_error(R"({"lr": 0.1, "l\u0072": 0.2})"), "key \"lr\" appears more than once"));
  // the same key in the file and on the command line is the documented override, not a repeat
  TempJson file(R"({"lr": 0.1})");
  CHECK(parse({"--config", file.path.c_str(), "--lr", "0.2"}).config.lr == 0.2);
}

TEST_CASE("cross-flag checks: gradient accumulation and --init-from vs --model") {
  TrainConfig c = parse({"--batch-size", "4", "--seq-len", "64"}).config;
  CHECK(validate_config(c, 1) == 1);
  CHECK(c.total_batch_tokens == 256);

  c = parse({"--batch-size", "4", "--seq-len", "64", "--total-batch-tokens", "1024"}).config;
  CHECK(validate_config(c, 1) == 4);
  c = parse({"--batch-size", "4", "--seq-len", "64", "--total-batch-tokens", "1024"}).config;
  CHECK(validate_config(c, 2) == 2);

  c = parse({"--batch-size", "4", "--seq-len", "64", "--total-batch-tokens", "1000"}).config;
  try {
    validate_config(c, 1);
    FAIL("indivisible total batch accepted");
  } catch (const std::invalid_argument& e) {
    CHECK(contains(e.what(), "--total-batch-tokens 1000"));
    CHECK(contains(e.what(), "4 x 64 x 1 = 256"));
  }
  c = parse({"--batch-size", "4", "--seq-len", "64", "--total-batch-tokens", "256"}).config;
  CHECK_THROWS_WITH(validate_config(c, 2), Catch::Contains("4 x 64 x 2 = 512"));

  c = parse({"--init-from", "m.bin", "--model", "d12"}).config;
  CHECK_THROWS_WITH(validate_config(c, 1), Catch::Contains("--init-from and --model"));
  TempJson file(R"({"model": "nano"})");
  c = parse({"--config", file.path.c_str(), "--init-from", "m.bin"}).config;
  CHECK_THROWS_WITH(validate_config(c, 1), Catch::Contains("--init-from and --model"));
  c = parse({"--init-from", "m.bin"}).config;
  CHECK_NOTHROW(validate_config(c, 1));

  c = parse({"--seq-len", "128"}).config;
  CHECK_NOTHROW(validate_against_model(c, 128, "m.bin"));
  CHECK_THROWS_WITH(validate_against_model(c, 64, "m.bin"), Catch::Contains("--seq-len 128") && Catch::Contains("64") &&
                                                                Catch::Contains("m.bin"));
}

TEST_CASE("--fp8: every product's width per TP rank and the rank's rows multiples of 16") {
  const ModelConfig tiny{64, 500, 512, 2, 4, 64};  // C 64, qkv 192, hidden 256
  TrainConfig c = parse({"--fp8", "1", "--batch-size", "2", "--seq-len", "32"}).config;
  CHECK_NOTHROW(validate_fp8_shapes(c, tiny, "m.bin"));
  c.tp = 4;  // 16, 48 and 64 per rank
  CHECK_NOTHROW(validate_fp8_shapes(c, tiny, "m.bin"));
  c.tp = 2;
  const ModelConfig narrow{64, 500, 512, 2, 5, 40};  // C 40
  CHECK_THROWS_WITH(validate_fp8_shapes(c, narrow, "m.bin"), Catch::Contains("--fp8: the width C of m.bin is 40"));
  const ModelConfig odd_hidden = llama3_config(64, 128, 2, 2, 1, 32, 72, llama32_rope(), false);  // 72 / 2 = 36
  CHECK_THROWS_WITH(validate_fp8_shapes(c, odd_hidden, "m.bin"), Catch::Contains("MLP hidden width per --tp rank") &&
                                                                     Catch::Contains("is 36"));
  c.tp = 1;
  c.cp = 4;  // 64 rows over 4: 16
  CHECK_NOTHROW(validate_fp8_shapes(c, tiny, "m.bin"));
  c.cp = 8;
  CHECK_THROWS_WITH(validate_fp8_shapes(c, tiny, "m.bin"), Catch::Contains("B*T/--cp") && Catch::Contains("is 8"));
  c.fp8 = false;
  CHECK_NOTHROW(validate_fp8_shapes(c, narrow, "m.bin"));
}

TEST_CASE("pipeline flags: --pp-layers lists, and the cross-flag checks of --pp") {
  CHECK(parse({"--pp-layers", "5,4,3"}).config.pp_layers == std::vector<int>{5, 4, 3});
  CHECK(parse({"--pp-layers=7"}).config.pp_layers == std::vector<int>{7});
  CHECK(parse({}).config.pp_layers.empty());
  for (const char* bad : {"", "4,", ",4", "4,,4", "4,0", "4,-1", "4, 4", "a", "4;4", "99999999999"})
    CHECK(parse_error({"--pp-layers", bad}) ==
          "--pp-layers: expected a comma-separated list of integers >= 1, got '" + std::string(bad) + "'");
  // --pp-recompute: one setting (0..3) per stage, bounds named.
  CHECK(parse({"--pp-recompute", "3,1,0"}).config.pp_recompute == std::vector<int>{3, 1, 0});
  CHECK(parse_error({"--pp-recompute", "1,4"}) == "--pp-recompute: expected a comma-separated list of integers from 0 to 3, got '1,4'");
  TempJson list(R"({"pp-layers": [6, 6], "pp": 2, "pp-schedule": "interleaved", "pp-virtual": 3})");
  TrainConfig c = parse({"--config", list.path.c_str()}).config;
  CHECK(c.pp_layers == std::vector<int>{6, 6});
  CHECK(c.pp == 2);
  CHECK(c.pp_schedule == "interleaved");
  CHECK(c.pp_virtual == 3);
  CHECK(config_json(c)["pp-layers"] == "6,6");
  CHECK(contains(json_error(R"({"pp-layers": "6,6"})"), "key \"pp-layers\": expected a comma-separated list"));
  CHECK(contains(json_error(R"({"pp-layers": [6, 6.5]})"), "key \"pp-layers\": expected a comma-separated list"));
  CHECK(contains(json_error(R"({"pp-layers": []})"), "key \"pp-layers\""));
  CHECK(contains(parse_error({"--pp", "0"}), "--pp: expected an integer in [1, 65536], got '0'"));
  CHECK(contains(parse_error({"--pp-virtual", "0"}), "--pp-virtual: expected an integer in [1, 65536], got '0'"));
  CHECK(parse_error({"--pp-schedule", "zb"}) == "--pp-schedule: expected one of: gpipe 1f1b interleaved zb-h1, got 'zb'");

  // m = --total-batch-tokens / (B·T·data-parallel ranks), the data-parallel ranks being W/(tp·pp).
  c = parse({"--batch-size", "4", "--seq-len", "64", "--total-batch-tokens", "1024", "--pp", "2", "--tp", "2"}).config;
  CHECK(validate_config(c, 8) == 2);  // 2 data-parallel ranks
}

TEST_CASE("pipeline flags: each bad combination is one line naming the flags") {
  auto error = [](std::initializer_list<const char*> flags, int world) {
    TrainConfig cfg = parse(flags).config;
    try {
      validate_config(cfg, world);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK(error({"--pp", "3", "--total-batch-tokens", "24576"}, 4) ==
        "--tp 1 x --pp 3 = 3 must divide the number of ranks, 4");
  CHECK(error({"--tp", "2", "--pp", "2", "--plan", "--world-size", "6"}, 6) ==
        "--tp 2 x --pp 2 = 4 must divide the number of ranks, 6 (--world-size)");
  CHECK(error({"--tp", "3"}, 4) == "--tp 3 must divide the number of ranks, 4");
  CHECK(error({"--tp", "65536", "--pp", "65536"}, 1) ==
        "--tp 65536 x --pp 65536 = 4294967296 must divide the number of ranks, 1");  // no int overflow
  CHECK(error({"--pp-virtual", "2"}, 1) == "--pp-virtual 2 chunks per rank need --pp-schedule interleaved (not 1f1b)");
  CHECK(error({"--pp-virtual", "2", "--pp-schedule", "zb-h1"}, 1) ==
        "--pp-virtual 2 chunks per rank need --pp-schedule interleaved (not zb-h1)");
  CHECK(error({"--pp", "2", "--zero", "2", "--total-batch-tokens", "16384"}, 4) ==
        "--zero 2 with --pp 2: the pipeline accumulates every micro-batch's weight gradients until the schedule's "
        "last backward; use --zero 0 or 1");
  CHECK(contains(error({"--pp", "2", "--zero", "3", "--total-batch-tokens", "16384"}, 4), "--zero 3 with --pp 2"));
  CHECK(error({"--pp", "4", "--batch-size", "2", "--seq-len", "8", "--total-batch-tokens", "64"}, 8) ==
        "--pp 4 needs at least 4 micro-batches per optimizer step (m >= --pp), got m = --total-batch-tokens 64 / "
        "(--batch-size x --seq-len x data-parallel ranks = 2 x 8 x 2) = 2");
  CHECK(contains(error({"--pp", "2"}, 2), "got m = --total-batch-tokens 8192 / (--batch-size x --seq-len x "
                                          "data-parallel ranks = 8 x 1024 x 1) = 1"));  // no accumulation asked
  // Within the rules: m = p, v > 1 with interleaved, ZeRO 1.
  CHECK(error({"--pp", "4", "--batch-size", "2", "--seq-len", "8", "--total-batch-tokens", "64"}, 4) == "no error");
  CHECK(error({"--pp", "2", "--pp-schedule", "interleaved", "--pp-virtual", "2", "--zero", "1", "--batch-size", "2",
               "--seq-len", "8", "--total-batch-tokens", "64"}, 4) == "no error");
}

TEST_CASE("start-up warnings: warm-up as long as the run, repeated validation batches, long accumulation") {
  TrainConfig c = parse({"--max-steps", "20", "--batch-size", "2", "--seq-len", "32", "--val-steps", "11"}).config;
  CHECK(config_warnings(c, 65, 10) ==
        std::vector<std::string>{
            "--warmup-steps 100 >= --max-steps 20: the whole run is warm-up (the learning rate rises every step and "
            "never decays)",
            "--total-batch-tokens 0 means 65 accumulation steps of batch-size x seq-len x ranks per optimizer step "
            "(more than 64; a larger --batch-size takes fewer)",
            "--val-steps 11 > the 10 distinct batches of 2 x 32 tokens per rank in --val-data: each validation repeats "
            "batches"});
  // at the limits: no warning
  CHECK(config_warnings(c, 64, 11).size() == 1);
  c = parse({"--max-steps", "101", "--val-steps", "11"}).config;
  CHECK(config_warnings(c, 64, 11).empty());
  CHECK(config_warnings(c, 1, 0).empty());  // no validation data: nothing to repeat
  // evaluation only trains nothing: only the validation warning applies
  c = parse({"--max-steps", "0", "--val-steps", "11"}).config;
  CHECK(config_warnings(c, 100, 10).size() == 1);
}

TEST_CASE("--help lists every flag with its default") {
  std::string help = help_text("train_gpt");
  for (const Flag& f : flag_table()) {
    INFO(f.name);
    CHECK(contains(help, std::string("--") + f.name + " "));
  }
  CHECK(contains(help, "--help"));
  CHECK(contains(help, "default: data/default/*_train_*.bin"));
  CHECK(contains(help, "default: 0.95"));
  CHECK(contains(help, "default: 1e-08"));
  CHECK(contains(help, "default: B*T*ranks"));
  // one "default:" per flag
  size_t defaults = 0;
  for (size_t at = help.find("default:"); at != std::string::npos; at = help.find("default:", at + 1)) ++defaults;
  CHECK(defaults == flag_table().size());
  std::string summary = config_summary(parse({"--lr", "0.01"}).config);
  CHECK(contains(summary, "lr                  0.01\n"));
  CHECK(contains(summary, "beta1               0.9  (default)"));
}

TEST_CASE("learning-rate schedules follow the documented formulas") {
  LrSchedule s;
  s.peak_lr = 1.0;
  s.warmup_steps = 10;
  s.total_steps = 110;
  s.final_lr_frac = 0.1;
  const double tol = 1e-12;

  SECTION("warmup is linear from lr/W to lr, the same for every kind") {
    for (LrScheduleKind kind : {LrScheduleKind::cosine, LrScheduleKind::linear, LrScheduleKind::constant,
                                LrScheduleKind::wsd}) {
      s.kind = kind;
      CHECK(s.at(1) == Approx(0.1).margin(tol));
      CHECK(s.at(5) == Approx(0.5).margin(tol));
      CHECK(s.at(10) == Approx(1.0).margin(tol));
    }
  }
  SECTION("cosine") {
    s.kind = LrScheduleKind::cosine;
    CHECK(s.at(60) == Approx(0.55).margin(tol));  // halfway: (1 + 0.1) / 2
    CHECK(s.at(110) == Approx(0.1).margin(tol));
    CHECK(s.at(35) == Approx(0.1 + 0.9 * 0.5 * (1 + std::cos(kPi * 0.25))).margin(tol));
    for (long long k = 11; k <= 110; ++k) CHECK(s.at(k) < s.at(k - 1));
  }
  SECTION("linear") {
    s.kind = LrScheduleKind::linear;
    CHECK(s.at(60) == Approx(0.55).margin(tol));
    CHECK(s.at(35) == Approx(1.0 - 0.9 * 0.25).margin(tol));
    CHECK(s.at(110) == Approx(0.1).margin(tol));
  }
  SECTION("constant") {
    s.kind = LrScheduleKind::constant;
    CHECK(s.at(11) == 1.0);
    CHECK(s.at(110) == 1.0);
  }
  SECTION("wsd decays linearly over the last 20% of the steps") {
    s.kind = LrScheduleKind::wsd;
    // N = 110: D = 22, decay starts after step S = 88
    CHECK(s.at(11) == 1.0);
    CHECK(s.at(88) == 1.0);
    CHECK(s.at(89) == Approx(1.0 - 0.9 / 22).margin(tol));
    CHECK(s.at(99) == Approx(1.0 - 0.9 * 11 / 22).margin(tol));
    CHECK(s.at(110) == Approx(0.1).margin(tol));
  }
  SECTION("wsd whose warmup reaches into the last 20% decays from the end of the warmup") {
    s.kind = LrScheduleKind::wsd;
    s.warmup_steps = 17;
    s.total_steps = 20;
    // D = 4 would start the decay after step 16, inside the warmup: S = max(17, 16) = 17, so
    // the warmup reaches the peak at step 17 and the decay spans the remaining 3 steps.
    CHECK(s.at(16) == Approx(16.0 / 17).margin(tol));
    CHECK(s.at(17) == 1.0);
    CHECK(s.at(18) == Approx(1.0 - 0.9 / 3).margin(tol));
    CHECK(s.at(19) == Approx(1.0 - 0.9 * 2 / 3).margin(tol));
    CHECK(s.at(20) == Approx(0.1).margin(tol));
  }
  SECTION("no warmup: step 1 is already past the peak") {
    s.warmup_steps = 0;
    s.total_steps = 4;
    s.final_lr_frac = 0.0;
    s.kind = LrScheduleKind::linear;
    CHECK(s.at(1) == Approx(0.75).margin(tol));
    CHECK(s.at(4) == Approx(0.0).margin(tol));
    s.kind = LrScheduleKind::constant;
    CHECK(s.at(1) == 1.0);
    s.kind = LrScheduleKind::wsd;  // D = 0: no decay phase for 4 steps
    CHECK(s.at(4) == 1.0);
  }
  SECTION("warmup longer than the run") {
    s.warmup_steps = 200;
    s.kind = LrScheduleKind::cosine;
    CHECK(s.at(110) == Approx(110.0 / 200).margin(tol));
  }
  SECTION("steps outside the run are refused") {
    CHECK_THROWS_AS(s.at(0), std::out_of_range);
    CHECK_THROWS_AS(s.at(111), std::out_of_range);
  }
  SECTION("the config builds the schedule") {
    TrainConfig c = parse({"--lr", "0.5", "--lr-schedule", "linear", "--warmup-steps", "0", "--max-steps", "2",
                           "--final-lr-frac", "0"}).config;
    LrSchedule m = make_lr_schedule(c);
    CHECK(m.at(1) == Approx(0.25).margin(tol));
    CHECK(m.at(2) == Approx(0.0).margin(tol));
    CHECK_THROWS_AS(parse_lr_schedule("cosine2"), std::invalid_argument);
  }
}

TEST_CASE("a 0|1 flag without a value means 1; the eval flags' cross-checks") {
  CHECK(parse({"--eval"}).config.eval);
  CHECK(parse({"--eval", "--eval-data", "x.bin"}).config.eval);
  CHECK_FALSE(parse({"--eval", "0"}).config.eval);
  CHECK(parse({"--shuffle", "--seed", "3"}).config.shuffle);
  CHECK(contains(parse_error({"--eval", "maybe"}), "--eval: expected 0 or 1"));
  CHECK(contains(validation_error({"--eval"}), "--eval needs --eval-data FILE"));
  CHECK(contains(validation_error({"--eval-every", "10"}), "--eval-every needs --eval-data FILE"));
  CHECK(contains(validation_error({"--eval-data", "x.bin", "--eval-losses", "l.jsonl"}), "--eval-losses is written by --eval"));
  CHECK(validation_error({"--eval", "--eval-data", "x.bin", "--eval-losses", "l.jsonl"}).empty());
  CHECK(contains(parse_error({"--peak-tflops", "-1"}), "--peak-tflops"));
}

TEST_CASE("the generation flags: ranges, cross-checks, the unused --prompt warning") {
  const TrainConfig defaults = parse({}).config;
  CHECK_FALSE(defaults.generate);
  CHECK(defaults.temperature == 1.0);
  CHECK(defaults.top_k == 40);
  CHECK(defaults.vocab_dir == "data/gpt2_bpe");
  CHECK(defaults.sample_every == 0);
  CHECK(parse({"--generate", "--init-from", "m.bin"}).config.generate);
  CHECK(parse({"--temperature", "0"}).config.temperature == 0.0);
  CHECK(parse_error({"--temperature", "-0.1"}) == "--temperature: expected a number >= 0, got '-0.1'");
  CHECK(parse_error({"--top-k", "-1"}) == "--top-k: expected an integer in [0, 2147483647], got '-1'");
  CHECK(parse_error({"--max-new-tokens", "0"}) == "--max-new-tokens: expected an integer in [1, 2147483647], got '0'");
  CHECK(parse_error({"--sample-every", "-2"}) == "--sample-every: expected an integer >= 0, got '-2'");
  CHECK(validation_error({"--generate"}) == "--generate needs a trained model: --init-from FILE or --resume DIR|auto");
  CHECK(validation_error({"--generate", "--resume", "auto"}).empty());
  CHECK(contains(validation_error({"--generate", "--init-from", "m.bin", "--plan"}), "--generate and --plan"));
  CHECK(contains(validation_error({"--generate", "--init-from", "m.bin", "--eval", "--eval-data", "x.bin"}),
                 "--generate and --eval"));

  const std::string unused = "--prompt is never used (--sample-every is 0; --generate generates from a model alone)";
  const auto warned = [&](std::initializer_list<const char*> flags) {
    const std::vector<std::string> w = config_warnings(parse(flags).config, 1, 0);
    return std::find(w.begin(), w.end(), unused) != w.end();
  };
  CHECK(warned({"--prompt", "Hi", "--max-steps", "1000"}));
  CHECK_FALSE(warned({"--prompt", "Hi", "--sample-every", "100"}));
  CHECK_FALSE(warned({"--prompt", "Hi", "--generate"}));
}
