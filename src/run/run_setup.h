// run_setup.h — what a command resolves before it trains, evaluates or generates (RunSetup: the
// flags, the model's architecture and where it comes from, the schedule, --resume's checkpoint,
// the text sampler), and the data it reads (TrainingData), opened before the model is allocated.
#pragma once
#include "src/base/durable_file.h"
#include "src/base/error_context.h"
#include "src/base/same_file.h"
#include "src/base/units.h"
#include "src/ckpt/checkpoint_dirs.h"
#include "src/ckpt/out_dir_history.h"
#include "src/config/config.h"
#include "src/config/lr_schedule.h"
#include "src/data/dataloader.h"
#include "src/data/hellaswag.h"
#include "src/gen/sample_text.h"
#include "src/model/model_source.h"

#include <algorithm>
#include <cstdio>
#include <cstdint>
#include <memory>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

struct RunSetup {
  TrainConfig cfg;
  int grad_accum_steps = 1;
  ModelConfig model;
  std::string model_source;  // "preset d12" or the --init-from path
  LrSchedule schedule;
  std::optional<Checkpoint> resume_from;  // --resume's checkpoint
  OutDirPlan out_dir_plan;                // rank 0 of a run that trains: what happens to --out-dir's files
  std::unique_ptr<TextSampler> sampler;   // --generate, --sample-every
  std::unique_ptr<AtomicFileWriter> eval_losses;  // rank 0 of --eval with --eval-losses, open from start-up
};

// The preset `model` with --moe-experts, --moe-top-k and --moe-router applied (checked: one line naming
// the flag); *source says so.
inline ModelConfig preset_experts(const TrainConfig& cfg, ModelConfig model, std::string* source) {
  if (!cfg.was_set("moe-experts") && !cfg.was_set("moe-top-k") && !cfg.was_set("moe-router")) return model;
  if (!model.is_llama())
    throw std::invalid_argument("--moe-experts/--moe-top-k/--moe-router: experts replace a Llama 3 MLP; preset " +
                                cfg.model + " is GPT-2's architecture");
  const int E = cfg.moe_experts > 0 ? cfg.moe_experts : model.num_experts;
  const int K = cfg.moe_top_k > 0 ? cfg.moe_top_k : model.experts_per_token;
  if (E == 0) throw std::invalid_argument("--moe-top-k/--moe-router: preset " + cfg.model + " has no experts: give --moe-experts E");
  if (K < 1 || K > E)
    throw std::invalid_argument("--moe-top-k " + std::to_string(K) + ": expected 1..E = " + std::to_string(E) +
                                (cfg.moe_top_k == 0 ? " (give --moe-top-k)" : ""));
  const Router router = cfg.moe_router.empty() ? model.router : cfg.moe_router == "sigmoid" ? Router::sigmoid : Router::softmax;
  *source += " with " + std::to_string(E) + " experts, top-" + std::to_string(K) + ", " + router_name(router) + " router";
  // The sigmoid router balances with its bias and has no auxiliary loss (docs/MOE.md).
  const float aux = router == Router::sigmoid ? 0.0f : model.moe() ? model.aux_loss_coef : 0.01f;
  return with_experts(model, E, K, router, aux);
}

// The architecture: --resume's model file, --init-from's header or config.json, or the --model preset; *source
// names which.
inline ModelConfig resolve_model(const TrainConfig& cfg, const std::optional<Checkpoint>& resume_from,
                                std::string* source) {
  ModelConfig model;
  if (resume_from) {
    *source = resume_from->path + "/" + kModelFileName;
    model = with_context("--resume", [&] { return read_model_header(*source); });
  } else if (!cfg.init_from.empty()) {
    *source = cfg.init_from;
    model = with_context("--init-from", [&] { return model_source_config(cfg.init_from); });
  } else {
    *source = "preset " + cfg.model + (cfg.max_seq_len > 0 ? " with --max-seq-len " + std::to_string(cfg.max_seq_len) : "");
    model = with_context("--model", [&] { return model_preset(cfg.model); });
    if (cfg.max_seq_len > 0) model.max_seq_len = cfg.max_seq_len;
    model = preset_experts(cfg, model, source);
  }
  if (model.moe() && cfg.was_set("moe-aux-loss-coef")) model.aux_loss_coef = static_cast<float>(cfg.moe_aux_loss_coef);
  return model;
}

