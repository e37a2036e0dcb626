// train_gpt — pretrains GPT-2 family models: flags → config → model/optimizer/data → loop.
//
// Order of a run (nothing on disk is created or truncated before every input is checked):
//   1. flags and --config (src/config.h); cross-flag checks
//   2. the device (without one: a one-line pointer to the CPU build)
//   3. the model architecture (--init-from's header or the --model preset), --seq-len against it
//   4. the data: every shard's header and size, and the first batch's token ids against the vocab
//   5. the model: allocation, then --init-from's weights or a seeded random init
//   6. --out-dir, DIR/metrics.jsonl (truncated), the training loop, DIR/model.bin
//
// Step k (1-based) zeroes the gradients, runs grad_accum micro-batches of forward+backward
// (their mean loss is step k's train_loss, measured with the weights before step k's update),
// then one AdamW update at lr(k) (src/lr_schedule.h). Validation runs after step k when
// k % val_every == 0 and after the last step, on the weights after that step's update: the mean
// loss over the first val_steps batches of --val-data.
//
// Data parallel (src/comm.h): one process per GPU, started by mpirun or srun. Every rank reads its
// own part of each global batch (src/dataloader.h) and runs the same steps; losses are averaged
// over the ranks. Rank 0 alone prints the log, writes metrics.jsonl and the model file; an error on
// any rank is printed with its rank and ends that rank (the launcher then ends the others).
#include "kernels/common.cuh"
#include "src/comm.h"
#include "src/config.h"
#include "src/dataloader.h"
#include "src/gpt2.h"
#include "src/lr_schedule.h"
#include "src/metrics.h"

#include <chrono>
#include <exception>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

namespace {

// "rank N: " once there is more than one rank, for error messages.
std::string error_prefix;

struct Run {
  TrainConfig cfg;
  int grad_accum_steps = 1;
  GPT2Config model;
  std::string model_source;  // "preset d12" or the --init-from path
  LrSchedule schedule;
};

// Runs f; an exception from it is rethrown as one line prefixed with `context` (a flag name).
template <typename F>
auto with_context(const std::string& context, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const std::exception& e) {
    throw std::runtime_error(context + ": " + e.what());
  }
}

void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}

std::string mib(size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return buf;
}

