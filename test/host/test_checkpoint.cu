// Checkpoint building blocks (src/ckpt/checkpoint.h, src/model/step_guards.h): CRC-32C against published
// check values, atomic files, the bad-step guards, a model + training state round trip for both
// dtypes, detection of damaged checkpoints, retention and the metrics rewrite on resume.
// The end-to-end behaviour (exact resume, signals, failed writes) is test/checks/checkpoint_*.sh.
#include "test/test_util.h"
#include "src/ckpt/checkpoint_load.h"
#include "src/ckpt/checkpoint_write.h"
#include "src/run/metrics.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct TempDir {
  std::string path;
  TempDir() {
    char pattern[] = "/tmp/test_checkpoint.XXXXXX";
    REQUIRE(::mkdtemp(pattern) != nullptr);
    path = pattern;
  }
  ~TempDir() { REQUIRE(std::system(("rm -rf '" + path + "'").c_str()) == 0); }
};

uint32_t crc_of(const std::vector<unsigned char>& bytes) {
  Crc32c c;
  c.update(bytes.data(), bytes.size());
  return c.value();
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

template <typename U>
std::vector<U> download_all(const U* device, size_t count) {
  std::vector<U> host(count);
  CUDA_CHECK(cudaMemcpy(host.data(), device, count * sizeof(U), cudaMemcpyDeviceToHost));
  return host;
}

}  // namespace

TEST_CASE("CRC-32C matches the published check values", "[checkpoint]") {
  const std::string digits = "123456789";
  CHECK(crc_of({digits.begin(), digits.end()}) == 0xE3069283u);
  // RFC 3720 (iSCSI) appendix B.4.
  CHECK(crc_of(std::vector<unsigned char>(32, 0x00)) == 0x8A9136AAu);
  CHECK(crc_of(std::vector<unsigned char>(32, 0xFF)) == 0x62A8AB43u);
  std::vector<unsigned char> ascending(32);
  for (int i = 0; i < 32; ++i) ascending[i] = static_cast<unsigned char>(i);
  CHECK(crc_of(ascending) == 0x46DD794Eu);
  CHECK(crc_hex(0x0000ABCDu) == "0000abcd");
}

TEST_CASE("CRC-32C over pieces equals the CRC of the whole", "[checkpoint]") {
  std::vector<unsigned char> bytes(37);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<unsigned char>(i * 73 + 11);
  const uint32_t whole = crc_of(bytes);
  for (size_t split = 0; split <= bytes.size(); ++split) {
    Crc32c c;
    c.update(bytes.data(), split);
    c.update(bytes.data() + split, bytes.size() - split);
    CHECK(c.value() == whole);
  }
}

TEST_CASE("AtomicFileWriter: the file appears complete on commit, never partially", "[checkpoint]") {
  TempDir dir;
  const std::string path = dir.path + "/file.bin";
  {
    std::ofstream(path) << "previous";
  }
  {
    AtomicFileWriter out(path);
    out.write("new contents", 12);
    CHECK(read_text(path) == "previous");  // not yet committed
  }                                         // destroyed without commit: abandoned
  CHECK(read_text(path) == "previous");
  CHECK_FALSE(exists(path + ".tmp"));

  AtomicFileWriter out(path);
  out.write("new ", 4);
  out.write("contents", 8);
  out.commit();
  CHECK(read_text(path) == "new contents");
  CHECK_FALSE(exists(path + ".tmp"));
  uint64_t size = 0;
  uint32_t crc = 0;
  REQUIRE(file_size_and_crc(path, &size, &crc));
  CHECK(size == out.size());
  CHECK(size == 12);
  CHECK(crc == out.crc32c());
  CHECK_FALSE(file_size_and_crc(dir.path + "/missing", &size, &crc));
}

