// config_checks.cpp — checks across flags and against the model; the learning-rate schedule the flags describe
#include "src/config/config_checks.h"

#include "src/config/config.h"
#include "src/config/lr_schedule.h"
#include "src/config/model_config.h"

#include <climits>
#include <stdexcept>
#include <string>
#include <utility>

int validate_config(TrainConfig& cfg, int world_size) {
  if (cfg.was_set("init-from") && !cfg.init_from.empty() && cfg.was_set("model"))
    throw std::invalid_argument("--init-from and --model are mutually exclusive: the model file's header defines the "
                                "architecture (drop --model)");
  if (cfg.max_seq_len > 0 && (!cfg.init_from.empty() || !cfg.resume.empty()))
    throw std::invalid_argument(std::string("--max-seq-len sizes a fresh --model preset; ") +
                                (cfg.resume.empty() ? "--init-from" : "--resume") +
                                "'s model file fixes its own maximum sequence length (drop --max-seq-len)");
  for (const char* flag : {"moe-experts", "moe-top-k", "moe-router"})
    if (cfg.was_set(flag) && (!cfg.init_from.empty() || !cfg.resume.empty()))
      throw std::invalid_argument("--" + std::string(flag) + " shapes a fresh --model preset; " +
                                  (cfg.resume.empty() ? "--init-from" : "--resume") +
                                  "'s model fixes its own experts (drop --" + flag + ")");
  if (cfg.eval_data.empty() && (cfg.eval || cfg.eval_every > 0))
    throw std::invalid_argument(std::string(cfg.eval ? "--eval" : "--eval-every") +
                                " needs --eval-data FILE (an eval file: data/hellaswag.sh writes HellaSwag's)");
  if (cfg.world_size > 0 && !cfg.plan)
    throw std::invalid_argument("--world-size is for --plan only (a run's world size is its launcher's)");
  if (cfg.generate && cfg.init_from.empty() && cfg.resume.empty())
    throw std::invalid_argument("--generate needs a trained model: --init-from FILE or --resume DIR|auto");
  if (!cfg.export_hf.empty() && (cfg.eval || cfg.generate || cfg.max_steps == 0))
    throw std::invalid_argument(std::string("--export-hf is written at the end of a training run; ") +
                                (cfg.eval ? "--eval" : cfg.generate ? "--generate" : "--max-steps 0") + " trains none");
  if (cfg.generate && (cfg.eval || cfg.plan))
    throw std::invalid_argument(std::string("--generate and ") + (cfg.eval ? "--eval" : "--plan") +
                                " are different runs: give one of them");
  if (cfg.profile > 0) {
    if (cfg.was_set("max-steps"))
      throw std::invalid_argument("--profile N trains N steps: drop --max-steps");
    // Its N steps in place of --max-steps would rewrite a history: the schedule, checkpoints, model.bin.
    if (!cfg.resume.empty())
      throw std::invalid_argument("--profile N trains N steps in place of --max-steps, which would change the history "
                                  "--resume continues (its schedule, checkpoints and model.bin): profile into a fresh "
                                  "--out-dir, with --init-from a checkpoint's model.bin");
    cfg.max_steps = cfg.profile;
  }
  if (!cfg.save) {
    for (const char* flag : {"checkpoint-every", "keep-checkpoints", "keep-every", "save-dtype", "export-hf"})
      if (cfg.was_set(flag))
        throw std::invalid_argument(std::string("--") + flag + " and --save 0 contradict each other: --save 0 writes "
                                    "no checkpoint and no model.bin");
  }
  if (!cfg.eval_losses.empty() && !cfg.eval)
    throw std::invalid_argument("--eval-losses is written by --eval runs only (add --eval)");
  const long long model_ranks = static_cast<long long>(cfg.tp) * cfg.pp;  // a model replica: stages x TP group
  if (cfg.pp == 1 && world_size % cfg.tp != 0)
    throw std::invalid_argument("--tp " + std::to_string(cfg.tp) + " must divide the number of ranks, " +
                                std::to_string(world_size) + (cfg.plan ? " (--world-size)" : ""));
  if (world_size % model_ranks != 0)
    throw std::invalid_argument("--tp " + std::to_string(cfg.tp) + " x --pp " + std::to_string(cfg.pp) + " = " +
                                std::to_string(model_ranks) + " must divide the number of ranks, " +
                                std::to_string(world_size) + (cfg.plan ? " (--world-size)" : ""));
  if (cfg.cp > 1 && world_size % (model_ranks * cfg.cp) != 0)
    throw std::invalid_argument("--cp " + std::to_string(cfg.cp) + " x --tp " + std::to_string(cfg.tp) + " x --pp " +
                                std::to_string(cfg.pp) + " = " + std::to_string(model_ranks * cfg.cp) +
                                " must divide the number of ranks, " + std::to_string(world_size) +
                                (cfg.plan ? " (--world-size)" : ""));
  if (cfg.cp > 1 && cfg.seq_len % (2 * static_cast<long long>(cfg.cp)) != 0)
    throw std::invalid_argument("--seq-len " + std::to_string(cfg.seq_len) + " with --cp " + std::to_string(cfg.cp) +
                                ": the sequence is cut into 2 x " + std::to_string(cfg.cp) +
                                " equal chunks, so 2 x --cp must divide it");
  if (cfg.pp_virtual > 1 && cfg.pp_schedule != "interleaved")
    throw std::invalid_argument("--pp-virtual " + std::to_string(cfg.pp_virtual) +
                                " chunks per rank need --pp-schedule interleaved (not " + cfg.pp_schedule + ")");
  if (cfg.pp > 1 && cfg.zero >= 2)
    throw std::invalid_argument("--zero " + std::to_string(cfg.zero) + " with --pp " + std::to_string(cfg.pp) +
                                ": the pipeline accumulates every micro-batch's weight gradients until the schedule's "
                                "last backward; use --zero 0 or 1");
  if (!cfg.pp_timeline.empty() && (!cfg.plan || cfg.pp == 1))
    throw std::invalid_argument("--pp-timeline " + cfg.pp_timeline + ": writes a pipeline's timeline with --plan and "
                                "--pp > 1 (a run writes nothing of the kind)");
  if (!cfg.pp_recompute.empty() && cfg.pp == 1)
    throw std::invalid_argument("--pp-recompute sets --recompute per pipeline stage: without --pp, give --recompute");
  if (!cfg.pp_recompute.empty() && static_cast<int>(cfg.pp_recompute.size()) != cfg.pp)
    throw std::invalid_argument("--pp-recompute: " + std::to_string(cfg.pp_recompute.size()) + " value(s) for --pp " +
                                std::to_string(cfg.pp) + " (one per pipeline rank)");
  // zb-h1's weight backward reads the products' inputs late: it keeps every activation (the default
  // --recompute becomes 0; another one given is refused).
  if (cfg.pp > 1 && cfg.pp_schedule == "zb-h1" && !cfg.was_set("recompute")) cfg.recompute = 0;
  for (int s = 0; s < cfg.pp; ++s)
    if (cfg.pp > 1 && cfg.pp_schedule == "zb-h1" && stage_recompute(cfg, s) != 0)
      throw std::invalid_argument("--pp-schedule zb-h1 with --recompute " + std::to_string(stage_recompute(cfg, s)) +
                                  (cfg.pp_recompute.empty() ? "" : " (--pp-recompute, stage " + std::to_string(s) + ")") +
                                  ": its weight backward reads each product's input after the input backward moved on; "
                                  "use --recompute 0");
  if (cfg.fp8 && cfg.dtype == "fp32")
    throw std::invalid_argument("--fp8 with --dtype fp32: the FP8 products take bf16 activations; use --dtype bf16");
  if (cfg.fp8 && cfg.zero == 3)
    throw std::invalid_argument("--fp8 with --zero 3: the weights' FP8 copies are made from whole parameters once a "
                                "step, which ZeRO 3 never holds; use --zero 2 or less");
  if (cfg.fp8 && cfg.pp > 1 && cfg.pp_schedule == "zb-h1")
    throw std::invalid_argument("--fp8 with --pp-schedule zb-h1: its deferred weight gradients would need the FP8 "
                                "casts kept until the weight backward; use another --pp-schedule");
  // A model replica (a TP group per stage) reads one micro-batch, the CP group's replicas share one (each its part of
  // every sequence): the data-parallel ranks read different ones.
  const int data_ranks = static_cast<int>(world_size / (model_ranks * cfg.cp));
  if (data_ranks % cfg.ep != 0)
    throw std::invalid_argument("--ep " + std::to_string(cfg.ep) + ": the EP group's ranks are data-parallel ranks, so "
                                "it must divide their number, " + std::to_string(data_ranks) +
                                (cfg.plan ? " (--world-size)" : ""));
  const long long micro_tokens = static_cast<long long>(cfg.batch_size) * cfg.seq_len * data_ranks;
  if (cfg.total_batch_tokens == 0) cfg.total_batch_tokens = micro_tokens;
  if (cfg.total_batch_tokens % micro_tokens != 0)
    throw std::invalid_argument("--total-batch-tokens " + std::to_string(cfg.total_batch_tokens) +
                                " is not a multiple of batch-size x seq-len x data-parallel ranks = " +
                                std::to_string(cfg.batch_size) + " x " + std::to_string(cfg.seq_len) + " x " +
                                std::to_string(data_ranks) + " = " + std::to_string(micro_tokens));
  const long long accum = cfg.total_batch_tokens / micro_tokens;
  if (accum > INT_MAX) throw std::invalid_argument("--total-batch-tokens " + std::to_string(cfg.total_batch_tokens) +
                                                   ": too many accumulation steps");
  // The pipeline's micro-batches are the step's accumulation steps: every schedule needs one per stage.
  if (accum < cfg.pp)
    throw std::invalid_argument("--pp " + std::to_string(cfg.pp) + " needs at least " + std::to_string(cfg.pp) +
                                " micro-batches per optimizer step (m >= --pp), got m = --total-batch-tokens " +
                                std::to_string(cfg.total_batch_tokens) + " / (--batch-size x --seq-len x " +
                                "data-parallel ranks = " + std::to_string(cfg.batch_size) + " x " +
                                std::to_string(cfg.seq_len) + " x " + std::to_string(data_ranks) + ") = " +
                                std::to_string(accum));
  return static_cast<int>(accum);
}

