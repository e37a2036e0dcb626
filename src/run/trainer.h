// trainer.h — one command's work on the model: training (the loop of steps, each followed by its
// log line, validation, evaluation, sample and checkpoint when due), or evaluation alone (--max-steps
// 0, --eval). Set-up order: data, model, --out-dir.
#pragma once
#include "src/base/error_context.h"
#include "src/base/units.h"
#include "src/ckpt/checkpoint_load.h"
#include "src/ckpt/checkpoint_write.h"
#include "src/ckpt/resume.h"
#include "src/config/config_warnings.h"
#include "src/dist/comm.h"
#include "src/dist/parallel_groups.h"
#include "src/gen/generate.h"
#include "src/model/pipeline_step.h"
#include "src/model/transformer.h"
#include "src/model/step_guards.h"
#include "src/run/eval_report.h"
#include "src/run/metrics.h"
#include "src/run/out_dir.h"
#include "src/run/pipeline_setup.h"
#include "src/run/plan_report.h"
#include "src/run/profile_report.h"
#include "src/run/run_setup.h"
#include "src/run/startup_report.h"
#include "src/run/step_traffic.h"
#include "src/run/stop_signals.h"
#include "src/run/test_hooks.h"
#include "src/run/throughput.h"

#include <chrono>
#include <csignal>
#include <cstdio>
#include <memory>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

// The model, allocated; a failure names the flags that size it and, out of host memory, the bytes
// of its activations (a device allocation's error names its own).
template <typename Elem>
Transformer<Elem> allocate_model(const RunSetup& setup, ParallelGroups& groups) {
  const TrainConfig& cfg = setup.cfg;
  const int recompute = stage_recompute(cfg, groups.pp_rank());
  const size_t logits_rows = run_logits_rows(cfg, setup.model, cfg.batch_size, groups.world().world_size(),
                                             sampling_positions(cfg, setup.model, setup.sampler.get()),
                                             setup.grad_accum_steps);
  return with_context(model_sizing(setup), [&] {
    try {
      return Transformer<Elem>(setup.model, cfg.batch_size, cfg.seq_len, recompute, &groups.expert_dp(), cfg.zero,
                        cfg.attention, cfg.bucket_mib, logits_rows, cfg.zero3_prefetch, groups.tp(),
                        cfg.sequence_parallel, run_pipeline_parts(cfg, setup.model, setup.grad_accum_steps, groups),
                        groups.cp(), fp8_settings(cfg), groups.ep());
    } catch (const std::bad_alloc&) {
      throw std::runtime_error(
          "out of host memory allocating the model (its activations alone take " +
          thousands(model_activation_bytes(setup.model, cfg.batch_size, cfg.seq_len / cfg.cp, recompute, Transformer<Elem>::dtype,
                                          logits_rows, run_tensor_parallelism(cfg))
                        .total()) +
          " bytes)");
    }
  });
}