TEST_CASE("Bad-step guards skip non-finite and outlying steps and keep them out of the windows", "[guards]") {
  BadStepGuards g;
  CHECK(g.check(NAN, 1.0) == "non-finite loss");
  CHECK(g.check(1.0, INFINITY) == "non-finite gradient norm");
  CHECK(g.skipped_nonfinite == 2);
  CHECK(g.loss_window.values().empty());

  g.loss_z_limit = 3.0;
  g.norm_z_limit = 2.0;
  // Until kMinSamples steps are accepted the z-score guards stay quiet, even for a spike.
  for (size_t i = 0; i + 1 < ZScoreWindow::kMinSamples; ++i) CHECK(g.check(i % 2 ? 5.0 : 4.0, 1.0 + 0.1 * (i % 2)) == "");
  CHECK(g.check(1000.0, 1.0) == "");
  CHECK(g.loss_window.values().size() == ZScoreWindow::kMinSamples);
  // Now window mean/std are known: loss values 4,5,... and 1000 → a loss of 1e6 is far out.
  CHECK(g.check(1e6, 1.0).rfind("loss z-score ", 0) == 0);
  CHECK(g.skipped_loss_z == 1);
  CHECK(g.check(5.0, 100.0).rfind("gradient-norm z-score ", 0) == 0);
  CHECK(g.skipped_norm_z == 1);
  CHECK(g.loss_window.values().size() == ZScoreWindow::kMinSamples);  // skipped steps stay out
  CHECK(g.skipped_total() == 4);
  // A value below the mean is never an outlier.
  CHECK(g.check(-1e6, 0.0) == "");

  ZScoreWindow constant;
  for (int i = 0; i < 10; ++i) constant.push(2.0);
  CHECK(constant.z(2.0) == 0.0);
  CHECK(constant.z(2.5) == std::numeric_limits<double>::infinity());
  ZScoreWindow w;
  for (size_t i = 0; i < ZScoreWindow::kCapacity + 5; ++i) w.push(static_cast<double>(i));
  CHECK(w.values().size() == ZScoreWindow::kCapacity);
  CHECK(w.values().front() == 5.0);
  // z of the known window {0, 2}: mean 1, population std 1.
  ZScoreWindow two;
  two.assign({0.0, 2.0});
  CHECK(two.z(4.0) == 3.0);
}

TEMPLATE_TEST_CASE("A checkpoint restores parameters, fp32 weights, moments and state bit for bit", "[checkpoint]",
                   float, bf16) {
  TempDir dir;
  const ModelConfig config{8, 20, 24, 1, 1, 8};  // maxT, V, Vp, L, NH, C
  const int B = 2, T = 5;
  Transformer<TestType> model(config, B, T);
  model.init_random(3);
  OptimizerSettings opt;
  opt.seed = 99;
  const std::vector<int> inputs = test::random_tokens(B * T, config.vocab_size, 1);
  const std::vector<int> targets = test::random_tokens(B * T, config.vocab_size, 2);
  for (int step = 1; step <= 2; ++step) {
    model.zero_grad();
    model.forward_backward(inputs.data(), targets.data(), 1);
    test::optimizer_step(model, opt, 1e-2f, step);
  }
  TrainingState state;
  state.step = 2;
  state.seed = 99;
  state.train_data.epoch = 3;
  state.train_data.shard = 1;
  state.train_data.sample = 7;
  state.train_data.seed = 42;
  state.train_data.shuffle = 1;
  state.train_data.global_batch_tokens = B * T;
  state.train_data.num_shards = 2;
  state.guards.skipped_nonfinite = 5;
  state.guards.skipped_loss_z = 6;
  state.guards.skipped_norm_z = 7;
  state.guards.loss_window.assign({1.5, 2.5, 3.25});
  state.guards.norm_window.assign({0.125});
  CheckpointWriteInfo info;
  info.config = {{"lr", "0.01"}};
  const std::string written = write_checkpoint(dir.path, model, state, info);
  CHECK(written == dir.path + "/checkpoint_00000002");

  std::string problem;
  const std::optional<Checkpoint> c = verify_checkpoint(written, &problem);
  REQUIRE(c.has_value());
  CHECK(c->step == 2);
  CHECK(c->manifest.at("dtype") == (std::is_same<TestType, bf16>::value ? "bf16" : "fp32"));
  CHECK(c->manifest.at("config").at("lr") == "0.01");

  Transformer<TestType> loaded(config, B, T);
  TrainingState restored;
  load_checkpoint(*c, loaded, &restored);
  const size_t P = model.num_parameters();
  CHECK(test::same_bits(download_all(model.params_device(), P), download_all(loaded.params_device(), P)));
  CHECK(test::same_bits(download_all(model.adam_m_device(), P), download_all(loaded.adam_m_device(), P)));
  CHECK(test::same_bits(download_all(model.adam_v_device(), P), download_all(loaded.adam_v_device(), P)));
  if (model.master_device() != nullptr)
    CHECK(test::same_bits(download_all(model.master_device(), P), download_all(loaded.master_device(), P)));
  CHECK(restored.step == 2);
  CHECK(restored.seed == 99);
  CHECK(std::memcmp(&restored.train_data, &state.train_data, sizeof(LoaderPosition)) == 0);
  CHECK(restored.guards.skipped_nonfinite == 5);
  CHECK(restored.guards.skipped_loss_z == 6);
  CHECK(restored.guards.skipped_norm_z == 7);
  CHECK(restored.guards.loss_window.values() == std::vector<double>{1.5, 2.5, 3.25});
  CHECK(restored.guards.norm_window.values() == std::vector<double>{0.125});

  // The restored model continues exactly like the original.
  for (Transformer<TestType>* m : {&model, &loaded}) {
    m->zero_grad();
    m->forward_backward(inputs.data(), targets.data(), 1);
    test::optimizer_step(*m, opt, 1e-2f, 3);
  }
  CHECK(test::same_bits(download_all(model.params_device(), P), download_all(loaded.params_device(), P)));

}

