// train_gpt — pretrains GPT-2 family models: flags → config → model/optimizer/data → loop.
//
// Order of a run (nothing on disk is created or truncated before every input is checked):
//   1. flags and --config (src/config.h); cross-flag checks
//   2. the device (without one: a one-line pointer to the CPU build)
//   3. the model architecture (--init-from's header or the --model preset), --seq-len against it
//   4. the data: every shard's header and size, and the first batch's token ids against the vocab
//   5. the model: allocation, then --init-from's weights or a seeded random init
//   6. --out-dir, DIR/metrics.jsonl (truncated), the training loop, DIR/model.bin
// With --resume, the checkpoint is chosen and checked right after step 1 and replaces --init-from
// and --model in steps 3 and 5; metrics.jsonl keeps its records up to the checkpoint's step.
// A fresh run refuses an --out-dir that holds checkpoints (it would mix two runs' checkpoints).
//
// Checkpoints (src/checkpoint.h): after every --checkpoint-every-th step, after the last step, and
// after the step during which SIGTERM or SIGUSR1 arrived (the run then exits 0).
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
// Checkpoints are written by all ranks together (each its own state file, rank 0 the model file and
// the manifest) into an --out-dir all ranks share.
#include "kernels/common.cuh"
#include "src/checkpoint.h"
#include "src/checkpoint_dirs.h"
#include "src/comm.h"
#include "src/config.h"
#include "src/dataloader.h"
#include "src/gpt2.h"
#include "src/lr_schedule.h"
#include "src/metrics.h"
#include "src/step_guards.h"

#include <chrono>
#include <csignal>
#include <exception>
#include <filesystem>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

namespace {

// "rank N: " once there is more than one rank, for error messages.
std::string error_prefix;

// The signal (SIGTERM, SIGUSR1) that asked the run to stop after the current step; 0: none.
volatile std::sig_atomic_t g_stop_signal = 0;

void request_stop(int signal) { g_stop_signal = signal; }

void install_stop_handlers() {
  struct sigaction action {};
  action.sa_handler = request_stop;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // reads and writes in flight continue; the loop checks the flag
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGUSR1, &action, nullptr);
}