// One run's training: set-up (data, model, output directory), then the loop of steps, each
// followed by its log line, validation and checkpoint when due.
template <typename Elem>
class Trainer {
 public:
  Trainer(const RunSetup& setup, ParallelGroups& groups)
      : setup_(setup), cfg_(setup.cfg),
        groups_(groups),
        comm_(groups.world()),
        lead_(comm_.rank() == 0),
        eval_only_(cfg_.max_steps == 0),
        flops_per_token_(flops_per_token(setup.model, cfg_.seq_len)),
        throughput_(cfg_.max_steps),
        inputs_(token_buffer(cfg_)),
        targets_(token_buffer(cfg_)),
        data_(open_training_data(setup, groups.data_rank(), groups.data_ranks(), inputs_, targets_)),
        model_(allocate_model<Elem>(setup, groups)),
        runner_(model_, run_pipeline_shape(cfg_, setup.grad_accum_steps)),
        model_path_(cfg_.out_dir + "/model.bin"),
        save_dtype_(cfg_.save_dtype.empty() ? Transformer<Elem>::dtype
                                            : dtype_named(cfg_.save_dtype)) {
    // The next batch's host work (id checks, encoder buckets) on the loader thread, ahead of its step.
    if (data_.train) data_.train->set_prepare(model_.batch_preparer());
    if (cfg_.moe_balanced_routing) model_.set_expert_choice(MoeChoice::balanced);
    initialize_model();
    last_checkpoint_step_ = state_.step;
    if (setup_.resume_from) last_checkpoint_dir_ = setup_.resume_from->path;
    if (lead_)
      for (const std::string& w : config_warnings(cfg_, setup_.grad_accum_steps, data_.val ? data_.val->batches_per_epoch() : 0))
        std::fprintf(stderr, "warning: %s\n", w.c_str());
    if (lead_ && data_.train && data_.val) warn_if_validation_is_trained_on(*data_.train, *data_.val);
    print_startup_report(setup_, model_, data_, comm_, flops_per_token_, peak_);
    stop_if_signalled_during_start_up();
    if (lead_ && !eval_only_ && !cfg_.eval) prepare_out_dir();
    if (lead_ && !eval_only_ && !cfg_.eval && cfg_.sample_every > 0) {
      // At ZeRO 3 or with tensor or pipeline parallelism no rank holds every parameter: rank 0
      // gathers them for each sample.
      if (model_.params_device() == nullptr)
        sample_params_ = DeviceArray<Elem>(model_.num_parameters(), "parameters gathered for sampling");
      decoder_ = std::make_unique<KvCacheDecoder<Elem>>(
          model_.config(), sample_params_.get() != nullptr ? sample_params_.get() : model_.params_device(),
          setup_.sampler->cache_positions(), model_.attention(), model_.stream());
    }
    opt_ = optimizer_settings(cfg_, state_.seed);
  }