TEMPLATE_TEST_CASE("A checkpoint loads into other gradient buckets (resharding) and continues bit for bit",
                   "[checkpoint]", float, bf16) {
  TempDir dir;
  const ModelConfig config{8, 20, 24, 3, 1, 8};  // maxT, V, Vp, L, NH, C
  const int B = 2, T = 5;
  Transformer<TestType> model(config, B, T);  // one bucket of all 3 layers
  const double one_layer_mib = 1e-6;    // below one layer: a bucket per layer
  Transformer<TestType> loaded(config, B, T, kRecomputeDefault, nullptr, 0, "auto", one_layer_mib);
  REQUIRE(model.gradient_sync().buckets().buckets().size() == 2);
  REQUIRE(loaded.gradient_sync().buckets().buckets().size() == 4);
  model.init_random(5);
  OptimizerSettings opt;
  const std::vector<int> inputs = test::random_tokens(B * T, config.vocab_size, 3);
  const std::vector<int> targets = test::random_tokens(B * T, config.vocab_size, 4);
  auto step = [&](Transformer<TestType>& m, int s) {
    m.zero_grad();
    m.forward_backward(inputs.data(), targets.data(), 1);
    test::optimizer_step(m, opt, 1e-2f, s);
  };
  step(model, 1);
  step(model, 2);
  TrainingState state;
  state.step = 2;
  std::string problem;
  const std::optional<Checkpoint> c = verify_checkpoint(write_checkpoint(dir.path, model, state, {}), &problem);
  REQUIRE(c.has_value());
  TrainingState restored;
  load_checkpoint(*c, loaded, &restored);
  const size_t P = model.num_parameters();
  // The state is in each model's own bucket order: equal as multisets, checked through what it does.
  step(model, 3);
  step(loaded, 3);
  CHECK(test::same_bits(download_all(model.params_device(), P), download_all(loaded.params_device(), P)));
  CHECK(test::same_bits(model.gradients(), loaded.gradients()));
}