struct Run {
  TrainConfig cfg;
  int grad_accum_steps = 1;
  GPT2Config model;
  std::string model_source;  // "preset d12" or the --init-from path
  LrSchedule schedule;
  std::optional<Checkpoint> resume_from;  // --resume's checkpoint
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

// The run's flags as the manifest records them ({"lr": "0.0006", ...}).
nlohmann::json config_json(const TrainConfig& cfg) {
  nlohmann::json j = nlohmann::json::object();
  for (const Flag& f : flag_table()) j[f.name] = config_detail::value_text(cfg, f);
  return j;
}

// --resume: the checkpoint to continue from (nothing: start fresh), checked against this run. The
// checkpoint directory is on a filesystem every rank sees: rank 0 chooses the checkpoint and
// verifies every file's size and CRC-32C, the other ranks learn its choice (the step) through the
// communicator and read that checkpoint's manifest, so every rank resumes from the same one.
std::optional<Checkpoint> resolve_resume(const TrainConfig& cfg, Communicator& comm) {
  const int world_size = comm.world_size(), zero = effective_zero_stage(cfg.zero, world_size);
  const bool lead = comm.rank() == 0;
  const std::vector<CheckpointDir> existing = list_checkpoint_dirs(cfg.out_dir);
  if (cfg.resume.empty()) {
    if (!existing.empty())
      throw std::runtime_error("--out-dir " + cfg.out_dir + " already holds checkpoints (newest: " +
                               existing.front().path +
                               "): continue that run with --resume auto, or choose another --out-dir");
    return std::nullopt;
  }
  std::string dir = cfg.resume;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  std::optional<Checkpoint> found;
  std::string error;  // rank 0's reason to stop
  if (lead) {
    if (cfg.resume == "auto") {
      std::vector<std::string> skipped;
      found = find_latest_checkpoint(cfg.out_dir, &skipped);
      for (const std::string& s : skipped) std::fprintf(stderr, "warning: --resume auto: skipping %s\n", s.c_str());
    } else {
      std::string problem;
      found = verify_checkpoint(dir, &problem);
      if (!found) error = "--resume " + cfg.resume + ": not a complete checkpoint: " + problem;
    }
  }
  // Rank 0's decision: the checkpoint's step, -1 for none, -2 for an error.
  const double lead_choice = !error.empty() ? -2.0 : found ? static_cast<double>(found->step) : -1.0;
  const double choice = world_size > 1 ? comm.sum(lead ? lead_choice : 0.0) : lead_choice;
  if (!error.empty()) throw std::runtime_error(error);
  if (choice == -2.0) throw std::runtime_error("--resume " + cfg.resume + ": rank 0 refused the checkpoint (see its error)");
  if (choice == -1.0) {
    std::printf("--resume auto: no complete checkpoint in %s; starting from scratch\n", cfg.out_dir.c_str());
    return std::nullopt;
  }
  if (!lead) {
    const std::string path =
        cfg.resume == "auto" ? cfg.out_dir + "/" + checkpoint_dir_name(static_cast<long long>(choice)) : dir;
    std::string problem;
    found = verify_checkpoint(path, &problem, false);
    if (!found) throw std::runtime_error("--resume " + path + ": rank 0 chose it, but here: " + problem);
  }
  const nlohmann::json& m = found->manifest;
  const int saved_world_size = m.value("world_size", -1), zero_stage = m.value("zero_stage", -1);
  if (saved_world_size != world_size || zero_stage != zero)
    throw std::runtime_error("--resume " + found->path + ": written by a run with " + std::to_string(saved_world_size) +
                             " rank(s) and ZeRO stage " + std::to_string(zero_stage) + "; this run has " +
                             std::to_string(world_size) + " rank(s) and ZeRO stage " + std::to_string(zero) +
                             " (resuming with another world size or ZeRO stage is not supported)");
  const std::string dtype = m.value("dtype", "");
  if (dtype != cfg.dtype)
    throw std::runtime_error("--resume " + found->path + ": the checkpoint holds " + dtype +
                             " training state; run with --dtype " + dtype);
  // Other flags may change on resume (e.g. a longer --max-steps); each change to what is trained
  // is reported (flags about files and checkpointing are not).
  const std::set<std::string> unreported = {"config", "resume", "out-dir", "checkpoint-every", "keep-checkpoints",
                                            "keep-every"};
  const nlohmann::json now = config_json(cfg), then = m.value("config", nlohmann::json::object());
  for (const auto& item : now.items()) {
    if (!lead) break;  // reported once
    if (unreported.count(item.key()) != 0 || !then.contains(item.key()) || !then[item.key()].is_string()) continue;
    const std::string before = then[item.key()].get<std::string>(), after = item.value().get<std::string>();
    if (before != after)
      std::fprintf(stderr, "warning: --resume: --%s is %s, the checkpointed run had %s\n", item.key().c_str(),
                   after.c_str(), before.c_str());
  }
  return found;
}

GPT2Config resolve_model(const TrainConfig& cfg, const std::optional<Checkpoint>& resume_from, std::string* source) {
  if (resume_from) {
    *source = resume_from->path + "/" + kModelFileName;
    return with_context("--resume", [&] { return read_model_header(*source); });
  }
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
  TrainingState state;
  state.seed = static_cast<uint64_t>(cfg.seed);
  state.guards.loss_z_limit = cfg.skip_loss_z;
  state.guards.norm_z_limit = cfg.skip_norm_z;
  if (run.resume_from) {
    with_context("--resume " + run.resume_from->path, [&] {
      load_checkpoint(*run.resume_from, model, &state, rank, world_size, model.zero_stage());
      train_loader.restore(state.train_data);
    });
  } else if (!cfg.init_from.empty()) {
    with_context("--init-from", [&] { model.load(cfg.init_from); });
  } else {
    model.init_random(static_cast<uint64_t>(cfg.seed));
  }

  cudaDeviceProp prop;
  cuda_check(cudaGetDeviceProperties(&prop, 0), "querying the device");
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

  const std::string model_path = cfg.out_dir + "/model.bin";
  std::unique_ptr<MetricsLog> metrics;
  if (lead) {
    std::error_code ec;
    std::filesystem::create_directories(cfg.out_dir, ec);
    if (ec) throw std::runtime_error("--out-dir " + cfg.out_dir + ": cannot create the directory: " + ec.message());
    const size_t model_file_bytes = kHeaderBytes + model.num_parameters() * sizeof(T);
    with_context("--out-dir", [&] {
      check_output_directory(cfg.out_dir, checkpoint_bytes(model.num_parameters(), sizeof(T),
                                                               model.optimizer_shard_end() - model.optimizer_shard_begin(),
                                                               world_size) +
                                              model_file_bytes);
    });
    const std::string metrics_path = cfg.out_dir + "/metrics.jsonl";
    if (run.resume_from) keep_metrics_through_step(metrics_path, state.step);
    metrics = std::make_unique<MetricsLog>(metrics_path, run.resume_from.has_value());
  }

  OptimizerSettings opt;
  opt.beta1 = static_cast<float>(cfg.beta1);
  opt.beta2 = static_cast<float>(cfg.beta2);
  opt.eps = static_cast<float>(cfg.adam_eps);
  opt.weight_decay = static_cast<float>(cfg.weight_decay);
  opt.grad_clip = static_cast<float>(cfg.grad_clip);
  opt.seed = state.seed;

  CheckpointWriteInfo checkpoint_info;
  checkpoint_info.rank = rank;
  checkpoint_info.world_size = world_size;
  checkpoint_info.zero_stage = model.zero_stage();
  checkpoint_info.config = config_json(cfg);
  // Every rank writes its state file; rank 0 the model file and the manifest, then applies retention.
  auto save_checkpoint = [&]() {
    const std::string dir = write_checkpoint(cfg.out_dir, model, state, checkpoint_info, &comm);
    std::printf("checkpoint %s\n", dir.c_str());
    if (lead)
      for (const std::string& old : prune_checkpoints(cfg.out_dir, state.step, cfg.keep_checkpoints, cfg.keep_every))
        std::printf("deleted old checkpoint %s\n", old.c_str());
    std::fflush(stdout);
  };

  if (run.resume_from) {
    std::printf("resumed from %s: %lld step(s) done, %llu update(s) skipped so far\n", run.resume_from->path.c_str(),
                state.step, static_cast<unsigned long long>(state.guards.skipped_total()));
    if (state.step >= cfg.max_steps) {
      std::printf("the checkpoint already reached --max-steps %lld: nothing to train\n", cfg.max_steps);
      if (lead) model.save(model_path);
      std::printf("saved %s\n", model_path.c_str());
      comm.barrier();
      return;
    }
  }
  install_stop_handlers();

  StepClock clock;
  for (long long step = state.step + 1; step <= cfg.max_steps; ++step) {
    const auto start = std::chrono::steady_clock::now();
    model.zero_grad();
    double loss_sum = 0.0;
    for (int micro = 0; micro < run.grad_accum_steps; ++micro) {
      with_context("--train-data", [&] { train_loader.next_batch(inputs.data(), targets.data()); });
      loss_sum += model.forward_backward(inputs.data(), targets.data(), run.grad_accum_steps,
                                         micro + 1 == run.grad_accum_steps);
    }
    // The same loss and norm on every rank, so every rank takes the same skip decision.
    const double train_loss = comm.sum(loss_sum / run.grad_accum_steps) / world_size;
    const double lr = run.schedule.at(step);
    const float grad_norm = model.gradient_norm();
    const std::string skipped = state.guards.check(train_loss, grad_norm);
    if (skipped.empty()) model.apply_update(opt, static_cast<float>(lr), static_cast<int>(step), grad_norm);
    cuda_check(cudaDeviceSynchronize(), "training step");
    state.step = step;
    state.train_data = train_loader.position();
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    clock.add(ms);

    StepRecord record;
    record.step = step;
    record.total_steps = cfg.max_steps;
    record.train_loss = train_loss;
    record.skipped = skipped;
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

    // Every rank stops after the same step when any of them was signalled.
    int stop_signal = g_stop_signal;
    if (world_size > 1 && comm.sum(stop_signal != 0 ? 1.0 : 0.0) > 0.0 && stop_signal == 0) stop_signal = SIGTERM;
    if (stop_signal != 0 || step == cfg.max_steps || (cfg.checkpoint_every > 0 && step % cfg.checkpoint_every == 0))
      save_checkpoint();
    if (stop_signal != 0) {
      if (lead) model.save(model_path);
      std::printf("received %s: stopped after step %lld of %lld, checkpoint written; continue with --resume auto\n",
                  stop_signal == SIGTERM ? "SIGTERM" : "SIGUSR1", step, cfg.max_steps);
      comm.barrier();
      return;
    }
  }

  if (state.guards.skipped_total() > 0)
    std::printf("updates skipped: %llu (non-finite %llu, loss z-score %llu, gradient-norm z-score %llu)\n",
                static_cast<unsigned long long>(state.guards.skipped_total()),
                static_cast<unsigned long long>(state.guards.skipped_nonfinite),
                static_cast<unsigned long long>(state.guards.skipped_loss_z),
                static_cast<unsigned long long>(state.guards.skipped_norm_z));
  if (lead) {
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

  run.resume_from = resolve_resume(run.cfg, *comm);
  run.model = resolve_model(run.cfg, run.resume_from, &run.model_source);
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
