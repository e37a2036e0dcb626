// train_gpt — pretrains GPT-2 family models: flags → config → model/optimizer/data → loop.
//
// Order of a run (nothing on disk is created or truncated before every input is checked):
//   1. flags and --config (src/config.h); cross-flag checks
//   2. the device (without one: a one-line pointer to the CPU build)
//   3. the model architecture (--init-from's header or the --model preset), --seq-len against it
//   4. the data: every shard's header and size; the token ids of the first training shard and of
//      the validation shards the validation reads, against the vocab
//   5. the model: allocation, then --init-from's weights or a seeded random init
//   6. --out-dir: its lock (one run at a time), free space for the checkpoints kept at once,
//      DIR/metrics.jsonl (truncated); the training loop; DIR/model.bin
// With --resume, the checkpoint is chosen and checked right after step 1 and replaces --init-from
// and --model in steps 3 and 5; metrics.jsonl keeps its records up to the checkpoint's step.
// A fresh run refuses an --out-dir that holds checkpoints (it would mix two runs' checkpoints).
// --max-steps 0 stops after step 5: it validates the model and writes nothing. --eval stops there
// too: it scores --eval-data (src/hellaswag.h) on the model, reading no token shards. --generate
// stops after step 3: it loads the model's parameters alone and prints --prompt continued
// (src/generate.h, src/sample_text.h); --sample-every N adds a sample after every N-th step.
//
// Checkpoints (src/checkpoint.h): after every --checkpoint-every-th step, after the last step, after
// the step during which SIGTERM, SIGUSR1 or SIGINT arrived (before its figures were read; later:
// after the next step; the run then exits 0; a second SIGINT ends it at once), and before a run
// stops on a shard found bad mid-run (a token id outside the vocabulary: the loader checks each
// shard as it opens it, before its first batch is used).
//
// Step k (1-based) zeroes the gradients, runs grad_accum micro-batches of forward+backward
// (their mean loss is step k's train_loss, measured with the weights before step k's update),
// then one AdamW update at lr(k) (src/lr_schedule.h). Validation runs after step k when
// k % val_every == 0 and after the last step, on the weights after that step's update: the mean
// loss over the first val_steps batches of --val-data; the HellaSwag evaluation of --eval-data
// likewise with eval_every. Each step's line has its tokens/s and MFU (src/throughput.h); the run
// ends with the mean throughput after a warm-up.
//
// Data parallel (src/comm.h): one process per GPU, started by mpirun or srun. Every rank reads its
// own part of each global batch (src/dataloader.h) and runs the same steps; losses are averaged
// over the ranks. Rank 0 alone prints the log, writes metrics.jsonl and the model file; an error on
// any rank is printed with its rank and ends that rank (the launcher then ends the others); a
// collective that stalls or fails is ended by the communicator's watchdog (src/comm_watchdog.h),
// its line named by the purpose set before each phase (comm_.set_purpose).
// Checkpoints are written by all ranks together (each its own state file, rank 0 the model file and
// the manifest) into an --out-dir all ranks share.
#include "kernels/common.cuh"
#include "src/checkpoint.h"
#include "src/checkpoint_dirs.h"
#include "src/comm.h"
#include "src/config.h"
#include "src/config_checks.h"
#include "src/config_text.h"
#include "src/config_warnings.h"
#include "src/dataloader.h"
#include "src/gpt2.h"
#include "src/hellaswag.h"
#include "src/lr_schedule.h"
#include "src/memory_plan.h"
#include "src/metrics.h"
#include "src/out_dir_lock.h"
#include "src/resume.h"
#include "src/sample_text.h"
#include "src/step_guards.h"
#include "src/throughput.h"

#include <unistd.h>

#include <chrono>
#include <csignal>
#include <exception>
#include <filesystem>
#include <memory>
#include <new>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

