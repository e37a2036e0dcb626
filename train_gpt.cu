// train_gpt — pretrains GPT-2 family models: flags → config → model/optimizer/data → loop.
//
// Order of a run (nothing on disk is created or truncated before every input is checked):
//   1. flags and --config (src/config/config.h; every value UTF-8 text); cross-flag checks
//   2. the device (without one: a one-line pointer to the CPU build)
//   3. the model architecture (--init-from's header or the --model preset), --seq-len against it
//   4. the data: every shard's header and size; the token ids of the first training shard and of
//      the validation shards the validation reads, against the vocab
//   5. the model: allocation, then --init-from's weights or a seeded random init
//   6. --out-dir: its lock (one run at a time), other or abandoned histories' files set aside,
//      free space for the checkpoints kept at once, DIR/metrics.jsonl; the training loop;
//      DIR/model.bin
// With --resume, the checkpoint is chosen and checked right after step 1 and replaces --init-from
// and --model in steps 3 and 5; metrics.jsonl keeps its records up to the checkpoint's step. What
// a run may do to --out-dir's files is decided then too (src/ckpt/out_dir_history.h): a fresh run
// refuses another run's files unless --overwrite; a rewind moves the later checkpoints aside.
// --max-steps 0 stops after step 5: it validates the model and writes nothing. --eval stops there
// too: it scores --eval-data (src/data/hellaswag.h) on the model, reading no token shards. --generate
// stops after step 3: it loads the model's parameters alone and prints --prompt continued
// (src/gen/generate.h, src/gen/sample_text.h); --sample-every N adds a sample after every N-th step.
//
// Checkpoints (src/ckpt/checkpoint.h): after every --checkpoint-every-th step, after the last step, after
// the step during which SIGTERM, SIGUSR1 or SIGINT arrived (before its figures were read; later:
// after the next step; the run then exits 0; a second SIGINT ends it at once; one during start-up
// ends the command before anything is written, status 0, interrupting a read that blocks), and before a run
// stops on a shard found bad mid-run (a token id outside the vocabulary: the loader checks each
// shard as it opens it, before its first batch is used).
//
// Step k (1-based) zeroes the gradients, runs grad_accum micro-batches of forward+backward
// (their mean loss is step k's train_loss, measured with the weights before step k's update),
// then one AdamW update at lr(k) (src/config/lr_schedule.h). Validation runs after step k when
// k % val_every == 0 and after the last step, on the weights after that step's update: the mean
// loss over the first val_steps batches of --val-data; the HellaSwag evaluation of --eval-data
// likewise with eval_every. Each step's line has its tokens/s and MFU (src/run/throughput.h); the run
// ends with the mean throughput after a warm-up.
//
// Data parallel (src/dist/comm.h): one process per GPU, started by mpirun or srun. Every rank reads its
// own part of each global batch (src/data/dataloader.h) and runs the same steps; losses are averaged
// over the ranks. Rank 0 alone prints the log, writes metrics.jsonl and the model file; an error on
// any rank is printed with its rank and ends that rank (the launcher then ends the others); a
// collective that stalls or fails is ended by the communicator's watchdog (src/dist/comm_watchdog.h),
// its line named by the purpose set before each phase (set_purpose). With --tp N the ranks form
// data-parallel × tensor-parallel groups (src/dist/parallel_groups.h): each TP group splits every
// layer over its N ranks and reads one micro-batch; the data-parallel groups read different ones.
// Checkpoints are written by all ranks together (each its own state file, rank 0 the model file and
// the manifest) into an --out-dir all ranks share.
#include "kernels/common.cuh"
#include "src/base/error_context.h"
#include "src/ckpt/resume.h"
#include "src/config/config.h"
#include "src/config/config_checks.h"
#include "src/config/config_text.h"
#include "src/dist/comm.h"
#include "src/dist/parallel_groups.h"
#include "src/dist/pipeline_stages.h"
#include "src/dist/tensor_split.h"
#include "src/gen/generate_text.h"
#include "src/model/activations.h"
#include "src/model/attention.h"
#include "src/model/fp8_state.h"
#include "src/run/eval_report.h"
#include "src/run/plan_report.h"
#include "src/run/run_setup.h"
#include "src/run/stop_signals.h"
#include "src/run/trainer.h"

#include <chrono>
#include <cstdio>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>

namespace {

// "rank N: " once there is more than one rank, for error messages.
std::string error_prefix;
// What a stop signal during start-up keeps from happening ("stopped before training").
const char* start_up_stage = "training";

// --generate: the training flags (--seq-len, --batch-size) do not apply. A stop signal during
// start-up ends it before it prints; one while it generates ends the process (default actions).
void generate(const RunSetup& setup) {
  restore_default_stop_handlers();
  if (pending_stop_signal() != 0) throw StopDuringStartUp(pending_stop_signal(), "generating");
  const bool resumed = setup.resume_from.has_value();
  const std::string path = resumed ? setup.resume_from->path + "/" + kModelFileName : setup.cfg.init_from;
  const char* flag = resumed ? "--resume" : "--init-from";
  if (setup.cfg.dtype == "fp32") generate_text<float>(setup.cfg, flag, path, setup.model_source, *setup.sampler);
  else generate_text<bf16>(setup.cfg, flag, path, setup.model_source, *setup.sampler);
}

// Training, or evaluation alone: --eval scores --eval-data, --max-steps 0 validates.
template <typename Elem>
void train_or_evaluate(const RunSetup& setup, ParallelGroups& groups) {
  Trainer<Elem> trainer(setup, groups);
  if (setup.cfg.eval) trainer.evaluate_choices_only();
  else if (setup.cfg.max_steps == 0) trainer.evaluate();
  else trainer.train();
}

// Everything after parsing; returns the exit code.
int dispatch_command(int argc, char** argv) {
  ParsedArgs args = parse_args(argc, argv);
  if (args.help) {
    std::printf("%s", help_text(argv[0]).c_str());
    return 0;
  }
  RunSetup setup;
  setup.cfg = args.config;
  start_up_stage = setup.cfg.generate ? "generating" : setup.cfg.eval || setup.cfg.max_steps == 0 ? "evaluating" : "training";
  if (setup.cfg.plan) return print_memory_plan(setup.cfg);

  int devices = 0;
  cudaError_t err = cudaGetDeviceCount(&devices);
  if (err != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "no CUDA device: %s; use train_gpt_cpu (make cpu) on machines without a GPU\n",
                 err != cudaSuccess ? cudaGetErrorString(err) : "no device found");
    return 1;
  }