void validate_against_model(const TrainConfig& cfg, int max_seq_len, const std::string& model_source) {
  if (cfg.seq_len > max_seq_len)
    throw std::invalid_argument("--seq-len " + std::to_string(cfg.seq_len) + " exceeds the maximum sequence length " +
                                std::to_string(max_seq_len) + " of " + model_source);
}

void validate_fp8_shapes(const TrainConfig& cfg, const ModelConfig& model, const std::string& model_source) {
  if (!cfg.fp8) return;
  const int tp = cfg.tp;
  const std::pair<const char*, long long> widths[] = {
      {"the width C", model.channels},
      {"the qkv width per --tp rank", model.qkv_channels() / tp},
      {"the attention width per --tp rank", model.channels / tp},
      {"the MLP hidden width per --tp rank", model.hidden() / tp},
      {"the rows per rank B*T/--cp", static_cast<long long>(cfg.batch_size) * cfg.seq_len / cfg.cp}};
  for (const auto& [what, n] : widths)
    if (n % 16 != 0)
      throw std::invalid_argument("--fp8: " + std::string(what) + " of " + model_source + " is " + std::to_string(n) +
                                  ", not a multiple of 16 (cuBLASLt's FP8 products need one)");
}

void validate_experts(const TrainConfig& cfg, const ModelConfig& model, const std::string& model_source) {
  if (!model.moe()) {
    for (const char* flag : {"moe-aux-loss-coef", "moe-bias-rate", "moe-balanced-routing", "ep"})
      if (cfg.was_set(flag) && (std::string(flag) != "ep" || cfg.ep > 1))
        throw std::invalid_argument("--" + std::string(flag) + ": " + model_source + " has no experts (" +
                                    describe(model) + ")");
    return;
  }
  // The auxiliary loss is the softmax router's; the bias the sigmoid router's (docs/MOE.md).
  if (model.router == Router::sigmoid && model.aux_loss_coef > 0.0f)
    throw std::invalid_argument(
        (cfg.was_set("moe-aux-loss-coef") ? std::string("--moe-aux-loss-coef") : model_source) +
        ": the sigmoid router balances with its expert bias and takes no load-balancing loss (expected 0)");
  if (model.router == Router::softmax && cfg.was_set("moe-bias-rate"))
    throw std::invalid_argument("--moe-bias-rate: " + model_source +
                                " routes by softmax, which has no balancing bias (--moe-router sigmoid has)");
  if (cfg.fp8)
    throw std::invalid_argument("--fp8 with experts (" + model_source + ") is not supported yet (docs/MOE.md)");
  // Under --tp each rank runs the whole experts on its own rows of the sequence-parallel region.
  if (cfg.tp > 1 && !cfg.sequence_parallel)
    throw std::invalid_argument("--sequence-parallel 0 with --tp " + std::to_string(cfg.tp) + " and experts (" +
                                model_source + "): each TP rank routes its own rows, which needs sequence "
                                "parallelism (docs/MOE.md)");
  if (model.num_experts % cfg.ep != 0)
    throw std::invalid_argument("--ep " + std::to_string(cfg.ep) + ": each rank holds whole experts, so it must "
                                "divide the experts E = " + std::to_string(model.num_experts) + " (" + model_source + ")");
}

LrSchedule make_lr_schedule(const TrainConfig& cfg) {
  LrSchedule s;
  s.kind = parse_lr_schedule(cfg.lr_schedule);
  s.peak_lr = cfg.lr;
  s.warmup_steps = cfg.warmup_steps;
  s.total_steps = cfg.max_steps;
  s.final_lr_frac = cfg.final_lr_frac;
  return s;
}