// 124475904 -> "124,475,904"
std::string thousands(unsigned long long n) {
  std::string digits = std::to_string(n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

GPT2Config resolve_model(const TrainConfig& cfg, std::string* source) {
  if (!cfg.init_from.empty()) {
    *source = cfg.init_from;
    return with_context("--init-from", [&] { return read_model_header(cfg.init_from); });
  }
  *source = "preset " + cfg.model;
  return with_context("--model", [&] { return gpt2_preset(cfg.model); });
}

// Test hook: TRAIN_GPT_TEST_EXIT_AFTER_STEP=RANK:STEP makes rank RANK exit abruptly (no cleanup,
// status 3) after step STEP, to test how the other ranks end when a peer dies.
void maybe_die_for_test(int rank, long long step) {
  const char* spec = std::getenv("TRAIN_GPT_TEST_EXIT_AFTER_STEP");
  int die_rank = -1;
  long long die_step = -1;
  if (spec != nullptr && std::sscanf(spec, "%d:%lld", &die_rank, &die_step) == 2 && die_rank == rank &&
      die_step == step) {
    std::fprintf(stderr, "rank %d: exiting after step %lld (TRAIN_GPT_TEST_EXIT_AFTER_STEP)\n", rank, step);
    std::_Exit(3);
  }
}

template <typename T>
void train(const Run& run, Communicator& comm) {
  const TrainConfig& cfg = run.cfg;
  const int rank = comm.rank(), world_size = comm.world_size();
  const bool lead = rank == 0;
  const int B = cfg.batch_size, T_seq = cfg.seq_len;
  const size_t micro_tokens = static_cast<size_t>(B) * T_seq;
  std::vector<int> inputs(micro_tokens), targets(micro_tokens);

  // Data before the model: a missing or corrupt shard fails before gigabytes are allocated.
  // Token ids are checked as batches are read, so the first batch of each set is read now
  // (then rewound) to catch data tokenized for another vocabulary before anything is written.
  DataLoader train_loader = with_context("--train-data", [&] {
    return DataLoader(cfg.train_data, B, T_seq, rank, world_size, cfg.shuffle, static_cast<uint64_t>(cfg.seed),
                      run.model.vocab_size);
  });
  with_context("--train-data", [&] {
    train_loader.next_batch(inputs.data(), targets.data());
    train_loader.reset();
  });
  std::unique_ptr<DataLoader> val_loader;
  if (cfg.val_every > 0) {
    try {
      val_loader = std::make_unique<DataLoader>(cfg.val_data, B, T_seq, rank, world_size, false,
                                                static_cast<uint64_t>(cfg.seed), run.model.vocab_size);
    } catch (const std::exception& e) {
      throw std::runtime_error(std::string("--val-data: ") + e.what() + " (--val-every 0 trains without validation)");
    }
    with_context("--val-data", [&] { val_loader->next_batch(inputs.data(), targets.data()); });
  }

  GPT2<T> model(run.model, B, T_seq, cfg.recompute, &comm, cfg.zero);
  if (!cfg.init_from.empty()) with_context("--init-from", [&] { model.load(cfg.init_from); });
  else model.init_random(static_cast<uint64_t>(cfg.seed));

  cudaDeviceProp prop;
  check_cuda(cudaGetDeviceProperties(&prop, 0), "querying the device");
  const ActivationBytes acts = gpt2_activation_bytes(run.model, B, T_seq, model.recompute(), GPT2<T>::dtype);
  const size_t param_bytes = model.parameter_bytes(), optim_bytes = model.optimizer_bytes(),
               act_bytes = model.activation_bytes();
  std::printf("train_gpt\nconfig:\n%s", config_summary(cfg).c_str());
  std::printf("device: %s (%s)\n", prop.name, mib(prop.totalGlobalMem).c_str());
  std::printf("model: %s from %s, %s parameters\n", describe(run.model).c_str(), run.model_source.c_str(),
              thousands(model.num_parameters()).c_str());
  std::printf("memory: parameters+gradients %s, optimizer %s, activations %s, total %s\n", mib(param_bytes).c_str(),
              mib(optim_bytes).c_str(), mib(act_bytes).c_str(), mib(param_bytes + optim_bytes + act_bytes).c_str());
  std::printf("activations at --recompute %d: blocks %s, logits and buffers %s; blocks at --recompute", model.recompute(),
              mib(acts.blocks).c_str(), mib(acts.other).c_str());
  for (int r = 0; r <= kRecomputeMax; ++r)
    std::printf(" %d: %s%s", r, mib(gpt2_activation_bytes(run.model, B, T_seq, r, GPT2<T>::dtype).blocks).c_str(),
                r < kRecomputeMax ? "," : "\n");
  std::printf("batch: %lld tokens per step = %d x %d tokens x %d rank(s) x %d accumulation step(s)\n",
              cfg.total_batch_tokens, B, T_seq, world_size, run.grad_accum_steps);
  std::printf("train data: %zu shard(s), %s tokens", train_loader.num_shards(),
              thousands(train_loader.tokens_in_shards()).c_str());
  if (val_loader)
    std::printf("; val data: %zu shard(s), %s tokens", val_loader->num_shards(),
                thousands(val_loader->tokens_in_shards()).c_str());
  std::printf("\n");
  std::printf("distributed: world size %d (%s), ZeRO stage %d; per rank: parameters %zu bytes, gradients %zu bytes, "
              "optimizer state %zu bytes\n",
              world_size, comm.launcher().c_str(), model.zero_stage(), model.parameter_bytes() - model.gradient_bytes(),
              model.gradient_bytes(), optim_bytes);
  std::fflush(stdout);

  std::unique_ptr<MetricsLog> metrics;
  if (lead) {
    std::error_code ec;
    std::filesystem::create_directories(cfg.out_dir, ec);
    if (ec) throw std::runtime_error("--out-dir " + cfg.out_dir + ": cannot create the directory: " + ec.message());
    metrics = std::make_unique<MetricsLog>(cfg.out_dir + "/metrics.jsonl");
  }

  OptimizerSettings opt;
  opt.beta1 = static_cast<float>(cfg.beta1);
  opt.beta2 = static_cast<float>(cfg.beta2);
  opt.eps = static_cast<float>(cfg.adam_eps);
  opt.weight_decay = static_cast<float>(cfg.weight_decay);
  opt.grad_clip = static_cast<float>(cfg.grad_clip);
  opt.seed = static_cast<uint64_t>(cfg.seed);

  StepClock clock;
  for (long long step = 1; step <= cfg.max_steps; ++step) {
    const auto start = std::chrono::steady_clock::now();
    model.zero_grad();
    double loss_sum = 0.0;
    for (int micro = 0; micro < run.grad_accum_steps; ++micro) {
      with_context("--train-data", [&] { train_loader.next_batch(inputs.data(), targets.data()); });
      loss_sum += model.forward_backward(inputs.data(), targets.data(), run.grad_accum_steps,
                                         micro + 1 == run.grad_accum_steps);
    }
    const double lr = run.schedule.at(step);
    const float grad_norm = model.update(opt, static_cast<float>(lr), static_cast<int>(step));
    check_cuda(cudaDeviceSynchronize(), "training step");
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    clock.add(ms);

    StepRecord record;
    record.step = step;
    record.total_steps = cfg.max_steps;
    record.train_loss = comm.sum(loss_sum / run.grad_accum_steps) / world_size;
    record.lr = lr;
    record.grad_norm = grad_norm;
    record.ms = ms;
    record.tokens_per_s = static_cast<double>(cfg.total_batch_tokens) / (ms / 1000.0);
    record.eta_seconds = clock.eta_seconds(cfg.max_steps - step);
    std::printf("%s\n", format_step_line(record).c_str());
    std::fflush(stdout);
    if (lead) metrics->train_step(record);
    maybe_die_for_test(rank, step);

    if (val_loader && (step % cfg.val_every == 0 || step == cfg.max_steps)) {
      val_loader->reset();
      double val_sum = 0.0;
      for (long long v = 0; v < cfg.val_steps; ++v) {
        with_context("--val-data", [&] { val_loader->next_batch(inputs.data(), targets.data()); });
        val_sum += model.forward(inputs.data(), targets.data());
      }
      const double val_loss = comm.sum(val_sum / static_cast<double>(cfg.val_steps)) / world_size;
      std::printf("%s\n", format_val_line(step, cfg.max_steps, val_loss).c_str());
      std::fflush(stdout);
      if (lead) metrics->validation(step, val_loss);
    }
  }

  if (lead) {
    const std::string model_path = cfg.out_dir + "/model.bin";
    model.save(model_path);
    std::printf("saved %s\n", model_path.c_str());
  }
  comm.barrier();  // no rank tears down its communicator while another still needs it
}

// Everything after parsing; returns the exit code.
int run_main(int argc, char** argv) {
  ParsedArgs args = parse_args(argc, argv);
  if (args.help) {
    std::printf("%s", help_text(argv[0]).c_str());
    return 0;
  }
  Run run;
  run.cfg = args.config;

  int devices = 0;
  cudaError_t err = cudaGetDeviceCount(&devices);
  if (err != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "no CUDA device: %s; use train_gpt_cpu (make cpu) on machines without a GPU\n",
                 err != cudaSuccess ? cudaGetErrorString(err) : "no device found");
    return 1;
  }

  CommOptions comm_options;
  comm_options.rendezvous = run.cfg.rendezvous;
  comm_options.timeout_seconds = run.cfg.comm_timeout;
  const LaunchInfo launch = with_context("data-parallel start-up", [] { return detect_launch(); });
  if (launch.world_size > 1) error_prefix = "rank " + std::to_string(launch.rank) + ": ";
  const std::unique_ptr<Communicator> comm =
      with_context("data-parallel start-up", [&] { return std::make_unique<Communicator>(comm_options); });
  // The log is rank 0's; the other ranks' standard output is discarded (errors go to stderr).
  if (comm->rank() != 0 && std::freopen("/dev/null", "w", stdout) == nullptr)
    throw std::runtime_error("cannot redirect the standard output of rank " + std::to_string(comm->rank()));
  run.grad_accum_steps = validate_config(run.cfg, comm->world_size());
  run.schedule = make_lr_schedule(run.cfg);

  run.model = resolve_model(run.cfg, &run.model_source);
  validate_against_model(run.cfg, run.model.max_seq_len, run.model_source);
  if (run.cfg.dtype == "fp32") train<float>(run, *comm);
  else train<bf16>(run, *comm);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run_main(argc, argv);
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "%serror: %s\n", error_prefix.c_str(), e.what());
    // Peers may be blocked in a collective with this rank: end the whole MPI job now.
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
}