  CommOptions comm_options;
  comm_options.rendezvous = setup.cfg.rendezvous;
  comm_options.timeout_seconds = setup.cfg.comm_timeout;
  const LaunchInfo launch = with_context("data-parallel start-up", [] { return detect_launch(); });
  if (launch.world_size > 1) error_prefix = "rank " + std::to_string(launch.rank) + ": ";
  const std::unique_ptr<Communicator> comm =
      with_context("data-parallel start-up", [&] { return std::make_unique<Communicator>(comm_options); });
  // The log is rank 0's; the other ranks' standard output is discarded (errors go to stderr).
  if (comm->rank() != 0 && std::freopen("/dev/null", "w", stdout) == nullptr)
    throw std::runtime_error("cannot redirect the standard output of rank " + std::to_string(comm->rank()));
  setup.grad_accum_steps = validate_config(setup.cfg, comm->world_size());
  setup.schedule = make_lr_schedule(setup.cfg);

  setup.resume_from = resolve_resume(setup.cfg, *comm, &setup.out_dir_plan);
  setup.model = resolve_model(setup.cfg, setup.resume_from, &setup.model_source);
  if (setup.cfg.generate || setup.cfg.sample_every > 0)
    setup.sampler = std::make_unique<TextSampler>(setup.cfg, setup.model, setup.model_source);
  if (setup.cfg.generate) {
    generate(setup);
    return 0;
  }
  if (setup.cfg.eval)
    setup.eval_losses = open_eval_losses(
        setup.cfg, setup.resume_from ? setup.resume_from->path + "/" + kModelFileName : setup.cfg.init_from,
        comm->rank() == 0);
  validate_against_model(setup.cfg, setup.model.max_seq_len, setup.model_source);
  validate_fp8_shapes(setup.cfg, setup.model, setup.model_source);
  validate_experts(setup.cfg, setup.model, setup.model_source);
  if (setup.cfg.fp8) require_fp8_device();
  if (!setup.cfg.export_hf.empty()) with_context("--export-hf", [&] { check_hf_export(setup.model, setup.cfg.export_hf); });
  with_context("model " + setup.model_source,
               [&] { choose_attention(setup.cfg.attention, dtype_named(setup.cfg.dtype), setup.model); });
  with_context(model_sizing(setup), [&] {
    check_micro_batch(setup.model, setup.cfg.batch_size, setup.cfg.seq_len, setup.cfg.recompute);
    check_tensor_split(setup.model, setup.cfg.tp, "--tp");
    check_pipeline_split(setup.model, setup.cfg);
  });
  check_memory_fits(setup, comm->world_size());
  ParallelGroups groups(*comm, setup.cfg.tp, setup.cfg.pp, setup.cfg.cp, setup.cfg.ep);
  if (setup.cfg.dtype == "fp32") train_or_evaluate<float>(setup, groups);
  else train_or_evaluate<bf16>(setup, groups);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  install_stop_handlers();  // first: a signal during start-up stops the command cleanly (exit 0)
  try {
    return dispatch_command(argc, argv);
  } catch (const StopDuringStartUp& stop) {
    std::printf("%s\n", stop.what());
    return 0;
  } catch (const std::exception& e) {
    if (in_start_up() && pending_stop_signal() != 0) {
      // The signal interrupted a start-up read (a named pipe, a stalled file system): the stop it
      // asked for, not an error. Peers that wait in a collective for this rank are ended with it.
      std::printf("%s\n", StopDuringStartUp(pending_stop_signal(), start_up_stage).what());
      std::fflush(stdout);
      int initialized = 0, finalized = 0, world = 1;
      MPI_Initialized(&initialized);
      MPI_Finalized(&finalized);
      if (initialized && !finalized) MPI_Comm_size(MPI_COMM_WORLD, &world);
      if (world > 1) MPI_Abort(MPI_COMM_WORLD, 0);
      return 0;
    }
    std::fflush(stdout);
    std::fprintf(stderr, "%serror: %s\n", error_prefix.c_str(), e.what());
    // The rank that failed ends the job with its own message: give it the time to (an abort from
    // here could end it before it has printed why).
    if (dynamic_cast<const FailedOnAnotherRank*>(&e) != nullptr) std::this_thread::sleep_for(std::chrono::seconds(30));
    // Peers may be blocked in a collective with this rank: end the whole MPI job now.
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
}