TEST_CASE("Damaged checkpoints are reported and the previous complete one is found", "[checkpoint]") {
  TempDir dir;
  const ModelConfig config{8, 20, 24, 1, 1, 8};
  Transformer<float> model(config, 1, 4);
  model.init_random(1);
  TrainingState state;
  for (long long step : {1, 2}) {
    state.step = step;
    write_checkpoint(dir.path, model, state, CheckpointWriteInfo{});
  }
  const std::string newest = dir.path + "/checkpoint_00000002";
  const std::string state_file = newest + "/state_r00000.bin";
  const std::string original = read_text(state_file);

  auto expect_previous = [&](const std::string& reason) {
    std::vector<std::string> skipped;
    const std::optional<Checkpoint> c = find_latest_checkpoint(dir.path, &skipped);
    REQUIRE(c.has_value());
    CHECK(c->step == 1);
    REQUIRE(skipped.size() == 1);
    CHECK_THAT(skipped[0], Catch::StartsWith(newest + ": ") && Catch::Contains(reason));
  };
  auto rewrite_state = [&](const std::string& bytes) { std::ofstream(state_file, std::ios::binary) << bytes; };

  {
    std::vector<std::string> skipped;
    const std::optional<Checkpoint> c = find_latest_checkpoint(dir.path, &skipped);
    REQUIRE(c.has_value());
    CHECK(c->step == 2);
    CHECK(skipped.empty());
  }
  for (size_t cut : {size_t(0), size_t(1), sizeof(StateHeader), original.size() / 2, original.size() - 1}) {
    rewrite_state(original.substr(0, cut));
    expect_previous("truncated");
  }
  for (size_t at : {size_t(0), size_t(100), original.size() - 1}) {
    std::string flipped = original;
    flipped[at] = static_cast<char>(flipped[at] ^ 1);
    rewrite_state(flipped);
    expect_previous("CRC-32C");
  }
  rewrite_state(original);
  REQUIRE(::rename((newest + "/manifest.json").c_str(), (newest + "/manifest.saved").c_str()) == 0);
  expect_previous("no manifest.json");
  std::ofstream(newest + "/manifest.json") << "{\"format\": \"train_gpt checkpoint\"";
  expect_previous("not a valid manifest");
  REQUIRE(::rename((newest + "/manifest.saved").c_str(), (newest + "/manifest.json").c_str()) == 0);
  REQUIRE(::unlink((newest + "/model.bin").c_str()) == 0);
  expect_previous("model.bin is missing");
}

TEST_CASE("Retention keeps the newest K, multiples of M, and later directories", "[checkpoint]") {
  TempDir dir;
  for (int step : {2, 4, 6, 8, 10, 12, 14})
    REQUIRE(::mkdir((dir.path + "/" + checkpoint_dir_name(step)).c_str(), 0755) == 0);
  const std::vector<std::string> removed = prune_checkpoints(dir.path, 12, 2, 4);
  std::vector<long long> left;
  for (const CheckpointDir& d : list_checkpoint_dirs(dir.path)) left.push_back(d.step);
  CHECK(left == std::vector<long long>{14, 12, 10, 8, 4});
  CHECK(removed.size() == 2);
  CHECK(prune_checkpoints(dir.path, 12, 0, 0).empty());  // K = 0 keeps everything
}

TEST_CASE("The free-space check counts the checkpoints retention leaves on disk at once", "[checkpoint]") {
  // Each combination is played out on real directories: the run's checkpoints written one by one,
  // retention after each, the most directories beyond those there at the start counted.
  TempDir dir;
  const std::vector<std::vector<long long>> existing_after_5 = {{}, {5}, {5, 4, 3, 2, 1}, {4, 2}};
  for (long long start : {0, 5})
    for (const std::vector<long long>& existing : start == 0 ? std::vector<std::vector<long long>>{{}} : existing_after_5)
      for (long long length : {1, 7, 12})
        for (long long every : {0, 1, 3, 4})
          for (long long keep_last : {0, 1, 2, 3})
            for (long long keep_every : {0, 2, 3}) {
              const long long max_steps = start + length;
              for (long long step : existing)
                REQUIRE(::mkdir((dir.path + "/" + checkpoint_dir_name(step)).c_str(), 0755) == 0);
              long long most = 0;
              for (long long step = start + 1; step <= max_steps; ++step) {
                if (step != max_steps && (every == 0 || step % every != 0)) continue;
                REQUIRE(::mkdir((dir.path + "/" + checkpoint_dir_name(step)).c_str(), 0755) == 0);
                most = std::max(most, static_cast<long long>(list_checkpoint_dirs(dir.path).size() - existing.size()));
                prune_checkpoints(dir.path, step, keep_last, keep_every);
              }
              INFO("start " << start << ", " << existing.size() << " existing, max " << max_steps << ", every " << every
                            << ", keep " << keep_last << ", keep-every " << keep_every);
              CHECK(checkpoints_at_once(start, max_steps, every, keep_last, keep_every, existing) ==
                    static_cast<uint64_t>(most));
              for (const CheckpointDir& d : list_checkpoint_dirs(dir.path)) remove_checkpoint_dir(d.path);
            }
  // A run that is already done writes none; one of two billion steps is counted without playing it out.
  CHECK(checkpoints_at_once(8, 8, 4, 3, 0, {8, 4}) == 0);
  CHECK(checkpoints_at_once(0, 2000000000, 1, 0, 0, {}) == 2000000000u);
  CHECK(checkpoints_at_once(0, 2000000000, 1, 3, 0, {}) == 4u);
  CHECK(checkpoints_at_once(0, 2000000000, 1, 3, 1000, {}) == 4u + 1999999);
}