namespace {

// "rank N: " once there is more than one rank, for error messages.
std::string error_prefix;

// The signal (SIGTERM, SIGUSR1, SIGINT) that asked the run to stop after the current step; 0: none.
volatile std::sig_atomic_t g_stop_signal = 0;

// Ctrl-C asks for a stop like SIGTERM; a second one, for a user who will not wait for the step,
// ends the process at once the way Ctrl-C does by default (killed by SIGINT: status 130). Only
// async-signal-safe calls here.
void request_stop(int signal) {
  if (signal == SIGINT && g_stop_signal != 0) {
    struct sigaction default_action {};
    default_action.sa_handler = SIG_DFL;
    sigaction(SIGINT, &default_action, nullptr);
    raise(SIGINT);  // delivered when this handler returns
    return;
  }
  g_stop_signal = signal;
  if (signal == SIGINT) {
    static const char note[] = "\nSIGINT: stopping after this step with a checkpoint (Ctrl-C again: stop at once)\n";
    if (write(STDERR_FILENO, note, sizeof note - 1) < 0) return;
  }
}

void install_stop_handlers() {
  struct sigaction action {};
  action.sa_handler = request_stop;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // reads and writes in flight continue; the loop checks the flag
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGUSR1, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
}

const char* signal_name(int signal) {
  return signal == SIGTERM ? "SIGTERM" : signal == SIGUSR1 ? "SIGUSR1" : "SIGINT";
}

struct Run {
  TrainConfig cfg;
  int grad_accum_steps = 1;
  GPT2Config model;
  std::string model_source;  // "preset d12" or the --init-from path
  LrSchedule schedule;
  std::optional<Checkpoint> resume_from;  // --resume's checkpoint
  std::unique_ptr<TextSampler> sampler;   // --generate, --sample-every
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

// The host buffer of one micro-batch's B·T tokens; running out of memory names the bytes and the
// flags that sized them.
std::vector<int> token_buffer(const TrainConfig& cfg) {
  const size_t count = static_cast<size_t>(cfg.batch_size) * static_cast<size_t>(cfg.seq_len);
  try {
    return std::vector<int>(count);
  } catch (const std::bad_alloc&) {
    throw std::runtime_error("--batch-size " + std::to_string(cfg.batch_size) + " x --seq-len " +
                             std::to_string(cfg.seq_len) + ": cannot allocate " + thousands(count * sizeof(int)) +
                             " bytes of host memory for a micro-batch's tokens");
  }
}

// Test hooks, to test how the other ranks end when a peer fails (test/checks/distributed_*.sh).
// The environment variable NAME=RANK:STEP selects rank RANK at step STEP.
bool test_hook_selects(const char* name, int rank, long long step) {
  const char* spec = std::getenv(name);
  int hook_rank = -1;
  long long hook_step = -1;
  return spec != nullptr && std::sscanf(spec, "%d:%lld", &hook_rank, &hook_step) == 2 && hook_rank == rank &&
         hook_step == step;
}

// TRAIN_GPT_TEST_EXIT_AFTER_STEP=RANK:STEP: rank RANK exits abruptly (no cleanup, status 3) after
// step STEP: a peer that dies.
void maybe_die_for_test(int rank, long long step) {
  if (!test_hook_selects("TRAIN_GPT_TEST_EXIT_AFTER_STEP", rank, step)) return;
  std::fprintf(stderr, "rank %d: exiting after step %lld (TRAIN_GPT_TEST_EXIT_AFTER_STEP)\n", rank, step);
  std::_Exit(3);
}

// TRAIN_GPT_TEST_HANG_AT_STEP=RANK:STEP: rank RANK stops taking part at the start of step STEP and
// sleeps until it is killed: a peer that hangs.
void maybe_hang_for_test(int rank, long long step) {
  if (!test_hook_selects("TRAIN_GPT_TEST_HANG_AT_STEP", rank, step)) return;
  std::fprintf(stderr, "rank %d: hanging at step %lld (TRAIN_GPT_TEST_HANG_AT_STEP)\n", rank, step);
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

// The data a run reads: the training loader, with --val-every > 0 the validation loader, and with
// --eval-every > 0 or --eval the eval file.
struct RunData {
  std::unique_ptr<DataLoader> train, val;
  std::optional<ChoiceEvalSet> eval;
};

// Data before the model: a missing or corrupt shard fails before gigabytes are allocated. Token ids
// are checked a shard at a time as the loader first reads from it, so the first training batch
// (the training loader is then rewound) and every validation batch a validation reads are read now:
// data tokenized for another vocabulary fails before anything is written. Evaluation only
// (--max-steps 0) reads no training data, --eval only the eval file.
RunData open_data(const Run& run, int rank, int world_size, std::vector<int>& inputs, std::vector<int>& targets) {
  const TrainConfig& cfg = run.cfg;
  const uint64_t seed = static_cast<uint64_t>(cfg.seed);
  const bool eval_only = cfg.max_steps == 0;
  RunData data;
  if (cfg.eval || cfg.eval_every > 0)
    data.eval = with_context("--eval-data", [&] {
      return read_choice_eval_file(cfg.eval_data, run.model.vocab_size, cfg.seq_len);
    });
  if (cfg.eval) return data;
  if (!eval_only)
    with_context("--train-data", [&] {
      data.train = std::make_unique<DataLoader>(cfg.train_data, cfg.batch_size, cfg.seq_len, rank, world_size,
                                                cfg.shuffle, seed, run.model.vocab_size);
      data.train->next_batch(inputs.data(), targets.data());
      data.train->reset();
    });
  if (cfg.val_every > 0 || eval_only) {
    try {
      data.val = std::make_unique<DataLoader>(cfg.val_data, cfg.batch_size, cfg.seq_len, rank, world_size, false, seed,
                                              run.model.vocab_size);
    } catch (const std::exception& e) {
      throw std::runtime_error(std::string("--val-data: ") + e.what() +
                               (eval_only ? "" : " (--val-every 0 trains without validation)"));
    }
    with_context("--val-data", [&] {
      const uint64_t read = std::min<uint64_t>(static_cast<uint64_t>(cfg.val_steps), data.val->batches_per_epoch());
      for (uint64_t b = 0; b < read; ++b) data.val->next_batch(inputs.data(), targets.data());
      data.val->reset();
    });
  }
  return data;
}

// "--batch-size 8 --seq-len 1024 --recompute 1 (d12 from preset d12)": what sizes the model's memory.
std::string model_sizing(const Run& run) {
  return "--batch-size " + std::to_string(run.cfg.batch_size) + " --seq-len " + std::to_string(run.cfg.seq_len) +
         " --recompute " + std::to_string(run.cfg.recompute) + " (" + describe(run.model) + " from " +
         run.model_source + ")";
}

// The model, allocated; a failure names the flags that size it and, out of host memory, the bytes
// of its activations (a device allocation's error names its own).
template <typename Elem>
GPT2<Elem> allocate_model(const Run& run, Communicator& comm) {
  const TrainConfig& cfg = run.cfg;
  return with_context(model_sizing(run), [&] {
    try {
      return GPT2<Elem>(run.model, cfg.batch_size, cfg.seq_len, cfg.recompute, &comm, cfg.zero, cfg.attention,
                        cfg.bucket_mib);
    } catch (const std::bad_alloc&) {
      throw std::runtime_error(
          "out of host memory allocating the model (its activations alone take " +
          thousands(gpt2_activation_bytes(run.model, cfg.batch_size, cfg.seq_len, cfg.recompute, GPT2<Elem>::dtype).total()) +
          " bytes)");
    }
  });
}

cudaDeviceProp device_properties() {
  cudaDeviceProp prop;
  cuda_check(cudaGetDeviceProperties(&prop, 0), "querying the device");
  return prop;
}

// ---- The memory plan (src/memory_plan.h): --plan, and the check before a run allocates.

constexpr double kBytesPerGiB = 1073741824.0;

// Positions of rank 0's --sample-every decoder: the sampler's (prompt + --max-new-tokens - 1), or
// without one (--plan reads no vocabulary) the model's context, the most it can be; 0: no sampling.
int sampling_positions(const TrainConfig& cfg, const GPT2Config& model, const TextSampler* sampler) {
  if (cfg.sample_every == 0) return 0;
  return sampler != nullptr ? sampler->cache_positions() : model.max_seq_len;
}

MemoryPlan run_memory_plan(const TrainConfig& cfg, const GPT2Config& model, int batch_size, int recompute, int world,
                           int sample_positions) {
  return plan_memory(model, batch_size, cfg.seq_len, recompute, dtype_named(cfg.dtype),
                     cfg.zero, world, cfg.bucket_mib, sample_positions);
}

// "largest --batch-size that fits: --recompute 0: 3, 1: 5, 2: 6, 3: 9" (0: not even 1).
std::string fitting_batch_sizes(const TrainConfig& cfg, const GPT2Config& model, int world, size_t budget,
                                int sample_positions) {
  std::string out = "largest --batch-size that fits " + format_bytes(budget) + ":";
  for (int r = 0; r <= kRecomputeMax; ++r)
    out += std::string(r == 0 ? "" : ",") + " --recompute " + std::to_string(r) + ": " +
           std::to_string(largest_fitting_batch(model, cfg.seq_len, r, dtype_named(cfg.dtype),
                                                cfg.zero, world, budget, cfg.bucket_mib, sample_positions));
  return out;
}

// --plan: each rank's device memory for --world-size ranks, against --gpu-memory or the device's
// total memory (none without a device). Reads only the model's architecture: no data, no GPU
// needed, nothing written.
int print_memory_plan(TrainConfig cfg) {
  if (!cfg.resume.empty())
    throw std::invalid_argument("--plan takes the architecture from --model or --init-from, not --resume");
  const int world = cfg.world_size > 0 ? cfg.world_size : 1;
  validate_config(cfg, world);
  std::string source;
  const GPT2Config model = resolve_model(cfg, std::nullopt, &source);
  validate_against_model(cfg, model.max_seq_len, source);
  gpt2_check_micro_batch(model, cfg.batch_size, cfg.seq_len, cfg.recompute);
  size_t budget = static_cast<size_t>(cfg.gpu_memory * kBytesPerGiB);
  int devices = 0;
  if (budget == 0 && cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0)
    budget = device_properties().totalGlobalMem;
  const int sampling = sampling_positions(cfg, model, nullptr);
  const MemoryPlan plan = run_memory_plan(cfg, model, cfg.batch_size, cfg.recompute, world, sampling);
  std::printf("memory plan per rank: %s (%s parameters) from %s, --batch-size %d --seq-len %d, %s, --recompute %d, "
              "ZeRO stage %d over %d rank(s)\n%s",
              describe(model).c_str(), thousands(ParameterLayout(model).total).c_str(), source.c_str(), cfg.batch_size,
              cfg.seq_len, cfg.dtype.c_str(), cfg.recompute, effective_zero_stage(cfg.zero, world), world,
              format_memory_plan(plan, budget).c_str());
  if (budget > 0) std::printf("%s\n", fitting_batch_sizes(cfg, model, world, budget, sampling).c_str());
  else std::printf("no device and no --gpu-memory: pass --gpu-memory GiB to see what fits\n");
  std::printf("not counted: the CUDA context and NCCL's buffers (leave ~1 GiB per GPU)\n");
  return 0;
}

// Before a run allocates: its plan against --gpu-memory or the device's free memory. A run that
// would not fit stops here with the plan, not with an out-of-memory error halfway through.
void check_memory_fits(const Run& run, int world) {
  const TrainConfig& cfg = run.cfg;
  size_t budget = static_cast<size_t>(cfg.gpu_memory * kBytesPerGiB), total = 0;
  const char* source = "--gpu-memory";
  if (budget == 0) {
    cuda_check(cudaMemGetInfo(&budget, &total), "querying free device memory");
    source = "free device memory";
  }
  const int sampling = sampling_positions(cfg, run.model, run.sampler.get());
  const MemoryPlan plan = run_memory_plan(cfg, run.model, cfg.batch_size, cfg.recompute, world, sampling);
  if (plan.total() <= budget) return;
  std::printf("memory plan per rank (%s):\n%s", model_sizing(run).c_str(), format_memory_plan(plan, budget).c_str());
  std::fflush(stdout);
  throw std::runtime_error("the run needs " + format_bytes(plan.total()) + " of device memory per rank and " + source +
                           " is " + format_bytes(budget) + "; " + fitting_batch_sizes(cfg, run.model, world, budget, sampling) +
                           " (see --plan)");
}

// One run's training: set-up (data, model, output directory), then the loop of steps, each
// followed by its log line, validation and checkpoint when due.
template <typename Elem>
class Trainer {
 public:
  Trainer(const Run& run, Communicator& comm)
      : run_(run),
        cfg_(run.cfg),
        comm_(comm),
        lead_(comm.rank() == 0),
        eval_only_(cfg_.max_steps == 0),
        flops_per_token_(flops_per_token(run.model, cfg_.seq_len)),
        throughput_(cfg_.max_steps),
        inputs_(token_buffer(cfg_)),
        targets_(token_buffer(cfg_)),
        data_(open_data(run, comm.rank(), comm.world_size(), inputs_, targets_)),
        model_(allocate_model<Elem>(run, comm)),
        model_path_(cfg_.out_dir + "/model.bin"),
        save_dtype_(cfg_.save_dtype.empty() ? GPT2<Elem>::dtype
                                            : dtype_named(cfg_.save_dtype)) {
    initialize_model();
    last_checkpoint_step_ = state_.step;
    if (run_.resume_from) last_checkpoint_dir_ = run_.resume_from->path;
    if (lead_)
      for (const std::string& w : config_warnings(cfg_, run_.grad_accum_steps, data_.val ? data_.val->batches_per_epoch() : 0))
        std::fprintf(stderr, "warning: %s\n", w.c_str());
    print_summary();
    if (lead_ && !eval_only_ && !cfg_.eval) open_out_dir();
    if (lead_ && !eval_only_ && !cfg_.eval && cfg_.sample_every > 0)
      decoder_ = std::make_unique<KvCacheDecoder<Elem>>(model_.config(), model_.params_device(),
                                                        run_.sampler->cache_positions(), model_.attention(),
                                                        model_.stream());
    opt_.beta1 = static_cast<float>(cfg_.beta1);
    opt_.beta2 = static_cast<float>(cfg_.beta2);
    opt_.eps = static_cast<float>(cfg_.adam_eps);
    opt_.weight_decay = static_cast<float>(cfg_.weight_decay);
    opt_.grad_clip = static_cast<float>(cfg_.grad_clip);
    opt_.seed = state_.seed;
  }

  void run() {
    if (cfg_.eval) {
      evaluate_choices_only();
      return;
    }
    if (eval_only_) {
      evaluate();
      return;
    }
    if (run_.resume_from) {
      std::printf("resumed from %s: %lld step(s) done, %llu update(s) skipped so far\n", run_.resume_from->path.c_str(),
                  state_.step, static_cast<unsigned long long>(state_.guards.skipped_total()));
      if (state_.step >= cfg_.max_steps) {
        std::printf("the checkpoint already reached --max-steps %lld: nothing to train\n", cfg_.max_steps);
        finish();
        return;
      }
    }
    install_stop_handlers();
    for (long long step = state_.step + 1; step <= cfg_.max_steps; ++step) {
      maybe_hang_for_test(comm_.rank(), step);
      StepRecord record;
      try {
        record = train_step(step);
      } catch (const ShardDataError& e) {
        stop_on_bad_shard("--train-data", e);
      }
      log_step(record);
      maybe_die_for_test(comm_.rank(), step);
      if (data_.val && (step % cfg_.val_every == 0 || step == cfg_.max_steps)) {
        try {
          validate(step);
        } catch (const ShardDataError& e) {
          stop_on_bad_shard("--val-data", e);
        }
      }
      if (data_.eval && (step % cfg_.eval_every == 0 || step == cfg_.max_steps)) evaluate_choices(step);
      if (decoder_ && step % cfg_.sample_every == 0) log_sample(step);
      const int stop_signal = agreed_stop_signal();
      if (stop_signal != 0 || step == cfg_.max_steps || (cfg_.checkpoint_every > 0 && step % cfg_.checkpoint_every == 0))
        save_checkpoint();
      if (stop_signal != 0) {
        save_final_model();
        print_throughput();
        std::printf("received %s: stopped after step %lld of %lld, checkpoint written; continue with --resume auto\n",
                    signal_name(stop_signal), step, cfg_.max_steps);
        comm_.barrier();
        return;
      }
    }
    print_skipped_updates();
    print_throughput();
    finish();
  }

 private:
  // "after step 7": when the collectives outside a step run, for the watchdog's messages.
  std::string after_step() const { return "after step " + std::to_string(state_.step); }

  // --resume's checkpoint, --init-from's weights, or a seeded random init.
  void initialize_model() {
    state_.seed = static_cast<uint64_t>(cfg_.seed);
    state_.guards.loss_z_limit = cfg_.skip_loss_z;
    state_.guards.norm_z_limit = cfg_.skip_norm_z;
    if (run_.resume_from && cfg_.eval) {
      with_context("--resume " + run_.resume_from->path, [&] { model_.load(run_.model_source); });
    } else if (run_.resume_from) {
      with_context("--resume " + run_.resume_from->path, [&] {
        load_checkpoint(*run_.resume_from, model_, &state_);
        check_global_batch(state_.train_data.global_batch_tokens);
        if (data_.train) data_.train->restore(state_.train_data);
      });
    } else if (!cfg_.init_from.empty()) {
      with_context("--init-from", [&] { model_.load(cfg_.init_from); });
    } else {
      model_.init_random(static_cast<uint64_t>(cfg_.seed));
    }
  }

  // A checkpoint resumes on any number of ranks (its optimizer state is resharded) if each
  // micro-step still reads the same tokens: ranks × --batch-size × --seq-len as written.
  void check_global_batch(uint64_t written) const {
    const uint64_t ranks = static_cast<uint64_t>(comm_.world_size());
    const uint64_t row = static_cast<uint64_t>(cfg_.seq_len), now = ranks * cfg_.batch_size * row;
    if (written == now) return;
    throw std::runtime_error(
        "written with a global micro-batch of " + std::to_string(written) +
        " tokens (ranks x --batch-size x --seq-len), this run's is " + std::to_string(now) + ": " +
        (written % (ranks * row) == 0 ? "with " + std::to_string(ranks) + " rank(s) use --batch-size " +
                                            std::to_string(written / (ranks * row))
                                      : "no --batch-size gives it with " + std::to_string(ranks) + " rank(s)"));
  }

  void print_summary() const {
    const cudaDeviceProp prop = device_properties();
    const int B = cfg_.batch_size, seq_len = cfg_.seq_len, world_size = comm_.world_size();
    const ActivationBytes acts = gpt2_activation_bytes(run_.model, B, seq_len, model_.recompute(), GPT2<Elem>::dtype);
    // What the model allocated, by the plan's terms (equal: test/simt_counters.cpp).
    const MemoryPlan plan = run_memory_plan(cfg_, run_.model, B, model_.recompute(), world_size,
                                            sampling_positions(cfg_, run_.model, run_.sampler.get()));
    const size_t param_bytes = term_bytes(plan, "parameters"), grad_bytes = term_bytes(plan, "gradients"),
                 optim_bytes = term_bytes(plan, "master weights (fp32)") + term_bytes(plan, "AdamW moments (fp32)"),
                 act_bytes = acts.total();
    std::printf("train_gpt\nconfig:\n%s", config_summary(cfg_).c_str());
    std::printf("device: %s (%s)\n", prop.name, mib(prop.totalGlobalMem).c_str());
    std::printf("model: %s from %s, %s parameters, %s attention\n", describe(run_.model).c_str(),
                run_.model_source.c_str(), thousands(model_.num_parameters()).c_str(),
                attention_name(model_.attention()));
    std::printf("memory: parameters+gradients %s, optimizer %s, activations %s, total %s\n",
                mib(plan.total() - optim_bytes - act_bytes).c_str(), mib(optim_bytes).c_str(), mib(act_bytes).c_str(),
                mib(plan.total()).c_str());
    std::printf("activations at --recompute %d: blocks %s, logits and buffers %s; blocks at --recompute",
                model_.recompute(), mib(acts.blocks).c_str(), mib(acts.other).c_str());
    for (int r = 0; r <= kRecomputeMax; ++r)
      std::printf(" %d: %s%s", r, mib(gpt2_activation_bytes(run_.model, B, seq_len, r, GPT2<Elem>::dtype).blocks).c_str(),
                  r < kRecomputeMax ? "," : "\n");
    std::printf("batch: %lld tokens per step = %d x %d tokens x %d rank(s) x %d accumulation step(s)\n",
                cfg_.total_batch_tokens, B, seq_len, world_size, run_.grad_accum_steps);
    const char* separator = "";
    if (data_.train) {
      std::printf("train data: %zu shard(s), %s tokens", data_.train->num_shards(),
                  thousands(data_.train->tokens_in_shards()).c_str());
      separator = "; ";
    }
    if (data_.val)
      std::printf("%sval data: %zu shard(s), %s tokens", separator, data_.val->num_shards(),
                  thousands(data_.val->tokens_in_shards()).c_str());
    std::printf("\n");
    if (data_.eval)
      std::printf("eval data: %s, %zu examples (%zu completions); %lld context(s) cut from the left to fit --seq-len "
                  "%d\n",
                  data_.eval->path.c_str(), data_.eval->examples.size(), data_.eval->completions, data_.eval->truncated,
                  seq_len);
    if (!eval_only_ && !cfg_.eval) {  // a run that trains: what its MFU is measured against
      if (peak_)
        std::printf("throughput: %.4g FLOPs per token (6N + 12LCT), MFU against %.6g TFLOP/s per GPU (%s)\n",
                    flops_per_token_, peak_->tflops, peak_->gpu.c_str());
      else
        std::printf("throughput: %.4g FLOPs per token (6N + 12LCT); MFU: n/a (unknown GPU; pass --peak-tflops)\n",
                    flops_per_token_);
    }
    std::printf("distributed: world size %d (%s), ZeRO stage %d; per rank: parameters %zu bytes, gradients %zu bytes, "
                "optimizer state %zu bytes\n",
                world_size, comm_.launcher().c_str(), model_.zero_stage(),
                param_bytes, grad_bytes, optim_bytes);
    std::fflush(stdout);
  }

  // Rank 0: --out-dir exists and is this run's alone (its lock, held until the run ends), takes a
  // file and has room for the checkpoints on disk at once and the final model file; metrics.jsonl
  // truncated, or kept up to the checkpoint's step on resume (a damaged line is reported).
  void open_out_dir() {
    std::error_code ec;
    std::filesystem::create_directories(cfg_.out_dir, ec);
    if (ec) throw std::runtime_error("--out-dir " + cfg_.out_dir + ": cannot create the directory: " + ec.message());
    with_context("--out-dir", [&] {
      lock_ = std::make_unique<OutDirLock>(cfg_.out_dir);
      std::vector<long long> existing;
      for (const CheckpointDir& d : list_checkpoint_dirs(cfg_.out_dir))
        if (d.step <= state_.step) existing.push_back(d.step);
      const uint64_t at_once = checkpoints_at_once(state_.step, cfg_.max_steps, cfg_.checkpoint_every,
                                                   cfg_.keep_checkpoints, cfg_.keep_every, existing);
      const uint64_t each = checkpoint_bytes(model_.num_parameters(), sizeof(Elem),
                                             model_.gradient_sync().state_count(), comm_.world_size());
      const uint64_t model_file_bytes = kHeaderBytes + model_.num_parameters() * (save_dtype_ == DType::fp32 ? 4 : 2);
      const uint64_t checkpoints = at_once > UINT64_MAX / each ? UINT64_MAX : at_once * each;
      const uint64_t needed = checkpoints > UINT64_MAX - model_file_bytes ? UINT64_MAX : checkpoints + model_file_bytes;
      const std::string what =
          std::to_string(at_once) + " checkpoint(s) of " + mib(each) + " at once (--checkpoint-every " +
          std::to_string(cfg_.checkpoint_every) + ", --keep-checkpoints " + std::to_string(cfg_.keep_checkpoints) +
          (cfg_.keep_every > 0 ? ", --keep-every " + std::to_string(cfg_.keep_every) : "") +
          ") and the final model file";
      std::printf("disk: %s need %s%s\n", what.c_str(), mib(needed).c_str(),
                  cfg_.keep_every > 0 && cfg_.keep_checkpoints > 0
                      ? " (the checkpoints --keep-every keeps for good are counted up to --max-steps; a run continued "
                        "beyond it needs more)"
                      : "");
      std::fflush(stdout);
      check_output_directory(cfg_.out_dir, needed, what);
    });
    const std::string metrics_path = cfg_.out_dir + "/metrics.jsonl";
    if (run_.resume_from)
      for (const std::string& damaged : keep_metrics_through_step(metrics_path, state_.step))
        std::fprintf(stderr, "warning: --resume: %s\n", damaged.c_str());
    metrics_ = std::make_unique<MetricsLog>(metrics_path, run_.resume_from.has_value());
  }

  // Step k (1-based): grad_accum micro-batches of forward+backward, then one AdamW update at lr(k)
  // unless a bad-step guard skips it.
  StepRecord train_step(long long step) {
    const auto start = std::chrono::steady_clock::now();
    const std::string at_step = "at step " + std::to_string(step);
    comm_.set_purpose("gradients", at_step);
    model_.zero_grad();
    for (int micro = 0; micro < run_.grad_accum_steps; ++micro) {
      data_.train->next_batch(inputs_.data(), targets_.data());  // a ShardDataError goes to run()
      model_.forward_backward(inputs_.data(), targets_.data(), run_.grad_accum_steps,
                              micro + 1 == run_.grad_accum_steps);
    }
    // The step's one host synchronisation. The same loss, norm and stop votes on every rank, so
    // every rank takes the same skip and stop decisions; the update is queued behind it and runs
    // while the host reads the next batch.
    comm_.set_purpose("the loss, gradient norm and stop votes", at_step);
    const auto figures = model_.step_figures(g_stop_signal != 0);
    stop_votes_ = static_cast<int>(figures.stop_votes);
    StepRecord record;
    record.train_loss = figures.loss;
    record.lr = run_.schedule.at(step);
    record.grad_norm = figures.grad_norm;
    record.skipped = state_.guards.check(record.train_loss, figures.grad_norm);
    comm_.set_purpose("updated parameters", at_step);
    if (record.skipped.empty())
      model_.apply_update(opt_, static_cast<float>(record.lr), static_cast<int>(step), figures.grad_norm);
    state_.step = step;
    state_.train_data = data_.train->position();
    record.step = step;
    record.total_steps = cfg_.max_steps;
    record.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    clock_.add(record.ms);
    record.tokens_per_s = static_cast<double>(cfg_.total_batch_tokens) / (record.ms / 1000.0);
    if (peak_) record.mfu = mfu(record.tokens_per_s, flops_per_token_, comm_.world_size(), *peak_);
    throughput_.add(record.ms, static_cast<double>(cfg_.total_batch_tokens));
    record.eta_seconds = clock_.eta_seconds(cfg_.max_steps - step);
    return record;
  }

  void log_step(const StepRecord& record) {
    std::printf("%s\n", format_step_line(record).c_str());
    std::fflush(stdout);
    if (lead_) metrics_->train_step(record);
  }

  // The mean loss over the first val_steps batches of --val-data, on the current weights.
  double validation_loss() {
    comm_.set_purpose("the validation loss", after_step());
    data_.val->reset();
    double val_sum = 0.0;
    for (long long v = 0; v < cfg_.val_steps; ++v) {
      data_.val->next_batch(inputs_.data(), targets_.data());  // a ShardDataError goes to run()
      val_sum += model_.forward(inputs_.data(), targets_.data());
    }
    return comm_.sum(val_sum / static_cast<double>(cfg_.val_steps)) / comm_.world_size();
  }

  // Validation after `step`: its log line and record.
  void validate(long long step) {
    const double val_loss = validation_loss();
    std::printf("%s\n", format_val_line(step, cfg_.max_steps, val_loss).c_str());
    std::fflush(stdout);
    if (lead_) metrics_->validation(step, val_loss);
  }

  // Rank 0's sample after `step` (--sample-every): --prompt continued by the current weights, with
  // draws seeded by --seed and the step (a resumed run draws the same ones); its log line and record.
  void log_sample(long long step) {
    const TextSampler& sampler = *run_.sampler;
    const std::vector<int> tokens = generate_tokens(*decoder_, sampler.prompt(), sampler.max_new_tokens(),
                                                    sampler.settings(static_cast<uint64_t>(step)));
    const std::string text = cfg_.prompt + sampler.decode(tokens);
    std::printf("%s\n", format_sample_line(step, cfg_.max_steps, text).c_str());
    std::fflush(stdout);
    metrics_->sample(step, text);
  }

  // --max-steps 0: the model as given (--init-from, --resume's checkpoint or the random init),
  // validated on --val-data; nothing is written.
  void evaluate() {
    const double val_loss = with_context("--val-data", [&] { return validation_loss(); });
    std::printf("val loss %.6f (%lld batch(es) of %d x %d tokens per rank, the model after step %lld); --max-steps 0: "
                "evaluation only, nothing written\n",
                val_loss, cfg_.val_steps, cfg_.batch_size, cfg_.seq_len, state_.step);
    std::fflush(stdout);
    comm_.barrier();
  }

  // Every completion's summed loss over --eval-data (src/hellaswag.h), on the current weights; each
  // rank scores its examples, the sums are added over the ranks.
  std::vector<double> eval_completion_losses() {
    comm_.set_purpose("the eval's completion losses", after_step());
    std::vector<double> sums = completion_loss_sums(
        *data_.eval, comm_.rank(), comm_.world_size(), cfg_.batch_size, cfg_.seq_len,
        [&](const int* inputs, const int* targets) {
          model_.forward(inputs, targets);
          return model_.position_losses();
        });
    if (comm_.world_size() > 1 && !sums.empty()) {
      // One rank holds each value, the others 0: the sum over ranks is exact.
      DeviceArray<double> buffer(sums.size(), "the eval's completion losses");
      cuda_check(cudaMemcpy(buffer.get(), sums.data(), buffer.bytes(), cudaMemcpyHostToDevice), "eval losses");
      // The copy ran on the legacy stream, which the (non-blocking) communication stream does not
      // wait for by itself; a pageable upload may still be in flight when cudaMemcpy returns.
      comm_.wait_for(cudaStreamLegacy);
      comm_.all_reduce(buffer.get(), sums.size(), ncclSum);
      cuda_check(cudaStreamSynchronize(comm_.stream()), "eval losses");
      cuda_check(cudaMemcpy(sums.data(), buffer.get(), buffer.bytes(), cudaMemcpyDeviceToHost), "eval losses");
    }
    return sums;
  }

  // The HellaSwag evaluation after `step`: its log line and record.
  void evaluate_choices(long long step) {
    const ChoiceResult result = score_choices(*data_.eval, eval_completion_losses());
    std::printf("%s\n", format_hellaswag_line(step, cfg_.max_steps, result).c_str());
    std::fflush(stdout);
    if (lead_) metrics_->hellaswag(step, result);
  }

  // --eval: the model as given scored on --eval-data; with --eval-losses, rank 0 writes each
  // example's completion losses (sum and mean per completion).
  void evaluate_choices_only() {
    const auto start = std::chrono::steady_clock::now();
    const std::vector<double> sums = eval_completion_losses();
    const ChoiceResult result = score_choices(*data_.eval, sums);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("%s | %s, %s (%.1f s); --eval: nothing else written\n", format_hellaswag(result).c_str(),
                cfg_.eval_data.c_str(), run_.model_source.c_str(), seconds);
    std::fflush(stdout);
    if (lead_ && !cfg_.eval_losses.empty()) {
      std::string lines;
      size_t at = 0;
      for (size_t i = 0; i < data_.eval->examples.size(); ++i) {
        const ChoiceExample& ex = data_.eval->examples[i];
        nlohmann::ordered_json sum = nlohmann::json::array(), mean = nlohmann::json::array();
        for (size_t k = 0; k < ex.completions.size(); ++k, ++at) {
          sum.push_back(sums[at]);
          mean.push_back(sums[at] / static_cast<double>(ex.completions[k].size()));
        }
        lines += nlohmann::ordered_json{{"example", i}, {"label", ex.label}, {"loss_sum", sum}, {"loss_mean", mean}}
                     .dump() + "\n";
      }
      with_context("--eval-losses", [&] {
        AtomicFileWriter out(cfg_.eval_losses);
        out.write(lines.data(), lines.size());
        out.commit();
      });
    }
    comm_.barrier();
  }

  // The mean throughput after the warm-up (ThroughputMeter), one line.
  void print_throughput() const {
    if (throughput_.steps() == 0) return;
    const double tokens_per_s = throughput_.tokens_per_s();
    std::string mfu_text = "MFU n/a";
    if (peak_) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "MFU %.1f%%", 100.0 * mfu(tokens_per_s, flops_per_token_, comm_.world_size(), *peak_));
      mfu_text = buf;
    }
    const long long warmup = throughput_.warmup_steps();
    std::printf("throughput: %.0f tokens/s, %.1f ms/step, %s (mean over %lld step(s)%s)\n", tokens_per_s,
                throughput_.ms_per_step(), mfu_text.c_str(), throughput_.measured_steps(),
                warmup > 0 ? (", after " + std::to_string(warmup) + " warm-up step(s)").c_str() : ", no warm-up left out");
  }