  // The loop of steps from the checkpoint's (or 0) to --max-steps, or to a stop signal.
  void train() {
    if (setup_.resume_from) {
      std::printf("resumed from %s: %lld step(s) done, %llu update(s) skipped so far\n", setup_.resume_from->path.c_str(),
                  state_.step, static_cast<unsigned long long>(state_.guards.skipped_total()));
      if (state_.step >= cfg_.max_steps) {
        std::printf("the checkpoint already reached --max-steps %lld: nothing to train\n", cfg_.max_steps);
        finish();
        return;
      }
    }
    const long long first_step = state_.step + 1;
    const uint64_t skipped_before = state_.guards.skipped_total();
    for (long long step = first_step; step <= cfg_.max_steps; ++step) {
      maybe_hang_for_test(comm_.rank(), step);
      maybe_signal_for_test(comm_.rank(), step);
      // --profile: every step but the first, which makes the cuBLASLt plans (unless it is the only one).
      const bool profiled = cfg_.profile > 0 && (step > first_step || step == cfg_.max_steps);
      if (profiled) DeviceProfiler::get().start();
      StepRecord record;
      try {
        record = traffic_.measure([&] { return train_step(step); });
      } catch (const ShardDataError& e) {
        stop_on_bad_shard("--train-data", e);
      }
      if (profiled) {
        DeviceProfiler::get().stop();
        profiled_ms_ += record.ms;
        ++profiled_steps_;
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
      if (samples() && step % cfg_.sample_every == 0) log_sample(step);
      const int stop_signal = agreed_stop_signal();
      if (cfg_.save &&
          (stop_signal != 0 || step == cfg_.max_steps || (cfg_.checkpoint_every > 0 && step % cfg_.checkpoint_every == 0)))
        save_checkpoint();
      if (stop_signal != 0) {
        if (cfg_.save) save_final_model();
        print_throughput();
        std::printf("received %s: stopped after step %lld of %lld, %s\n", signal_name(stop_signal), step,
                    cfg_.max_steps,
                    cfg_.save ? "checkpoint written; continue with --resume auto" : "nothing written (--save 0)");
        comm_.barrier();
        return;
      }
    }
    print_skipped_updates();
    print_throughput();
    if (cfg_.profile > 0) report_profile();
    // A model no update reached (a --lr beyond what training survives, broken data) is not a result.
    if (state_.guards.skipped_total() - skipped_before == static_cast<uint64_t>(cfg_.max_steps - first_step + 1))
      throw std::runtime_error("every update of this run's " + std::to_string(cfg_.max_steps - first_step + 1) +
                               " step(s) was skipped (see 'updates skipped'): the model did not train, so " +
                               model_path_ + " was not written (check --lr and the data)");
    finish();
  }

  // --profile: rank 0's record of the profiled steps, printed and written to DIR/profile.json.
  void report_profile() const {
    const double step_ms = profiled_ms_ / static_cast<double>(std::max(profiled_steps_, 1LL));
    nlohmann::json pipeline;  // a collective: before rank 0 alone goes on
    if (cfg_.pp > 1) {
      const PipelineShape shape = run_pipeline_shape(cfg_, setup_.grad_accum_steps);
      pipeline = pipeline_profile_json(
          comm_, cfg_.pp, groups_.pp_rank(), groups_.dp().rank() == 0 && (groups_.tp() == nullptr || groups_.tp()->rank() == 0),
          DeviceProfiler::get().sites(), profiled_steps_, step_ms,
          time_pipeline_schedule(shape, build_pipeline_schedule(shape)).bubble());
    }
    if (!lead_ || profiled_steps_ == 0) return;
    ProfilePlan plan;
    plan.grad_accum_steps = setup_.grad_accum_steps;
    plan.lm_head_chunks = model_.lm_head_chunks();
    plan.lm_head_chunk_rows = model_.logits_chunk_rows();
    plan.encoder_backward_launches = model_.encoder_backward_launches();
    nlohmann::json p = profile_json(DeviceProfiler::get().sites(), profiled_steps_, step_ms, plan, device_properties().name,
                                    peak_);
    if (!pipeline.is_null()) p["pipeline"] = pipeline;
    print_profile(p);
    write_profile(cfg_.out_dir + "/profile.json", p);
    std::printf("profile written to %s/profile.json\n", cfg_.out_dir.c_str());
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

  // --eval: the model as given scored on --eval-data; with --eval-losses, rank 0 writes each
  // example's completion losses (sum and mean per completion).
  void evaluate_choices_only() {
    const auto start = std::chrono::steady_clock::now();
    const std::vector<double> sums = eval_completion_losses();
    const ChoiceResult result = score_choices(*data_.eval, sums);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("%s | %s, %s (%.1f s); --eval: nothing else written\n", format_hellaswag(result).c_str(),
                cfg_.eval_data.c_str(), setup_.model_source.c_str(), seconds);
    std::fflush(stdout);
    if (setup_.eval_losses)
      with_context("--eval-losses", [&] { write_eval_losses(*setup_.eval_losses, *data_.eval, sums); });
    comm_.barrier();
  }

 private:
  // "after step 7": when the collectives outside a step run, for the watchdog's messages.
  std::string after_step() const { return "after step " + std::to_string(state_.step); }

  // --resume's checkpoint, --init-from's weights, or a seeded random init.
  void initialize_model() {
    state_.seed = static_cast<uint64_t>(cfg_.seed);
    state_.guards.loss_z_limit = cfg_.skip_loss_z;
    state_.guards.norm_z_limit = cfg_.skip_norm_z;
    if (setup_.resume_from && cfg_.eval) {
      with_context("--resume " + setup_.resume_from->path, [&] { model_.load(setup_.model_source); });
    } else if (setup_.resume_from) {
      with_context("--resume " + setup_.resume_from->path, [&] {
        load_checkpoint(*setup_.resume_from, model_, &state_);
        check_resumed_global_batch(state_.train_data.global_batch_tokens, groups_.data_ranks(), cfg_.batch_size,
                                   cfg_.seq_len);
        if (data_.train) data_.train->restore(state_.train_data);
      });
    } else if (!cfg_.init_from.empty()) {
      with_context("--init-from", [&] { model_.load(cfg_.init_from); });
    } else {
      model_.init_random(static_cast<uint64_t>(cfg_.seed));
    }
  }

  // A stop signal that came during start-up (main installs the handlers first; reading the data
  // and loading the model take the time) ends the command here, before anything is written, on
  // every rank alike: the ranks' votes are summed. A command that only evaluates then goes back to
  // the default actions (a signal ends it, as it would any program that writes nothing).
  void stop_if_signalled_during_start_up() {
    const bool trains = !eval_only_ && !cfg_.eval;
    if (!trains) restore_default_stop_handlers();
    groups_.set_purpose("the start-up's stop votes", after_step());
    const int signal = pending_stop_signal();
    const double votes = comm_.world_size() > 1 ? comm_.sum(signal != 0 ? 1.0 : 0.0) : (signal != 0 ? 1.0 : 0.0);
    if (votes > 0) throw StopDuringStartUp(signal != 0 ? signal : SIGTERM, trains ? "training" : "evaluating");
    if (trains) end_start_up(cfg_.save);
  }

  // Rank 0: --out-dir claimed for this run, with room for its checkpoints (src/run/out_dir.h).
  void prepare_out_dir() {
    const uint64_t checkpoint = checkpoint_bytes(model_.num_parameters(), sizeof(Elem),
                                                 model_.gradient_sync().state_count(), comm_.world_size());
    const uint64_t model_file = kHeaderBytes + model_.num_parameters() * (save_dtype_ == DType::fp32 ? 4 : 2);
    out_dir_ = open_out_dir(cfg_, state_.step, setup_.out_dir_plan, checkpoint, model_file);
  }

  // Step k (1-based): grad_accum micro-batches of forward+backward, then one AdamW update at lr(k)
  // unless a bad-step guard skips it.
  StepRecord train_step(long long step) {
    const auto start = std::chrono::steady_clock::now();
    const std::string at_step = "at step " + std::to_string(step);
    groups_.set_purpose("gradients", at_step);
    model_.zero_grad();
    // A ShardDataError from the loader goes to run().
    runner_.run_step(setup_.grad_accum_steps, [&](TokenBatch& batch) { data_.train->next_batch(batch); });
    // The step's one host synchronisation. The same loss, norm and stop votes on every rank, so
    // every rank takes the same skip and stop decisions; the update is queued behind it and runs
    // while the host reads the next batch.
    groups_.set_purpose("the loss, gradient norm and stop votes", at_step);
    const auto figures = traffic_.left_out([&] { return model_.step_figures(pending_stop_signal() != 0 ? 1.0 : 0.0); });
    stop_votes_ = static_cast<int>(figures.summed_with_loss);
    StepRecord record;
    record.train_loss = figures.loss;
    record.lr = setup_.schedule.at(step);
    record.grad_norm = figures.grad_norm;
    if (model_.config().moe())
      record.experts = expert_figures(traffic_.left_out([&] {
        return pooled_expert_stats(model_.expert_stats(), {&groups_.expert_dp(), groups_.ep(), groups_.tp()});
      }));
    record.skipped = state_.guards.check(record.train_loss, figures.grad_norm);
    groups_.set_purpose("updated parameters", at_step);
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
    if (lead_) out_dir_.metrics->train_step(record);
  }

  // The mean loss over the first val_steps batches of --val-data, on the current weights.
  double validation_loss() {
    groups_.set_purpose("the validation loss", after_step());
    data_.val->reset();
    double val_sum = 0.0;
    for (long long v = 0; v < cfg_.val_steps; ++v) {
      data_.val->next_batch(inputs_.data(), targets_.data());  // a ShardDataError goes to run()
      val_sum += runner_.mean_loss(inputs_.data(), targets_.data());
    }
    return comm_.sum(val_sum / static_cast<double>(cfg_.val_steps)) / comm_.world_size();
  }

  // Validation after `step`: its log line and record.
  void validate(long long step) {
    const double val_loss = validation_loss();
    std::printf("%s\n", format_val_line(step, cfg_.max_steps, val_loss).c_str());
    std::fflush(stdout);
    if (lead_) out_dir_.metrics->validation(step, val_loss);
  }

  // A run that trains with --sample-every (rank 0 samples; at ZeRO 3 every rank takes part).
  bool samples() const { return !eval_only_ && !cfg_.eval && cfg_.sample_every > 0; }

  // Rank 0's sample after `step` (--sample-every): --prompt continued by the current weights, with
  // draws seeded by --seed and the step (a resumed run draws the same ones); its log line and record.
  // At ZeRO 3 or with tensor or pipeline parallelism every rank calls it: the parameters are
  // gathered into rank 0's sample_params_ first.
  void log_sample(long long step) {
    if (model_.params_device() == nullptr) {
      groups_.set_purpose("the sample's parameters", after_step());
      model_.gather_parameters(sample_params_.get());
    }
    if (!decoder_) return;
    const TextSampler& sampler = *setup_.sampler;
    const std::vector<int> tokens = generate_tokens(*decoder_, sampler.prompt(), sampler.max_new_tokens(),
                                                    sampler.settings(static_cast<uint64_t>(step)));
    const std::string text = cfg_.prompt + sampler.decode(tokens);
    std::printf("%s\n", format_sample_line(step, cfg_.max_steps, text).c_str());
    std::fflush(stdout);
    out_dir_.metrics->sample(step, text);
  }

  // Every completion's summed loss over --eval-data (src/data/hellaswag.h), on the current weights; each
  // data-parallel rank scores its examples (a TP group and a CP group together), the sums are added over them.
  std::vector<double> eval_completion_losses() {
    groups_.set_purpose("the eval's completion losses", after_step());
    std::vector<double> sums = completion_loss_sums(
        *data_.eval, groups_.data_rank(), groups_.data_ranks(), cfg_.batch_size, cfg_.seq_len,
        [&](const int* inputs, const int* targets) { return runner_.position_losses(inputs, targets); });
    // One rank holds each value, the others 0 (a CP group's ranks hold the same sums: its first keeps them): the
    // sum over ranks is exact.
    if (groups_.cp() != nullptr && groups_.cp()->rank() != 0) std::fill(sums.begin(), sums.end(), 0.0);
    if (groups_.dp().world_size() > 1) groups_.dp().sum(sums);
    return sums;
  }

  // The HellaSwag evaluation after `step`: its log line and record.
  void evaluate_choices(long long step) {
    const ChoiceResult result = score_choices(*data_.eval, eval_completion_losses());
    std::printf("%s\n", format_hellaswag_line(step, cfg_.max_steps, result).c_str());
    std::fflush(stdout);
    if (lead_) out_dir_.metrics->hellaswag(step, result);
  }

  // The mean throughput after the warm-up (ThroughputMeter), one line; then what the communicators
  // did per step (StepTrafficMeter).
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
    std::printf("%s", traffic_.report().c_str());
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
    return pending_stop_signal() != 0 ? pending_stop_signal() : SIGTERM;
  }

  // Every rank writes its state file; rank 0 the model file and the manifest, then applies retention.
  void save_checkpoint() {
    groups_.set_purpose("the checkpoint", after_step());
    CheckpointWriteInfo info;
    info.rank = comm_.rank();
    info.world_size = comm_.world_size();
    info.zero_stage = model_.zero_stage();
    info.tensor_parallel = groups_.tp_size();
    info.pipeline_parallel = groups_.pp_size();
    info.expert_parallel = groups_.ep_size();
    info.pipeline_chunks = pipeline_chunk_layers(model_.pipeline());
    info.config = config_json(cfg_);
    const std::string dir = write_checkpoint(cfg_.out_dir, model_, state_, info, &comm_);
    last_checkpoint_step_ = state_.step;
    last_checkpoint_dir_ = dir;
    std::printf("checkpoint %s\n", dir.c_str());
    std::vector<std::string> failed;
    if (lead_)
      for (const std::string& old : prune_checkpoints(cfg_.out_dir, state_.step, cfg_.keep_checkpoints, cfg_.keep_every, &failed))
        std::printf("deleted old checkpoint %s\n", old.c_str());
    for (const std::string& f : failed) std::fprintf(stderr, "warning: --keep-checkpoints: an old checkpoint was not deleted: %s\n", f.c_str());
    std::fflush(stdout);
  }

  void print_skipped_updates() const {
    const BadStepGuards& g = state_.guards;
    if (g.skipped_total() == 0) return;
    std::printf("updates skipped: %llu (non-finite %llu, loss z-score %llu, gradient-norm z-score %llu)\n",
                static_cast<unsigned long long>(g.skipped_total()), static_cast<unsigned long long>(g.skipped_nonfinite),
                static_cast<unsigned long long>(g.skipped_loss_z), static_cast<unsigned long long>(g.skipped_norm_z));
  }

  // The final model file (rank 0) and --export-hf's directory, then a barrier: no rank tears down
  // its communicator while another still needs it.
  void finish() {
    groups_.set_purpose("the end of the run", after_step());
    if (cfg_.save) {
      save_final_model();
      if (lead_ && !cfg_.export_hf.empty())  // the Hugging Face directory from model.bin
        with_context("--export-hf " + cfg_.export_hf, [&] { export_hf_llama(model_path_, cfg_.export_hf); });
      std::printf("saved %s%s%s\n", model_path_.c_str(), cfg_.export_hf.empty() ? "" : " and ", cfg_.export_hf.c_str());
    }
    comm_.barrier();
  }

  // DIR/model.bin (rank 0; at ZeRO 3 every rank takes part), in --save-dtype.
  void save_final_model() const { model_.save(model_path_, save_dtype_, lead_); }

  const RunSetup& setup_;
  const TrainConfig& cfg_;
  ParallelGroups& groups_;
  Communicator& comm_;  // the world's
  const bool lead_;
  const bool eval_only_;  // --max-steps 0
  const double flops_per_token_;
  const std::optional<Peak> peak_ = device_peak(device_properties().name, cfg_.peak_tflops);  // none: unknown GPU
  ThroughputMeter throughput_;
  StepTrafficMeter traffic_{groups_, setup_.grad_accum_steps};  // the communicators' work per step
  long long profiled_steps_ = 0;  // --profile: steps recorded, and their wall time
  double profiled_ms_ = 0;
  std::vector<int> inputs_, targets_;  // validation's batches
  TrainingData data_;
  Transformer<Elem> model_;
  MicroBatchRunner<Elem> runner_;  // a step's micro-batches through the model (or the pipeline)
  const std::string model_path_;
  const DType save_dtype_;  // of model_path_
  TrainingState state_;
  long long last_checkpoint_step_ = 0;  // the newest checkpoint of this run's steps (step 0: none)
  std::string last_checkpoint_dir_;
  OptimizerSettings opt_;
  OpenOutDir out_dir_;  // rank 0 of a run that trains
  std::unique_ptr<KvCacheDecoder<Elem>> decoder_;  // rank 0 of a run with --sample-every
  DeviceArray<Elem> sample_params_;                // its parameters at ZeRO 3 or with TP or PP (else the model's own)
  int stop_votes_ = 0;  // ranks that had a stop signal at the last step's figures
  StepClock clock_;
};