TEST_CASE("On resume metrics.jsonl keeps the records up to the checkpoint's step", "[checkpoint]") {
  TempDir dir;
  const std::string path = dir.path + "/metrics.jsonl";
  std::ofstream(path) << "{\"step\": 1, \"train_loss\": 5}\n{\"step\": 2, \"train_loss\": 4}\n{\"step\": 2, "
                         "\"val_loss\": 4.5}\n{\"step\": 3, \"train_loss\": 3}\n{\"step\": 4, \"train";
  const std::vector<std::string> damaged = keep_metrics_through_step(path, 2);
  CHECK(read_text(path) == "{\"step\": 1, \"train_loss\": 5}\n{\"step\": 2, \"train_loss\": 4}\n{\"step\": 2, "
                           "\"val_loss\": 4.5}\n");
  // the torn last line is dropped, and said so
  CHECK(damaged == std::vector<std::string>{path + " line 5: not a metrics record, dropped: '{\"step\": 4, \"train'"});
  CHECK(keep_metrics_through_step(dir.path + "/absent.jsonl", 2).empty());
  CHECK(read_text(dir.path + "/absent.jsonl").empty());
}

TEST_CASE("On resume every damaged metrics line is reported with its number", "[checkpoint]") {
  TempDir dir;
  const std::string path = dir.path + "/metrics.jsonl";
  std::ofstream(path) << "{\"step\": 1, \"train_loss\": 5}\n{\"st" + std::string(3, '\0') +
                             "\n[1, 2]\n\n{\"train_loss\": 3}\n{\"step\": 2, \"train_loss\": 4}\n";
  const std::vector<std::string> damaged = keep_metrics_through_step(path, 5);
  CHECK(read_text(path) == "{\"step\": 1, \"train_loss\": 5}\n{\"step\": 2, \"train_loss\": 4}\n");
  REQUIRE(damaged.size() == 4);
  CHECK(damaged[0].rfind(path + " line 2: not a metrics record", 0) == 0);
  CHECK(damaged[1] == path + " line 3: not a metrics record, dropped: '[1, 2]'");
  CHECK(damaged[2] == path + " line 4: not a metrics record, dropped: ''");
  CHECK(damaged[3] == path + " line 5: not a metrics record, dropped: '{\"train_loss\": 3}'");
  CHECK(keep_metrics_through_step(path, 5).empty());  // a clean file: nothing to report
}

TEST_CASE("The metrics log appends whole lines, after a resumed run's records", "[checkpoint]") {
  TempDir dir;
  const std::string path = dir.path + "/metrics.jsonl";
  std::ofstream(path) << "old\n";
  {
    MetricsLog fresh(path);
    fresh.validation(1, 2.5);
  }
  CHECK(read_text(path) == "{\"step\":1,\"val_loss\":2.5}\n");
  {
    MetricsLog resumed(path, true);
    resumed.validation(2, 2.0);
  }
  CHECK(read_text(path) == "{\"step\":1,\"val_loss\":2.5}\n{\"step\":2,\"val_loss\":2.0}\n");
}