  // A shard of `flag` found bad mid-run (a token id outside the vocabulary, a failed read): the
  // steps done so far are kept in a checkpoint of the last completed step (unless there is one of
  // it already; a step cut short changed no weights), then the run stops naming the shard. Every
  // rank reads the same shards in the same order, so all ranks get here at the same step.
  [[noreturn]] void stop_on_bad_shard(const char* flag, const ShardDataError& e) {
    if (state_.step > last_checkpoint_step_) save_checkpoint();
    const std::string kept = state_.step == 0 ? "no step was completed"
                                              : "the " + std::to_string(state_.step) + " completed step(s) are in " +
                                                    last_checkpoint_dir_;
    throw std::runtime_error(std::string(flag) + ": " + e.what() + "; " + kept +
                             " (replace the shard, then continue with --resume auto)");
  }

  // The signal that stops the run after this step (0: none): every rank stops after the same step
  // when any of them had been signalled by the time of the step's figures (the votes travel with
  // the loss); a signal that comes later stops the run after the next step.
  int agreed_stop_signal() const {
    if (stop_votes_ == 0) return 0;
    return g_stop_signal != 0 ? static_cast<int>(g_stop_signal) : SIGTERM;
  }

  // Every rank writes its state file; rank 0 the model file and the manifest, then applies retention.
  void save_checkpoint() {
    comm_.set_purpose("the checkpoint", after_step());
    CheckpointWriteInfo info;
    info.rank = comm_.rank();
    info.world_size = comm_.world_size();
    info.zero_stage = model_.zero_stage();
    info.config = config_json(cfg_);
    const std::string dir = write_checkpoint(cfg_.out_dir, model_, state_, info, &comm_);
    last_checkpoint_step_ = state_.step;
    last_checkpoint_dir_ = dir;
    std::printf("checkpoint %s\n", dir.c_str());
    if (lead_)
      for (const std::string& old : prune_checkpoints(cfg_.out_dir, state_.step, cfg_.keep_checkpoints, cfg_.keep_every))
        std::printf("deleted old checkpoint %s\n", old.c_str());
    std::fflush(stdout);
  }