// "--batch-size 8 --seq-len 1024 --recompute 1 (d12 from preset d12)": what sizes the model's memory.
inline std::string model_sizing(const RunSetup& setup) {
  return "--batch-size " + std::to_string(setup.cfg.batch_size) + " --seq-len " + std::to_string(setup.cfg.seq_len) +
         " --recompute " + std::to_string(setup.cfg.recompute) + " (" + describe(setup.model) + " from " +
         setup.model_source + ")";
}

// The host buffer of one micro-batch's B·T tokens; running out of memory names the bytes and the
// flags that sized them.
inline std::vector<int> token_buffer(const TrainConfig& cfg) {
  const size_t count = static_cast<size_t>(cfg.batch_size) * static_cast<size_t>(cfg.seq_len);
  try {
    return std::vector<int>(count);
  } catch (const std::bad_alloc&) {
    throw std::runtime_error("--batch-size " + std::to_string(cfg.batch_size) + " x --seq-len " +
                             std::to_string(cfg.seq_len) + ": cannot allocate " + thousands(count * sizeof(int)) +
                             " bytes of host memory for a micro-batch's tokens");
  }
}

// The data a run reads: the training loader, with --val-every > 0 the validation loader, and with
// --eval-every > 0 or --eval the eval file.
struct TrainingData {
  std::unique_ptr<DataLoader> train, val;
  std::optional<ChoiceEvalSet> eval;
};

// Data before the model: a missing or corrupt shard fails before gigabytes are allocated. Token ids
// are checked a shard at a time as the loader first reads from it, so the first training batch
// (the training loader is then rewound) and every validation batch a validation reads are read now:
// data tokenized for another vocabulary fails before anything is written. Evaluation only
// (--max-steps 0) reads no training data, --eval only the eval file.
inline TrainingData open_training_data(const RunSetup& setup, int rank, int world_size, std::vector<int>& inputs,
                                       std::vector<int>& targets) {
  const TrainConfig& cfg = setup.cfg;
  const uint64_t seed = static_cast<uint64_t>(cfg.seed);
  const bool eval_only = cfg.max_steps == 0;
  TrainingData data;
  if (cfg.eval || cfg.eval_every > 0)
    data.eval = with_context("--eval-data", [&] {
      return read_choice_eval_file(cfg.eval_data, setup.model.vocab_size, cfg.seq_len);
    });
  if (cfg.eval) return data;
  if (!eval_only)
    with_context("--train-data", [&] {
      data.train = std::make_unique<DataLoader>(cfg.train_data, cfg.batch_size, cfg.seq_len, rank, world_size,
                                                cfg.shuffle, seed, setup.model.vocab_size);
      check_shard_vocabulary(data.train->files()[0], data.train->token_kind(), setup.model.vocab_size);
      data.train->next_batch(inputs.data(), targets.data());
      data.train->reset();
    });
  if (cfg.val_every > 0 || eval_only) {
    try {
      data.val = std::make_unique<DataLoader>(cfg.val_data, cfg.batch_size, cfg.seq_len, rank, world_size, false, seed,
                                              setup.model.vocab_size);
    } catch (const std::exception& e) {
      throw std::runtime_error(std::string("--val-data: ") + e.what() +
                               (eval_only ? "" : " (--val-every 0 trains without validation)"));
    }
    with_context("--val-data", [&] {
      check_shard_vocabulary(data.val->files()[0], data.val->token_kind(), setup.model.vocab_size);
      const uint64_t read = std::min<uint64_t>(static_cast<uint64_t>(cfg.val_steps), data.val->batches_per_epoch());
      for (uint64_t b = 0; b < read; ++b) data.val->next_batch(inputs.data(), targets.data());
      data.val->reset();
    });
  }
  return data;
}

// A validation loss measured on shards the run also trains on says little about generalization:
// a warning when --train-data's files include any of --val-data's (by device and inode).
inline void warn_if_validation_is_trained_on(const DataLoader& train, const DataLoader& val) {
  size_t shared = 0;
  std::string first;
  for (const std::string& v : val.files())
    for (const std::string& t : train.files())
      if (same_file(v, t)) {
        if (shared++ == 0) first = v;
        break;
      }
  if (shared > 0)
    std::fprintf(stderr, "warning: --train-data includes %zu of the %zu --val-data shard(s) (%s): the validation loss is "
                 "measured on text the model trains on\n", shared, val.files().size(), first.c_str());
}