  void print_skipped_updates() const {
    const BadStepGuards& g = state_.guards;
    if (g.skipped_total() == 0) return;
    std::printf("updates skipped: %llu (non-finite %llu, loss z-score %llu, gradient-norm z-score %llu)\n",
                static_cast<unsigned long long>(g.skipped_total()), static_cast<unsigned long long>(g.skipped_nonfinite),
                static_cast<unsigned long long>(g.skipped_loss_z), static_cast<unsigned long long>(g.skipped_norm_z));
  }

  // The final model file (rank 0), then a barrier: no rank tears down its communicator while
  // another still needs it.
  void finish() {
    comm_.set_purpose("the end of the run", after_step());
    save_final_model();
    std::printf("saved %s\n", model_path_.c_str());
    comm_.barrier();
  }

  // DIR/model.bin (rank 0), in --save-dtype.
  void save_final_model() const {
    if (lead_) write_model_file(model_path_, model_.config(), model_.params_device(), save_dtype_, model_.stream());
  }

  const Run& run_;
  const TrainConfig& cfg_;
  Communicator& comm_;
  const bool lead_;
  const bool eval_only_;  // --max-steps 0
  const double flops_per_token_;
  const std::optional<Peak> peak_ = device_peak(device_properties().name, cfg_.peak_tflops);  // none: unknown GPU
  ThroughputMeter throughput_;
  std::vector<int> inputs_, targets_;
  RunData data_;
  GPT2<Elem> model_;
  const std::string model_path_;
  const DType save_dtype_;  // of model_path_
  TrainingState state_;
  long long last_checkpoint_step_ = 0;  // the newest checkpoint of this run's steps (step 0: none)
  std::string last_checkpoint_dir_;
  OptimizerSettings opt_;
  std::unique_ptr<OutDirLock> lock_;  // rank 0; released after metrics_ is closed
  std::unique_ptr<MetricsLog> metrics_;
  std::unique_ptr<KvCacheDecoder<Elem>> decoder_;  // rank 0 of a run with --sample-every
  int stop_votes_ = 0;  // ranks that had a stop signal at the last step's figures
  StepClock clock_;
};

// --generate: the prompt and its continuation on stdout, token by token as they come, then a
// summary on stderr; nothing is written. The model's parameters alone are loaded (no gradients or
// optimizer state).
template <typename Elem>
void generate_text(const Run& run) {
  const TrainConfig& cfg = run.cfg;
  const std::string path = run.resume_from ? run.resume_from->path + "/" + kModelFileName : cfg.init_from;
  GPT2Config model;
  const DeviceArray<Elem> params =
      with_context(cfg.init_from.empty() ? "--resume" : "--init-from", [&] { return load_model_parameters<Elem>(path, &model); });
  const TextSampler& sampler = *run.sampler;
  const CudaStream stream("creating the generation's CUDA stream");
  const DType dtype = std::is_same<Elem, float>::value ? DType::fp32 : DType::bf16;
  KvCacheDecoder<Elem> decoder(model, params.get(), sampler.cache_positions(), choose_attention(cfg.attention, dtype, model),
                               stream.get());
  std::printf("%s", cfg.prompt.c_str());
  std::fflush(stdout);
  const auto start = std::chrono::steady_clock::now();
  std::optional<std::chrono::steady_clock::time_point> first;  // the first token's: the prefill's end
  const std::vector<int> tokens = generate_tokens(decoder, sampler.prompt(), sampler.max_new_tokens(),
                                                  sampler.settings(), [&](int token, const std::vector<float>&) {
    if (!first) first = std::chrono::steady_clock::now();
    std::printf("%s", sampler.decode({token}).c_str());
    std::fflush(stdout);
  });
  const auto end = std::chrono::steady_clock::now();
  std::printf("\n");
  std::fflush(stdout);
  const double prefill_ms = std::chrono::duration<double, std::milli>(*first - start).count();
  const double decode_ms = std::chrono::duration<double, std::milli>(end - *first).count();
  std::fprintf(stderr, "generated %zu token(s) after a %zu-token prompt (%s; %s, %s): prefill %.1f ms, %.2f ms/token\n",
               tokens.size(), sampler.prompt().size(), sampler.describe_settings().c_str(), run.model_source.c_str(),
               dtype_name(dtype), prefill_ms, tokens.size() > 1 ? decode_ms / static_cast<double>(tokens.size() - 1) : 0.0);
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
  if (run.cfg.plan) return print_memory_plan(run.cfg);

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
  if (run.cfg.generate || run.cfg.sample_every > 0)
    run.sampler = std::make_unique<TextSampler>(run.cfg, run.model, run.model_source);
  if (run.cfg.generate) {  // the training flags (--seq-len, --batch-size) do not apply
    if (run.cfg.dtype == "fp32") generate_text<float>(run);
    else generate_text<bf16>(run);
    return 0;
  }
  validate_against_model(run.cfg, run.model.max_seq_len, run.model_source);
  with_context("model " + run.model_source,
               [&] { choose_attention(run.cfg.attention, dtype_named(run.cfg.dtype), run.model); });
  with_context(model_sizing(run), [&] {
    gpt2_check_micro_batch(run.model, run.cfg.batch_size, run.cfg.seq_len, run.cfg.recompute);
  });
  check_memory_fits(run, comm->world_size());
  if (run.cfg.dtype == "fp32") Trainer<float>(run, *comm).run();
  else Trainer<bf16>(run, *comm).run();
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
